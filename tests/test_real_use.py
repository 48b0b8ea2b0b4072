"""Bugs found under real use (issue 8), each driven as a user would, through pytest in a subprocess."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Callable

import pytest

from helpers import fingerprint_here
from pytest_compilecache import _torchapi, cli
from pytest_compilecache.bundle.format import Bundle, make_entry, read_manifest
from pytest_compilecache.bundle.writing import write_bundle

#: Real sessions against real servers and suites: left out of the fast tier (-m "not slow").
pytestmark = pytest.mark.slow

RunInner = Callable[..., pytest.RunResult]
RunSession = Callable[..., subprocess.CompletedProcess[str]]

WARMUP_CONFTEST = '''
import os
import pytest

def mlp(x):
    import torch
    return torch.nn.functional.gelu(x @ x.T).softmax(-1)

@pytest.hookimpl(optionalhook=True)
def pytest_compilecache_warmup(cache):
    with open(os.environ["WARMUP_LOG"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    if os.environ.get("WARMUP_RAISES"):
        raise ValueError("the model file is missing")
    import torch
    torch.compile(mlp)(torch.randn(16, 16))
'''

WARM_TEST = '''
def test_warm(warm_cache):
    import torch
    from conftest import mlp
    torch.compile(mlp)(torch.randn(16, 16))
    warm_cache.assert_misses(fx_graph=0)

def test_plain():
    pass
'''


@pytest.fixture
def warmup_log(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = pytester.path / "warmups.log"
    monkeypatch.setenv("WARMUP_LOG", str(log))
    return log


def warmups(log: Path) -> int:
    return len(log.read_text().split()) if log.exists() else 0


def identities(*bundles: Path) -> list[set[tuple[str, str, str]]]:
    """(type, key, content hash) of every artifact in each bundle's only entry (torch's compiler is imported
    in this process before any test: ``tests/conftest.py``)."""
    found = []
    for path in bundles:
        with read_manifest(path) as bundle:
            found.append(_torchapi.artifact_identities(bundle.payload(bundle.entries[0])))
    return found


DYNAMIC_TEST = '''
import os
import torch

def scaled(x):
    return torch.softmax(x * 0.5, dim=-1) + x.mean()

def test_compile_one_size():
    n = int(os.environ["SIZE"])
    torch.compile(scaled, dynamic=True)(torch.randn(n, n))
'''


def test_merging_keeps_every_entry_under_one_key(
    pytester: pytest.Pytester, run_inner: RunInner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 1: two guard variants under one FX/AOT key survive the end-of-session merge and the CLI merge."""
    pytester.makepyfile(test_dynamic=DYNAMIC_TEST)
    a, b, both = (pytester.path / n for n in ("a.bundle", "b.bundle", "both.bundle"))
    for size, path in (("32", a), ("33", b)):
        monkeypatch.setenv("SIZE", size)
        run_inner(f"--compile-cache-bundle={path}").assert_outcomes(passed=1)
    run_inner("--dist", "each", "--tx", "popen//env:SIZE=32", "--tx", "popen//env:SIZE=33",
              f"--compile-cache-bundle={both}").assert_outcomes(passed=2)
    merged = pytester.path / "merged.bundle"
    assert cli.main(["merge", str(a), str(b), "-o", str(merged)]) == 0, "the CLI merge failed"
    ia, ib, in_merged, in_both = identities(a, b, merged, both)
    shared_keys = {(t, k) for t, k, _ in ia} & {(t, k) for t, k, _ in ib}
    assert {t for t, _ in shared_keys} >= {"inductor", "aot_autograd"}, "sizes 32 and 33 share their keys"
    assert ia | ib <= in_merged, f"the CLI merge lost entries: {sorted((ia | ib) - in_merged)}"
    for name, found in (("merged", in_merged), ("both", in_both)):
        per_key = Counter((t, k) for t, k, _ in found)
        assert all(per_key[key] == 2 for key in shared_keys), (name, per_key)


def test_dist_without_workers_runs_as_a_single_process(
    pytester: pytest.Pytester, run_inner: RunInner, warmup_log: Path
) -> None:
    """Item 2: ``--dist loadgroup`` without ``-n`` loads, warms up and saves like a plain run."""
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_x=WARM_TEST)
    bundle = pytester.path / "x.bundle"
    result = run_inner("--dist", "loadgroup", f"--compile-cache-bundle={bundle}")
    result.assert_outcomes(passed=2)
    assert warmups(warmup_log) == 1
    assert bundle.exists()
    result.stdout.fnmatch_lines(["*warmup ran here and wrote*x.bundle*", "bundle written:*x.bundle: what the warmup compiled*"])


