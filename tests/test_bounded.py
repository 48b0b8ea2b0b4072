"""Bounded bundles and a fresh start: unused artifacts dropped after N updating runs, ``prune
--max-size`` by least recent use, and ``--compile-cache-rebuild``; real compiles, real bundles."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from helpers import BuildBundle

from pytest_compilecache.bundle.format import Bundle, make_entry, read_manifest
from pytest_compilecache.bundle.writing import write_bundle

#: Real sessions against real servers and suites: left out of the fast tier (-m "not slow").
pytestmark = pytest.mark.slow

TESTS = '''
import torch

def test_kept():
    with torch.no_grad():
        torch.compile(lambda x: torch.sin(x) * 3, dynamic=False)(torch.randn(8))

def test_once():
    with torch.no_grad():
        torch.compile(lambda x: torch.cos(x) - 3, dynamic=False)(torch.randn(8))
'''


def codes(bundle: Path) -> dict[str, int]:
    """Per compiled function (by its line in test_b.py), how many keys the bundle's index holds."""
    with read_manifest(bundle) as b:
        b.read_all()
        out: dict[str, int] = {}
        for entry in b.entries:
            index, _ = b.key_index(entry)
            for record in (index.keys.values() if index else []):
                out[record["code"]] = out.get(record["code"], 0) + 1
    return out


def inductor_count(bundle: Path) -> int:
    with read_manifest(bundle) as b:
        return sum(e.artifacts.get("inductor", {}).get("count", 0) for e in b.entries)


@pytest.fixture(scope="module")
def built(build_bundle: BuildBundle) -> Path:
    """A bundle built by one real run of both tests (copied by each test that needs one)."""
    return build_bundle({"test_b.py": TESTS})


@pytest.fixture
def project(pytester: pytest.Pytester, built: Path) -> pytest.Pytester:
    pytester.makepyfile(test_b=TESTS)
    shutil.copy(built, pytester.path / "b.bundle")
    return pytester


def keys(bundle: Path) -> list[str]:
    """The artifact keys the bundle's (one) entry's index records."""
    with read_manifest(bundle) as b:
        b.read_all()
        index, _ = b.key_index(b.entries[0])
    assert index is not None
    return list(index.keys)


def runs_recorded(bundle: Path) -> int:
    """How many runs of the whole suite the bundle's (one) entry counts (its building run among them)."""
    with read_manifest(bundle) as b:
        b.read_all()
        index, _ = b.key_index(b.entries[0])
    assert index is not None
    return len(index.whole_runs)


WARMUP = """
import torch

def g(x):
    return torch.exp(x) + 1

def pytest_compilecache_warmup(cache):
    with torch.no_grad():
        torch.compile(g, dynamic=False)(torch.randn(8))
"""

STOPS = """
import os
import torch

def test_stop():
    with torch.no_grad():
        torch.compile(lambda x: torch.sin(x) * 3, dynamic=False)(torch.randn(8))
    assert not os.path.exists("stop.flag")
"""


