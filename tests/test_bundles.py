"""Bundles end to end: warmup once, warm hits in every worker, bad input, concurrency, strict mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import filelock
import pytest

from helpers import WARMUP_CONFTEST, fingerprint_here
from pytest_compilecache.bundle.format import MAGIC, Bundle, make_entry, read_manifest
from pytest_compilecache.bundle.writing import write_bundle
from pytest_compilecache.storage.local import lock_file
from zygote import Zygote, Zygotes

#: Real sessions against real servers and suites: left out of the fast tier (-m "not slow").
pytestmark = pytest.mark.slow

CONFTEST = '''
import os
import torch

def mlp(x):
    return torch.nn.functional.gelu(x @ x.T).softmax(-1)

def pytest_compilecache_warmup(cache):
    with open(os.environ["WARMUP_LOG"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    torch.compile(mlp)(torch.randn(16, 16))
'''

TESTS = '''
import torch
from conftest import mlp

def test_warm_hits(warm_cache):
    torch.compile(mlp)(torch.randn(16, 16))
    warm_cache.assert_misses(fx_graph=0, aot_autograd=0)
    warm_cache.assert_hits(fx_graph=1, aot_autograd=1)
    assert warm_cache.stats.fx_graph.from_bundle == 1

def test_plain_compile_uses_the_loaded_bundle():
    torch.compile(mlp)(torch.randn(16, 16))
'''

RunInner = Callable[..., pytest.RunResult]


@pytest.fixture
def warm_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose warmup compiles one MLP and logs each run of the warmup to a file."""
    log = pytester.path / "warmups.log"
    monkeypatch.setenv("WARMUP_LOG", str(log))
    pytester.makeconftest(CONFTEST)
    for i in range(2):
        pytester.makepyfile(**{f"test_warm_{i}": TESTS})
    return log


def warmups(log: Path) -> int:
    return len(log.read_text().split()) if log.exists() else 0


def report_of(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("mode", [pytest.param([], id="plain"),  # the compat tier: torch is reached the same way
                                  pytest.param(["-n", "2"], id="n2", marks=[pytest.mark.compat, pytest.mark.core])])
def test_warmup_runs_once_and_every_worker_hits(
    pytester: pytest.Pytester, run_inner: RunInner, warm_project: Path, default_dir_of: Path, mode: list[str]
) -> None:
    bundle = pytester.path / "ci" / "nested" / "suite.bundle"
    report = pytester.path / "report.json"
    args = [*mode, f"--compile-cache-bundle={bundle}", f"--compile-cache-report={report}"]
    fresh = not mode  # serial: fresh processes, the plugin loaded before torch (the -n 2 runs are forked)
    first = run_inner(*args, fresh=fresh)
    first.assert_outcomes(passed=4)
    assert warmups(warm_project) == 1, "the warmup must run exactly once across all workers"
    assert bundle.exists() and read_manifest(bundle).entries[0].artifacts["inductor"]["count"] >= 1
    data = report_of(report)
    assert data["format"] == 2
    assert len(data["tests"]) == 4
    warm = [v for k, v in data["tests"].items() if "test_warm_hits" in k]
    assert all(t["fx_graph"]["misses"] == 0 and t["fx_graph"]["hits"] == 1 for t in warm)
    assert data["totals"]["fx_graph"]["misses"] == 0
    assert data["bundle"]["saved"]["status"] == "saved", "a missing PATH is written at the end"
    first.stdout.fnmatch_lines(["*compilecache*", "*per-layer totals*", "*fx_graph*"])
    assert not default_dir_of.exists()
    before = bundle.read_bytes()
    second = run_inner(*args, fresh=fresh)
    second.assert_outcomes(passed=4)
    assert warmups(warm_project) == 1, "a matching bundle must not run the warmup again"
    assert bundle.read_bytes() == before, "an existing bundle is not rewritten without --compile-cache-update"
    second.stdout.fnmatch_lines(["compilecache: bundle *suite.bundle: 1 environment, *", "*bundle kept*"])
    assert "every compile outside cold_cache tests hit: nothing to add" in second.stdout.str(), \
        "no advice to update a bundle that this session has nothing to add to"


def test_without_a_bundle_warm_tests_skip_with_a_reason(pytester: pytest.Pytester, run_inner: RunInner) -> None:
    pytester.makepyfile("def test_w(warm_cache):\n    pass\n")
    result = run_inner("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*warm_cache needs a usable bundle*--compile-cache-bundle=PATH*"])
    named = run_inner("-rs", "--compile-cache-bundle=w.bundle")
    named.assert_outcomes(skipped=1)
    text = named.stdout.str()
    assert "get one with --compile-cache-bundle=PATH" not in text, "not the option this run gave already"
    named.stdout.fnmatch_lines(["*w.bundle*no pytest_compilecache_warmup hook*"])