@pytest.mark.parametrize("mode", [[], ["-n", "2"], ["nopath"]], ids=["plain", "n2", "no-path"])
def test_a_failing_warmup_is_reported_once_and_skips_warm_tests(
    pytester: pytest.Pytester, run_inner: RunInner, warmup_log: Path, monkeypatch: pytest.MonkeyPatch,
    mode: list[str],
) -> None:
    """Item 3: the hook runs once, its traceback and location are shown, the rest of the suite runs."""
    monkeypatch.setenv("WARMUP_RAISES", "1")
    pytester.makeconftest(WARMUP_CONFTEST)
    for i in range(3):
        pytester.makepyfile(**{f"test_{i}": WARM_TEST})
    args = [] if mode == ["nopath"] else [*mode, f"--compile-cache-bundle={pytester.path / 'x.bundle'}"]
    result = run_inner(*args, "-rs")
    result.assert_outcomes(passed=3, skipped=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert warmups(warmup_log) == 1
    out = result.stdout.str()
    assert "INTERNALERROR" not in out
    assert sum(line.startswith("WARMUP FAILED") for line in result.stdout.lines) == 1
    assert out.count("raised ValueError: the model file is missing") == 1, "the failure is told once"
    result.stdout.fnmatch_lines([
        "WARMUP FAILED*",
        "*pytest_compilecache_warmup (*conftest.py:*) raised ValueError: the model file is missing*",
        "*Traceback*",
        "*conftest.py*in pytest_compilecache_warmup*",
        "*warm_cache: the warmup hook failed*",
    ])
    assert "pluggy/_" not in out, "the traceback starts at the hook, not in pluggy"
    assert not (pytester.path / "x.bundle").exists()


def test_a_failing_warmup_stops_a_strict_session_before_tests(
    pytester: pytest.Pytester, run_inner: RunInner, warmup_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARMUP_RAISES", "1")
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_x=WARM_TEST)
    result = run_inner(f"--compile-cache-bundle={pytester.path / 'x.bundle'}", "--compile-cache-strict")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--compile-cache-strict*", "*the warmup hook failed*the model file is missing*"])
    assert "passed" not in result.stdout.str()


def test_test_folders_are_removed_when_tests_end(pytester: pytest.Pytester, run_inner: RunInner) -> None:
    """Item 5: per-test folders live under --basetemp and go when their test passes; a failure keeps its own."""
    record = pytester.path / "paths.txt"
    pytester.makepyfile(test_x=f'''
        import torch

        def _record(cache):
            with open({str(record)!r}, "a") as f:
                f.write(str(cache.path) + "\\n")
            torch.compile(lambda x: x.sin() + 1)(torch.randn(4))

        def test_passes(cold_cache):
            _record(cold_cache)

        def test_fails(cold_cache):
            _record(cold_cache)
            assert False
    ''')
    basetemp = pytester.path / "basetemp"
    result = run_inner(f"--basetemp={basetemp}")
    result.assert_outcomes(passed=1, failed=1)
    passed, failed = (Path(p) for p in record.read_text().split())
    assert basetemp in passed.parents and basetemp in failed.parents
    assert not passed.exists(), "a passing test's cache folder must be removed when the test ends"
    assert failed.exists() and any(failed.iterdir()), "a failing test's cache folder is kept, like tmp_path"


LIGHT_CONFTEST = '''
import os, sys
import pytest

@pytest.hookimpl(optionalhook=True)
def pytest_compilecache_warmup(cache):
    with open(os.environ["WARMUP_LOG"], "a") as f:
        f.write("ran\\n")

def pytest_unconfigure(config):
    with open(os.environ["WARMUP_LOG"] + ".torch", "w") as f:
        f.write(str("torch" in sys.modules))
'''


@pytest.mark.parametrize(
    "args", [["--co"], ["--fixtures"], ["-k", "no_such_test"], ["-k", "pure_python"]],
    ids=["collect-only", "fixtures", "no-selection", "pure-selection"],
)
def test_runs_that_need_no_cache_do_no_bundle_work(
    pytester: pytest.Pytester, run_inner: RunInner, warmup_log: Path, args: list[str]
) -> None:
    """Item 6: no torch import, no warmup, no bundle written."""
    pytester.makeconftest(LIGHT_CONFTEST)
    pytester.makepyfile(test_x="def test_pure_python():\n    pass\n\ndef test_warm(warm_cache):\n    pass\n")
    bundle = pytester.path / "x.bundle"
    result = run_inner(*args, f"--compile-cache-bundle={bundle}", fresh=True)  # torch not imported: a fresh process
    assert result.ret in (0, 5), result.stdout.str()
    assert warmups(warmup_log) == 0
    assert not bundle.exists()
    assert Path(str(warmup_log) + ".torch").read_text() == "False"


def test_ini_paths_are_relative_to_the_ini_file(pytester: pytest.Pytester, shared_headers_dir: Path,
                                                private_tmp: Path, run_session: RunSession) -> None:
    """Item 7: ``compile_cache_bundle = ci/x.bundle`` means beside the ini file, from any folder."""
    pytester.makeini(f"[pytest]\ncompile_cache_headers_dir = {shared_headers_dir}\n"
                     "compile_cache_bundle = ci/x.bundle\ncompile_cache_report = ci/report.json\n")
    sub = pytester.mkdir("sub")
    (sub / "test_x.py").write_text("import torch\n\ndef test_x():\n    torch.compile(lambda x: x * 2)(torch.randn(4))\n")
    result = run_session(["-p", "no:randomly", "-q", "."], sub, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (pytester.path / "ci" / "x.bundle").exists()
    assert (pytester.path / "ci" / "report.json").exists()
    assert not (sub / "ci").exists()


def test_disabling_the_plugin_works_with_a_warmup_hook(pytester: pytest.Pytester, warmup_log: Path) -> None:
    """Item 8: the README's hook (``optionalhook=True``) runs with ``-p no:compilecache``."""
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_x="def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:compilecache")
    result.assert_outcomes(passed=1)
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    examples = (Path(__file__).parent.parent / "examples" / "conftest.py").read_text()
    for text in (readme, examples):
        assert re.search(r"@pytest.hookimpl\(optionalhook=True\)[^\n]*\ndef pytest_compilecache_warmup", text)


def test_fields_torch_cannot_count_are_unobservable_and_cold_cache_turns_remote_caches_off(
    pytester: pytest.Pytester, run_inner: RunInner
) -> None:
    """Item 9: ``saved`` is a real count or unobservable; remote caches are off inside ``cold_cache``."""
    pytester.makepyfile(test_x='''
        import torch
        import torch._inductor.config as inductor_config
        import torch._functorch.config as functorch_config
        from pytest_compilecache import UnobservableLayerError

        def test_saved_is_counted_or_unobservable(cold_cache):
            torch.compile(lambda x: x.sin() + 2)(torch.randn(4))
            fx = cold_cache.stats.fx_graph
            try:
                saved = fx.saved
            except UnobservableLayerError as exc:
                assert fx.saved_unobservable and "saved" in str(exc)
            else:
                assert saved == 1, "a compiled graph was saved once"

            ''')
    (pytester.path / "test_y.py").write_text('''
import pytest
import torch._inductor.config as inductor_config
import torch._functorch.config as functorch_config

@pytest.fixture
def remote_on(monkeypatch):
    monkeypatch.setattr(inductor_config, "fx_graph_remote_cache", True)
    monkeypatch.setattr(functorch_config, "enable_remote_autograd_cache", True)

def test_inside(remote_on, cold_cache):
    assert not inductor_config.fx_graph_remote_cache
    assert not functorch_config.enable_remote_autograd_cache
''')
    result = run_inner()
    result.assert_outcomes(passed=2)


TAG_PER_WORKER = """
import os
import torch

if "PYTEST_XDIST_WORKER" in os.environ:
    torch.compiler.config.cache_key_tag = {"gw0": "a", "gw1": "b"}[os.environ["PYTEST_XDIST_WORKER"]]
"""


def test_heterogeneous_workers_save_to_their_own_entries(pytester: pytest.Pytester, run_inner: RunInner) -> None:
    """Item 10: two workers in two environments (cache_key_tag a, b) give two entries, each its own.

    Each worker's conftest sets its own tag, as a per-worker ``TORCH_COMPILE_CACHE_KEY_TAG`` would (such a
    variable, read at import, would make both workers fresh processes instead of forked ones)."""
    pytester.makeconftest(TAG_PER_WORKER)
    pytester.makepyfile(test_x="import torch\n\ndef test_x():\n    torch.compile(lambda x: x.cos() + 3)(torch.randn(4))\n")
    bundle = pytester.path / "x.bundle"
    result = run_inner("-n", "2", "--dist", "each", f"--compile-cache-bundle={bundle}")
    result.assert_outcomes(passed=2)
    tags = sorted(e.env["cache_key_tag"] for e in read_manifest(bundle).entries)
    assert tags == ["a", "b"]
    assert all(e.artifacts["inductor"]["count"] == 1 for e in read_manifest(bundle).entries)


def test_strict_problems_are_not_hidden_by_no_tests(pytester: pytest.Pytester, run_inner: RunInner) -> None:
    """Item 11: a strict-mode problem with no test collected exits 1, not 5."""
    blocker = pytester.path / "blocker"
    blocker.write_text("a file where a folder should be")
    result = run_inner("--compile-cache-strict", f"--compile-cache-report={blocker / 'r.json'}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*PROBLEM*cannot write the report*"])