def test_an_edited_tests_old_artifacts_are_dropped_by_runs_of_the_whole_suite_only(
        project: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], kernels_name_their_folder: bool) -> None:
    """An updating run that ran part of the suite (-k, a named test, -x, --lf) records what it used but does not
    count toward compile_cache_max_unused_runs, whether or not its warmup wrote PATH first, so it never drops what
    the tests it left out use; a run of the whole suite after an edit drops the edited function's old artifacts and
    the C++ kernel no run asked for since."""
    bundle = project.path / "b.bundle"
    ini = "compile_cache_max_unused_runs = 1"
    args = (f"--compile-cache-bundle={bundle}", "--compile-cache-report=r.json")
    assert inductor_count(bundle) == 2 and runs_recorded(bundle) == 1
    assert set(codes(bundle)) == {"<lambda> (test_b.py)"} and codes(bundle)["<lambda> (test_b.py)"] == 4
    built_keys = set(keys(bundle))

    before = bundle.read_bytes()
    run_inner(*args, "-k", "kept", ini=ini).assert_outcomes(passed=1, deselected=1)
    assert bundle.read_bytes() == before, "a run that does not update PATH never rewrites it"

    project.makeconftest(WARMUP)  # its warmup writes PATH at the start of each updating run
    deselected = "it deselected 1 test (-k, -m, --deselect or --sw)"
    for part, why in ((("-k", "kept"), deselected), (("-n", "2", "-k", "kept"), deselected),
                      (("test_b.py::test_kept",), "it named tests or files (test_b.py::test_kept)")):
        update = run_inner(*args, "--compile-cache-update", *part, ini=ini)
        assert update.parseoutcomes()["passed"] == 1, update.stdout.str()
        update.stdout.fnmatch_lines([f"*not counted toward compile_cache_max_unused_runs: {why}*"])
        assert "dropped as unused" not in update.stdout.str()
        assert json.loads((project.path / "r.json").read_text())["bundle"]["saved"]["not_counted"] == why
        assert inductor_count(bundle) == 3 and runs_recorded(bundle) == 1, part  # the warmup's g added

    project.makepyfile(test_b=TESTS.replace("torch.cos(x) - 3", "torch.tan(x) - 3"), test_c=STOPS)
    (project.path / "stop.flag").touch()
    stopped = run_inner(*args, "--compile-cache-update", "-x", ini=ini)
    stopped.assert_outcomes(passed=2, failed=1)
    stopped.stdout.fnmatch_lines(["*not counted toward compile_cache_max_unused_runs: it stopped early*"])
    assert inductor_count(bundle) == 4 and runs_recorded(bundle) == 1, "the edit added; nothing counted"
    kernels = json.loads((project.path / "r.json").read_text())["bundle"]["saved"]["artifacts"].get("cpp", {})

    (project.path / "stop.flag").unlink()
    last_failed = run_inner(*args, "--compile-cache-update", "--lf", ini=ini)
    last_failed.assert_outcomes(passed=1)
    last_failed.stdout.fnmatch_lines(["*not counted toward compile_cache_max_unused_runs: "
                                      "it ran the last failures only (--lf)*"])
    assert inductor_count(bundle) == 4 and runs_recorded(bundle) == 1

    whole = run_inner(*args, "--compile-cache-update", ini=ini)
    whole.assert_outcomes(passed=3)
    saved = json.loads((project.path / "r.json").read_text())["bundle"]["saved"]
    if kernels_name_their_folder:  # torch 2.7: no kernel is carried
        assert not kernels and "cpp" not in saved["artifacts"]
        whole.stdout.fnmatch_lines(["*dropped as unused in the last updating runs (compile_cache_max_unused_runs): "
                                    "1 fx_graph, 1 aot_autograd"])
    else:  # the cos kernel goes with its graph: sin's, tan's and the warmup's stay
        assert kernels["count"] == 4 and saved["artifacts"]["cpp"]["count"] == 3, (kernels, saved["artifacts"])
        whole.stdout.fnmatch_lines(["*dropped as unused in the last updating runs (compile_cache_max_unused_runs): "
                                    "1 fx_graph, 1 aot_autograd, 1 cpp"])
    assert "not counted" not in whole.stdout.str() and "not_counted" not in saved
    assert inductor_count(bundle) == 3 and runs_recorded(bundle) == 2
    assert len(keys(bundle)) == 6 and len(set(keys(bundle)) & built_keys) == 2, "test_kept's kept, test_once's new"


def test_a_run_that_lost_a_worker_or_its_warmup_is_not_counted(project: pytest.Pytester,
                                                             run_inner: Callable[..., pytest.RunResult]) -> None:
    """A run whose xdist worker died, or whose warmup failed, ran part of the suite as far as usage goes: it
    records what it used but does not count toward compile_cache_max_unused_runs, and drops nothing."""
    bundle = project.path / "b.bundle"
    ini = "compile_cache_max_unused_runs = 1"
    args = (f"--compile-cache-bundle={bundle}", "--compile-cache-update", "--compile-cache-report=r.json")
    project.makepyfile(test_b=TESTS.replace("torch.cos(x) - 3", "torch.tan(x) - 3"),
                       test_d="import os\n\ndef test_dies():\n    os._exit(3)\n")
    died = run_inner(*args, "-n", "2", ini=ini)
    died.assert_outcomes(passed=2, failed=1)
    died.stdout.fnmatch_lines(["*not counted toward compile_cache_max_unused_runs: a worker died (gw?), so what "
                               "its tests used is not known*"])
    assert "dropped as unused" not in died.stdout.str()
    assert inductor_count(bundle) == 3 and runs_recorded(bundle) == 1, "tan's graph added, nothing counted"

    (project.path / "test_d.py").unlink()
    project.makeconftest("def pytest_compilecache_warmup(cache):\n    raise RuntimeError('no warmup today')\n")
    failed = run_inner(*args, ini=ini)
    assert failed.parseoutcomes()["passed"] == 2, failed.stdout.str()
    failed.stdout.fnmatch_lines(["*not counted toward compile_cache_max_unused_runs: the warmup failed, so "
                                 "warm_cache tests were skipped*"])
    assert "dropped as unused" not in failed.stdout.str()
    assert json.loads((project.path / "r.json").read_text())["bundle"]["saved"]["not_counted"].startswith("the warmup")
    assert inductor_count(bundle) == 3 and runs_recorded(bundle) == 1