def test_without_path_the_warmup_bundle_lives_for_the_session(
    pytester: pytest.Pytester, run_inner: RunInner, warm_project: Path
) -> None:
    result = run_inner("-n", "2")
    result.assert_outcomes(passed=4)
    assert warmups(warm_project) == 1


def _foreign_bundle(path: Path) -> None:
    env = {"torch": "1.0", "device": "NVIDIA Z100", "cuda": "99.0"}
    write_bundle(Bundle(path, [make_entry(env, b"payload of another machine", {})]))


def _corrupt_payload(path: Path) -> None:
    _foreign_bundle(path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))


BAD = {
    "random-bytes": (lambda p: p.write_bytes(os.urandom(4096)), "not a pytest-compilecache bundle"),
    "empty": (lambda p: p.write_bytes(b""), "empty file"),
    "not-a-bundle": (lambda p: p.write_text("model weights, say\n"), "not a pytest-compilecache bundle"),
    "truncated": (lambda p: (_foreign_bundle(p), p.write_bytes(p.read_bytes()[:-5])), "truncated"),
    "bad-checksum": (_corrupt_payload, "no entry matches this machine"),
    "foreign": (_foreign_bundle, "no entry matches this machine (torch: bundle 1.0, here 2."),
    "future-format": (
        lambda p: p.write_bytes(b'PYTEST-COMPILECACHE-BUNDLE\n14\n{"format": 99}'),
        "bundle format 99 is not supported",
    ),
}


@pytest.mark.parametrize("kind", list(BAD))
@pytest.mark.compat
def test_bad_bundle_runs_cold_and_is_left_alone(pytester: pytest.Pytester, run_inner: RunInner, kind: str) -> None:
    make, reason = BAD[kind]
    bundle = pytester.path / "suite.bundle"
    make(bundle)
    before = bundle.read_bytes()
    pytester.makepyfile("def test_w(warm_cache):\n    pass\n\ndef test_plain():\n    pass\n")
    result = run_inner(f"--compile-cache-bundle={bundle}", "-rs", "--compile-cache-update")
    result.assert_outcomes(passed=1, skipped=1)
    out = result.stdout.str()
    assert str(bundle) in out and reason in out, out
    assert bundle.read_bytes() == before, "a bad or foreign bundle must never be overwritten by a session with nothing"


def test_strict_mode_fails_before_tests_on_a_corrupt_bundle(pytester: pytest.Pytester, run_inner: RunInner) -> None:
    bundle = pytester.path / "suite.bundle"
    bundle.write_bytes(MAGIC + b"not a length\n")
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = run_inner(f"--compile-cache-bundle={bundle}", "--compile-cache-strict")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--compile-cache-strict: bundle problem at session start*",
                                 "*corrupt: the manifest length is unreadable*"])
    assert "passed" not in result.stdout.str(), "no test may run"


@pytest.mark.parametrize("mode", [[], ["-n", "2"]], ids=["plain", "n2"])
@pytest.mark.compat
def test_strict_mode_fails_before_tests_on_a_foreign_bundle(
    pytester: pytest.Pytester, run_inner: RunInner, mode: list[str]
) -> None:
    bundle = pytester.path / "suite.bundle"
    _foreign_bundle(bundle)
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = run_inner(*mode, f"--compile-cache-bundle={bundle}", "--compile-cache-strict")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bundle problem at session start*", f"*{bundle}: no entry matches this machine*"])
    assert "passed" not in result.stdout.str(), "no test may run"