def test_a_worker_problem_stops_a_strict_xdist_session(pytester: pytest.Pytester, run_inner: RunInner) -> None:
    """Item 11: under xdist, a bundle that only a worker can find unloadable stops a strict session."""
    here = fingerprint_here()
    bundle = pytester.path / "x.bundle"
    write_bundle(Bundle(bundle, [make_entry(here, b"checksummed, but not Mega-Cache bytes", {})]))
    for i in range(4):
        pytester.makepyfile(**{f"test_{i}": "import torch\n\n" + "\n".join(
            f"def test_{j}():\n    pass\n" for j in range(5))})
    result = run_inner("-n", "2", f"--compile-cache-bundle={bundle}", "--compile-cache-strict")
    assert result.ret not in (0, 5)
    out = result.stdout.str()
    assert "bundle problem at session start" in out and "could not deserialize" in out, out
    assert "20 passed" not in out, "the session must stop, not run every test"


def test_a_warmup_hook_in_a_lower_conftest_is_used(
    pytester: pytest.Pytester, run_inner: RunInner, warmup_log: Path
) -> None:
    """Item 13: a ``pytest_compilecache_warmup`` in ``sub/conftest.py`` warms ``sub``'s tests."""
    sub = pytester.mkdir("sub")
    (sub / "conftest.py").write_text(WARMUP_CONFTEST)
    (sub / "test_x.py").write_text(WARM_TEST.replace("from conftest import mlp", "from sub.conftest import mlp"))
    (sub / "__init__.py").write_text("")
    result = run_inner(f"--compile-cache-bundle={pytester.path / 'x.bundle'}", "-rs")
    result.assert_outcomes(passed=2)
    assert warmups(warmup_log) == 1