def test_kernels_go_only_after_every_run_in_the_window_recorded_what_torch_asked_for(
        project: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], kernels_name_their_folder: bool) -> None:
    """A bundle whose counted runs did not record the C++ kernels torch asked for (written before the plugin recorded
    them) loses no kernel until every run in the window did: then an edited function's kernel goes with its graph."""
    if kernels_name_their_folder:
        pytest.skip("this torch writes a kernel's folder into its source: the plugin carries no C++ kernel")
    bundle = project.path / "b.bundle"
    with read_manifest(bundle) as b:
        b.read_all()
        (entry,) = b.entries
    assert entry.index is not None and entry.index.kernels_since and len(entry.index.whole_runs) == 1
    entry.index.kernels_since = 0.0
    entry.index.forget([name for name in entry.index.used if name.startswith("cpp/")])
    entry.reset_index()
    write_bundle(Bundle(bundle, [entry]))

    ini = "compile_cache_max_unused_runs = 2"
    args = (f"--compile-cache-bundle={bundle}", "--compile-cache-update", "--compile-cache-report=r.json")
    project.makepyfile(test_b=TESTS.replace("torch.cos(x) - 3", "torch.tan(x) - 3"))
    first = run_inner(*args, ini=ini)
    first.assert_outcomes(passed=2)
    assert "dropped as unused" not in first.stdout.str(), "the building run in the window recorded no asks"
    cpp = json.loads((project.path / "r.json").read_text())["bundle"]["saved"]["artifacts"]["cpp"]["count"]

    second = run_inner(*args, ini=ini)
    second.assert_outcomes(passed=2)
    second.stdout.fnmatch_lines(["*dropped as unused in the last updating runs (compile_cache_max_unused_runs): "
                                 "1 fx_graph, 1 aot_autograd, 1 cpp"])
    assert json.loads((project.path / "r.json").read_text())["bundle"]["saved"]["artifacts"]["cpp"]["count"] == cpp - 1