def test_unwritable_path_is_reported_and_the_session_goes_on(
    pytester: pytest.Pytester, run_inner: RunInner, warm_project: Path
) -> None:
    blocker = pytester.path / "not-a-dir"
    blocker.write_text("a file where a folder should be")
    bundle = blocker / "suite.bundle"
    result = run_inner(f"--compile-cache-bundle={bundle}")
    result.assert_outcomes(passed=4)  # the warmup still runs, into the session's own bundle
    result.stdout.fnmatch_lines([f"PROBLEM: {bundle}: cannot be read or written: {blocker} is a file, not a folder"])
    assert sum(line.startswith("PROBLEM") for line in result.stdout.lines) == 1
    strict = run_inner(f"--compile-cache-bundle={bundle}", "--compile-cache-strict", "-p", "no:xdist")
    assert strict.ret != 0


def test_lock_timeout_names_the_lock_file(
    pytester: pytest.Pytester, run_inner: RunInner, warm_project: Path
) -> None:
    bundle = pytester.path / "suite.bundle"
    lock = filelock.FileLock(str(lock_file(bundle)))
    with lock:
        result = run_inner(f"--compile-cache-bundle={bundle}", "--compile-cache-lock-timeout=1", "-rs")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines([f"*{lock_file(bundle)}: could not take the lock within 1 s*"])
    assert warmups(warm_project) == 0


@pytest.mark.compat
def test_two_concurrent_updating_runs_end_with_the_union(pytester: pytest.Pytester, private_tmp: Path,
                                                         shared_headers_dir: Path, zygote: Zygotes | None) -> None:
    """Two sessions started at once, each updating one bundle with a graph of its own, leave both graphs in it.
    The two are forked from the two zygotes at once (fresh processes where they cannot be)."""
    bundle = pytester.path / "shared.bundle"
    args = ["-p", "no:logging", f"--compile-cache-bundle={bundle}", "--compile-cache-update", "-q"]
    env = dict(os.environ)
    projects = []
    for name, fn in (("a", "x.sin() + 1"), ("b", "x.cos() * 2")):
        project = pytester.mkdir(name)
        (project / f"test_{name}.py").write_text(
            f"import torch\n\ndef test_{name}():\n    torch.compile(lambda x: {fn})(torch.randn(8))\n"
        )
        (project / "pytest.ini").write_text(f"[pytest]\ncompile_cache_headers_dir = {shared_headers_dir}\n")
        projects.append(project)
    forks = [zygote.next(env) if zygote is not None else None for _ in projects]

    def session(project: Path, fork: Zygote | None) -> tuple[int, str]:
        if fork is None:
            done = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=project, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
            return done.returncode, done.stdout
        out, err = project.with_suffix(".out"), project.with_suffix(".err")
        code = fork.run(args, project, env, out, err, 300)
        return code, out.read_text() + err.read_text()

    with ThreadPoolExecutor(len(projects)) as pool:
        ended = list(pool.map(session, projects, forks))
    assert all(code == 0 for code, _ in ended), ended
    entry = read_manifest(bundle).entries[0]
    assert entry.artifacts["inductor"]["count"] == 2, (entry.artifacts, ended)
    assert entry.artifacts["aot_autograd"]["count"] == 2


def test_a_matching_entry_torch_cannot_load_runs_cold(pytester: pytest.Pytester, run_inner: RunInner) -> None:
    here = fingerprint_here()
    bundle = pytester.path / "suite.bundle"
    write_bundle(Bundle(bundle, [make_entry(here, b"checksummed, but not Mega-Cache bytes", {})]))
    before = bundle.read_bytes()
    pytester.makepyfile("def test_w(warm_cache):\n    pass\n")
    result = run_inner(f"--compile-cache-bundle={bundle}", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"*{bundle}: torch could not deserialize the artifacts*"])
    assert bundle.read_bytes() == before


def test_a_dead_lock_holder_does_not_block_the_others(
    pytester: pytest.Pytester, run_inner: RunInner, warm_project: Path
) -> None:
    bundle = pytester.path / "suite.bundle"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import filelock, sys, time; filelock.FileLock(sys.argv[1]).acquire(); "
         "print('held', flush=True); time.sleep(600)", str(lock_file(bundle))],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    result = run_inner(f"--compile-cache-bundle={bundle}", "--compile-cache-lock-timeout=30")
    result.assert_outcomes(passed=4)
    assert warmups(warm_project) == 1