def test_dependency_floors_match_what_the_code_uses() -> None:
    """Item 14: ``hookimpl(wrapper=True)`` needs pluggy >= 1.2; filelock >= 4.0, which leaves its lock
    file in place (3.20.4 to 3.29 removed it on release) and refuses a symlink there (CVE-2025-68146)."""
    import tomllib  # type: ignore[import-not-found,unused-ignore]

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    deps = pyproject["project"]["dependencies"]
    assert "pluggy>=1.2" in deps and "filelock>=4.0" in deps and "pytest>=7.4" in deps, deps


IMPORTING_CONFTEST = '''
import torch._inductor.codecache  # a package under test importing torch's compiler at import time
'''


@pytest.mark.parametrize("mode", [["--compile-cache-isolate", "-n", "2"], ["bundle"]], ids=["isolate-n2", "bundle"])
def test_nothing_appears_in_the_default_directory(
    pytester: pytest.Pytester, run_inner: RunInner, default_dir_of: Path, mode: list[str]
) -> None:
    """Item 16: a conftest importing torch._inductor, plain tests compiling C++: no default directory.

    The serial run is a fresh process, where the conftest is what imports torch. The ``-n 2`` run is forked
    from the zygote, which imported torch before anything else, and watched (``run_inner``): a path
    torch worked out at import would have been made in the zygote's own default directory."""
    pytester.makeconftest(IMPORTING_CONFTEST)
    pytester.makepyfile(test_x="import torch\n\ndef test_x():\n    torch.compile(lambda x: x.tan() - 1)(torch.randn(4))\n")
    args = mode if mode != ["bundle"] else [f"--compile-cache-bundle={pytester.path / 'x.bundle'}"]
    run_inner(*args, fresh=mode == ["bundle"]).assert_outcomes(passed=1)
    assert not default_dir_of.exists(), sorted(str(p) for p in default_dir_of.rglob("*"))[:5]