def test_prune_max_size_drops_the_least_recently_used(project: pytest.Pytester, built: Path,
                                                      run_inner: Callable[..., pytest.RunResult],
                                                      kernels_name_their_folder: bool) -> None:
    cli = [sys.executable, "-m", "pytest_compilecache", "prune"]
    spare = project.path / "spare.bundle"
    with read_manifest(built) as b:
        b.read_all()
        (real,) = b.entries
        carried, _ = b.carried(real)
    build = next(iter(carried.builds))
    carried.add(build, "zz/padding.so", os.urandom(2_000_000))  # binaries far larger than the artifacts
    padded = make_entry(real.env, b.payload(real), real.artifacts, real.created, carried, real.index)
    write_bundle(Bundle(spare, [padded]))
    with read_manifest(spare) as b:
        binaries_bytes = b.entries[0].binaries_section["size"]  # type: ignore[index]
    fits_without_binaries = spare.stat().st_size - binaries_bytes + 64
    result = subprocess.run([*cli, str(spare), "--max-size", str(fits_without_binaries)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert inductor_count(spare) == 2, "dropping the binaries fits: no artifact is lost"
    with read_manifest(spare) as b:
        assert b.entries[0].binaries_section is None and "dropped the carried binaries" in result.stdout

    bundle = project.path / "b.bundle"
    args = (f"--compile-cache-bundle={bundle}",)
    run_inner(*args, "--compile-cache-update", "-k", "kept").assert_outcomes(passed=1)
    with read_manifest(bundle) as b:
        b.read_all()
        (entry,) = b.entries
        index, _ = b.key_index(entry)
    assert index is not None
    before = set(index.keys)
    newest = max(index.used.values())
    recent = {name.split("/", 1)[1] for name, when in index.used.items() if when == newest
              and not name.startswith("cpp/")}
    assert len(recent) == 2, "the update run used the kept test's FX and AOTAutograd entries"
    kernels = [name for name, when in index.used.items() if when == newest and name.startswith("cpp/")]
    assert len(kernels) == (0 if kernels_name_their_folder else 1), f"and the kept test's C++ kernel: {kernels}"
    size = bundle.stat().st_size
    binaries = entry.binaries.counts()["bytes"] if entry.binaries else 0

    cli = [*cli, str(bundle)]
    result = subprocess.run([*cli, "--max-size", str(size - 1)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "kept 1 of 1 environment;" in result.stdout and " -> " in result.stdout, result.stdout
    assert bundle.stat().st_size <= size - 1
    with read_manifest(bundle) as b:
        b.read_all()
        (entry,) = b.entries
        index, _ = b.key_index(entry)
        assert entry.binaries is not None and entry.binaries.counts()["bytes"] == binaries, "binaries go last"
    assert index is not None and recent <= set(index.keys) < before, "only what the last run did not use went"

    too_small = subprocess.run([*cli, "--max-size", "1k"], capture_output=True, text=True, timeout=300)
    assert too_small.returncode == 2 and "cannot fit in 1,000 bytes" in too_small.stderr, too_small.stderr
    bad = subprocess.run([*cli, "--max-size", "lots"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "give a size such as 50MB" in bad.stderr, bad.stderr


def test_rebuild_replaces_this_machines_entry_and_keeps_others(project: pytest.Pytester,
                                                               run_inner: Callable[..., pytest.RunResult]) -> None:
    bundle = project.path / "b.bundle"
    args = (f"--compile-cache-bundle={bundle}",)
    with read_manifest(bundle) as b:
        b.read_all()
        (mine,) = b.entries
    foreign = make_entry({**mine.env, "device": "NVIDIA H200"}, b.payload(mine), mine.artifacts)
    write_bundle(Bundle(bundle, [mine, foreign]))

    rebuilt = run_inner(*args, "--compile-cache-rebuild", "-k", "once")
    rebuilt.assert_outcomes(passed=1)
    rebuilt.stdout.fnmatch_lines(["*bundle: ignored: *not read (--compile-cache-rebuild)*",
                                  "*bundle written:*b.bundle*"])
    with read_manifest(bundle) as b:
        entries = {e.env["device"]: e for e in b.entries}
    assert set(entries) == {mine.env["device"], "NVIDIA H200"}, "the other machine's entry is kept"
    assert entries[mine.env["device"]].artifacts["inductor"]["count"] == 1, "only what this run compiled"
    assert entries["NVIDIA H200"].artifacts == mine.artifacts

    data = bundle.read_bytes()
    bundle.write_bytes(data[: len(data) // 2])
    healed = run_inner(*args, "--compile-cache-rebuild", "--compile-cache-strict", "-k", "kept")
    healed.assert_outcomes(passed=1)
    healed.stdout.fnmatch_lines(["compilecache: bundle *b.bundle: truncated*; --compile-cache-rebuild writes a fresh one",
                                 "*rebuilt (--compile-cache-rebuild):*its entries were dropped and a fresh one written"])
    with read_manifest(bundle) as b:
        assert [e.env["device"] for e in b.entries] == [mine.env["device"]]


def test_rebuild_under_xdist_never_loads_the_old_entry(project: pytest.Pytester,
                                                       run_inner: Callable[..., pytest.RunResult]) -> None:
    """With --compile-cache-rebuild and a warmup that publishes nothing, no worker falls back to the
    old entry at PATH: each says it was not read, and warm_cache tests skip."""
    bundle = project.path / "b.bundle"
    project.makeconftest("def pytest_compilecache_warmup(cache):\n    pass\n")
    project.makepyfile(test_w="def test_w1(warm_cache):\n    pass\n\ndef test_w2(warm_cache):\n    pass\n")
    report = project.path / "r.json"
    result = run_inner(f"--compile-cache-bundle={bundle}", "--compile-cache-rebuild", "-n", "2", "--dist", "each",
                       f"--compile-cache-report={report}", "test_w.py")
    result.assert_outcomes(skipped=4)
    import json

    processes = json.loads(report.read_text())["bundle"]["processes"]
    assert len(processes) == 2
    assert all(p["status"] == "ignored" for p in processes), processes
    assert inductor_count(bundle) == 2, "the old entry is still there, unread"