GROWTH_TESTS = """
import torch
from conftest import f

def test_warm(warm_cache):
    torch.compile(f)(torch.randn(8))
    warm_cache.assert_misses(fx_graph=0)

def test_a_config_change_misses(cold_cache):
    from torch._inductor import config
    with config.patch(fallback_random=True):
        torch.compile(lambda x: x.cos() * 3)(torch.randn(16))
    cold_cache.assert_misses(fx_graph=1)
"""


@pytest.mark.slow
def test_updating_runs_with_no_change_leave_the_bundle_size_unchanged(
    pytester: pytest.Pytester, run_inner: RunInner
) -> None:
    """cold_cache compiles are never reusable, so an updating run does not add them."""
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_growth=GROWTH_TESTS)
    bundle = pytester.path / "suite.bundle"
    sizes, artifacts = [], []
    for args in ([], ["--compile-cache-update"], ["--compile-cache-update"]):
        result = run_inner(f"--compile-cache-bundle={bundle}", *args, ini=f"compile_cache_home = {pytester.path / 'h'}")
        result.assert_outcomes(passed=2)
        sizes.append(bundle.stat().st_size)
        with read_manifest(bundle) as written:
            (entry,) = written.entries
            artifacts.append(entry.artifacts)
    assert artifacts[0] == artifacts[1] == artifacts[2], artifacts
    # Only the usage record grows (the time of each updating run, for compile_cache_max_unused_runs;
    # at most keyindex.MAX_RUNS of them are kept).
    assert all(0 <= later - earlier < 64 for earlier, later in zip(sizes, sizes[1:])), sizes


ON_DEMAND_CONFTEST = """
import torch

def f(x):
    return torch.sin(x) + 1

def g(x):
    return torch.cos(x) * 2

def pytest_compilecache_warmup(cache):
    torch.compile(f)(torch.randn(8))
    torch.compile(g)(torch.randn(8))
"""

ON_DEMAND_TESTS = """
import torch
from conftest import f, g

def entries(cache, layer):
    folder = cache.path / layer
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []

def test_f_reads_only_its_own_entries(warm_cache):
    assert entries(warm_cache, "fxgraph") == [] and entries(warm_cache, "aotautograd") == []
    assert not list(warm_cache.path.glob("*/*.so")) and not list(warm_cache.path.glob("*/*.cpp"))
    torch.compile(f)(torch.randn(8))
    warm_cache.assert_hits(fx_graph=1, aot_autograd=1, cpp=1)
    assert len(entries(warm_cache, "fxgraph")) == 1 and len(entries(warm_cache, "aotautograd")) == 1
    binaries = list(warm_cache.path.glob("*/*.so"))
    assert binaries and all(list(b.parent.glob("*.cpp")) for b in binaries), \
        "binaries only in the folders torch wrote a source into (g's is not linked)"

def test_a_process_the_test_starts_finds_the_whole_bundle_once_linked(warm_cache):
    import subprocess, sys
    child = "import torch; from conftest import f; from torch._dynamo.utils import counters; " \
            "torch.compile(f)(torch.randn(8)); print(counters['inductor']['fxgraph_cache_hit'])"
    warm_cache.link_whole_bundle()
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "1", "the child compiles with this test's folder, and hits"
    assert len(entries(warm_cache, "fxgraph")) == 2 and len(entries(warm_cache, "aotautograd")) == 2
    assert len(list(warm_cache.path.glob("*/*.so"))) >= 2, "and every binary (f's, g's, the probes)"

def test_a_variant_of_f_misses(warm_cache):
    torch.compile(f)(torch.randn(8, 3))
    warm_cache.assert_misses(fx_graph=1, aot_autograd=1)

def test_what_the_test_before_wrote_stays_in_its_folder(warm_cache):
    torch.compile(g)(torch.randn(8))
    warm_cache.assert_hits(fx_graph=1, aot_autograd=1)
    torch.compile(f)(torch.randn(8, 3))
    warm_cache.assert_misses(fx_graph=1, aot_autograd=1)
"""