def test_worker_mode_keeps_one_cache_per_worker_between_runs(pytester: pytest.Pytester, run_inner: RunInner) -> None:
    """Item 17: ``--compile-cache-isolate-mode=worker``: own folder per worker, warm in the second run."""
    home = pytester.path / "home"
    record = pytester.path / "dirs.txt"
    for i in range(2):
        pytester.makepyfile(**{f"test_{i}": f'''
import os
import torch
from torch._dynamo.utils import counters

def test_{i}():
    before = counters["inductor"]["fxgraph_cache_miss"]
    torch.compile(lambda x: x * {i} + 1)(torch.randn(8))
    misses = counters["inductor"]["fxgraph_cache_miss"] - before
    with open({str(record)!r}, "a") as f:
        f.write(f"{{os.environ['PYTEST_XDIST_WORKER']}} {{misses}} {{os.environ['TORCHINDUCTOR_CACHE_DIR']}}\\n")
'''})
    args = ("-n", "2", "--dist", "each", "--compile-cache-isolate-mode=worker", "-p", "no:cacheprovider")
    first = run_inner(*args, ini=f"compile_cache_home = {home}")
    first.assert_outcomes(passed=4)
    second = run_inner(*args, ini=f"compile_cache_home = {home}")
    second.assert_outcomes(passed=4)
    second.stdout.fnmatch_lines(["compilecache: isolation: a kept cache per worker"])
    lines = [line.split(" ", 2) for line in record.read_text().splitlines()]
    assert len(lines) == 8
    dirs: dict[str, set[str]] = {}
    for worker, _, folder in lines:
        dirs.setdefault(worker, set()).add(folder)
    assert set(dirs) == {"gw0", "gw1"}
    assert all(len(d) == 1 for d in dirs.values()), "a worker keeps one folder across tests and runs"
    assert dirs["gw0"] != dirs["gw1"]
    assert all(home in Path(next(iter(d))).parents for d in dirs.values())
    assert [m for _, m, _ in lines[:4]] == ["1"] * 4, "each worker compiles each function once"
    assert [m for _, m, _ in lines[4:]] == ["0"] * 4, "the second run finds every graph in its worker's folder"


KEY_FIELDS_TEST = '''
import sys
import torch
from pytest_compilecache import _torchapi


def f(x):
    return torch.ones(x.shape[0]) * x.sin() + 1


def compile_twice(cache, change):
    torch.compile(f)(torch.randn(8))
    cache.reset_in_memory()
    with change():
        torch.compile(f)(torch.randn(8))
    return cache.stats.fx_graph


class threads:
    def __enter__(self):
        self.n = torch.get_num_threads()
        torch.set_num_threads(1 if self.n > 1 else 2)
    def __exit__(self, *exc):
        torch.set_num_threads(self.n)


class dtype:
    def __enter__(self):
        torch.set_default_dtype(torch.float64)
    def __exit__(self, *exc):
        torch.set_default_dtype(torch.float32)


def tag():
    return torch.compiler.config.patch(cache_key_tag="another tag")


def config_value():
    return torch._inductor.config.patch(fallback_random=True)


def test_num_threads_is_in_the_key(cold_cache):
    fx = compile_twice(cold_cache, threads)
    assert (fx.misses, fx.hits) == (2, 0), "torch keys CPU code on the thread count, and so does the bundle"


def test_default_dtype_is_in_the_key(cold_cache):
    fx = compile_twice(cold_cache, dtype)
    assert (fx.misses, fx.hits) == (2, 0)


def test_cache_key_tag_is_in_the_key(cold_cache):
    fx = compile_twice(cold_cache, tag)
    assert (fx.misses, fx.hits) == (2, 0)


def test_an_inductor_config_value_is_in_the_key(cold_cache):
    fx = compile_twice(cold_cache, config_value)
    assert (fx.misses, fx.hits) == (2, 0)


def test_a_remote_cache_switch_is_not_in_the_key(cold_cache):
    fx = compile_twice(cold_cache, lambda: torch._inductor.config.patch(fx_graph_remote_cache=False))
    assert (fx.misses, fx.hits) == (1, 1)


def test_the_fingerprint_follows_each_kept_field():
    base = _torchapi.environment_fingerprint()
    assert base["python"] == "%d.%d" % sys.version_info[:2], "the patch version enters no torch key"
    for change, field in ((threads, "num_threads"), (dtype, "default_dtype"), (tag, "cache_key_tag"),
                          (config_value, "config_hash")):
        with change():
            changed = _torchapi.environment_fingerprint()
        assert [k for k in base if base[k] != changed[k]] == [field]
    with torch._inductor.config.patch(fx_graph_remote_cache=False):
        assert _torchapi.environment_fingerprint() == base
'''


def test_the_fingerprint_has_exactly_the_fields_torch_keys_on(pytester: pytest.Pytester, run_inner: RunInner) -> None:
    """Item 12: each kept field makes torch miss when it changes; a value torch ignores changes nothing."""
    pytester.makepyfile(test_keys=KEY_FIELDS_TEST)
    run_inner().assert_outcomes(passed=6)