def test_a_warm_test_folder_gets_the_entries_torch_asks_for(pytester: pytest.Pytester, run_inner: RunInner) -> None:
    """A warm test's folder is not the whole bundle: its FX graph and AOTAutograd entries are linked in
    as torch asks for their keys (each test paid for every entry of the bundle before), its C++ binaries
    as torch asks for their folders, and C++ sources are left for torch to write. It still hits what the bundle holds, a process the test starts finds
    the whole bundle once the test links it, and what a test writes stays in its own folder."""
    pytester.makeconftest(ON_DEMAND_CONFTEST)
    pytester.makepyfile(test_on_demand=ON_DEMAND_TESTS)
    result = run_inner(f"--compile-cache-bundle={pytester.path / 'b.bundle'}")
    result.assert_outcomes(passed=4)


PLAIN_ON_DEMAND_TESTS = """
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from conftest import f

FOLDER = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])

def entries(layer):
    return [p for p in (FOLDER / layer).rglob("*") if p.is_file()] if (FOLDER / layer).exists() else []

def test_a_warm_test_before_it(warm_cache):
    # The next test checks that it left the session's folder to on-demand placing.
    assert warm_cache.path != FOLDER

def test_a_plain_test_finds_the_entries_it_asks_for():
    assert entries("fxgraph") == [] and entries("aotautograd") == []
    assert not list(FOLDER.glob("*/*.so")), "the bundle's binaries come when torch asks for their folder"
    before = counters["inductor"]["fxgraph_cache_hit"]
    torch.compile(f)(torch.randn(8))
    assert counters["inductor"]["fxgraph_cache_hit"] == before + 1
    assert len(entries("fxgraph")) == 1 and len(entries("aotautograd")) == 1
    assert list(FOLDER.glob("*/*.so"))
"""


def test_the_session_folder_gets_the_entries_torch_asks_for(pytester: pytest.Pytester, run_inner: RunInner) -> None:
    """Compiles outside fixtures use the session's folder, filled from the bundle as a warm test's is:
    its FX graph and AOTAutograd entries and C++ binaries as torch asks for them (linking the whole
    bundle there cost every process about 0.15 s for a bundle of 60 small graphs). A plain test still hits what the
    bundle holds: in the run that built the bundle, and in a new process that loads it, whose first
    compile learns the CPU's vector instructions (starting processes) inside the first test."""
    pytester.makeconftest(ON_DEMAND_CONFTEST)
    pytester.makepyfile(test_plain_on_demand=PLAIN_ON_DEMAND_TESTS)
    result = run_inner(f"--compile-cache-bundle={pytester.path / 'b.bundle'}")
    result.assert_outcomes(passed=2)
    loaded = run_inner(f"--compile-cache-bundle={pytester.path / 'b.bundle'}", fresh=True)
    loaded.assert_outcomes(passed=2)


def test_a_warm_folder_starts_with_the_autotune_results_and_without_binaries(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    """What a warm test's folder gets at its start from the two-character folders: the files torch
    finds by paths of its own (an autotune result beside a kernel's source), not the C++ binaries
    (linked when torch asks for their folder) nor their sources (torch writes those); a folder with
    nothing else in it is not made. In a run of its own: installing wraps torch's functions for the
    rest of the process."""
    pytester.makepyfile(test_fill="""
import torch._inductor.codecache

from pytest_compilecache._torchapi import fill_warm_folder, patches


def test_fill(tmp_path):
    patches.install()
    template, folder = tmp_path / "template", tmp_path / "test"
    for rel, text in {"ab/kernel.best_config": "{}", "ab/cx.so": "so", "ab/cx.cpp": "cpp", "cd/cy.so": "so",
                      "cd/cy.cpp": "cpp", "fxgraph/cpu/ef/key/entry": "fx", "triton/k/kernel.cubin": "cubin"}.items():
        (template / rel).parent.mkdir(parents=True, exist_ok=True)
        (template / rel).write_text(text)
    fill_warm_folder(template, folder)
    placed = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert placed == ["ab/kernel.best_config", "triton/k/kernel.cubin"], placed
    assert not (folder / "cd").exists()
    (template / "ef").mkdir()  # the template changed (as when it is loaded again): looked at again
    (template / "ef" / "other.best_config").write_text("{}")
    fill_warm_folder(template, tmp_path / "next")
    assert (tmp_path / "next" / "ef" / "other.best_config").exists()
""")
    run_inner().assert_outcomes(passed=1)
