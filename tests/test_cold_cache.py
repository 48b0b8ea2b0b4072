"""cold_cache end to end: real torch.compile calls in a subprocess, with and without xdist."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from helpers import WARMUP_CONFTEST

INNER = '''
import logging
import os
import torch
import pytest

ENV_BEFORE = {n: os.environ.get(n) for n in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}


def double_sin(x):
    return torch.sin(x) * 2 + 1


def test_first_compile_misses_then_hits_on_disk(cold_cache):
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cold_cache.path)
    assert os.environ["TRITON_CACHE_DIR"] == str(cold_cache.path / "triton")
    torch.compile(double_sin)(torch.randn(8))
    cold_cache.assert_misses(fx_graph=1, aot_autograd=1)
    cold_cache.assert_hits(fx_graph=0, aot_autograd=0)
    assert cold_cache.stats.aot_autograd.saved == 1
    assert any(cold_cache.path.iterdir()), "the compile wrote nothing into the test's own dir"
    cold_cache.reset_in_memory()
    torch.compile(double_sin)(torch.randn(8))
    cold_cache.assert_hits(fx_graph=1, aot_autograd=1)
    cold_cache.assert_misses(fx_graph=1, aot_autograd=1)


def test_second_test_misses_the_same_function(cold_cache):
    torch.compile(double_sin)(torch.randn(8))
    cold_cache.assert_misses(fx_graph=1, aot_autograd=1)
    cold_cache.assert_hits(fx_graph=0)


def test_training_graph_counts_forward_and_backward(cold_cache):
    lin = torch.nn.Linear(4, 4)
    step = torch.compile(lambda x: lin(x).relu().sum())
    step(torch.randn(2, 4)).backward()
    cold_cache.assert_misses(fx_graph=2, aot_autograd=1)
    torch._dynamo.reset()  # what a user may call directly; the helper is reset_in_memory()
    step = torch.compile(lambda x: lin(x).relu().sum())
    step(torch.randn(2, 4)).backward()
    cold_cache.assert_hits(fx_graph=2, aot_autograd=1)


def test_assertion_errors_are_clear(cold_cache):
    torch.compile(double_sin)(torch.randn(8))
    with pytest.raises(AssertionError) as info:
        cold_cache.assert_hits(fx_graph=1)
    text = str(info.value)
    assert "fx_graph expected 1, got 0" in text
    for layer in ("fx_graph", "aot_autograd", "autotune", "triton", "pgo", "precompile"):
        assert layer in text
    with pytest.raises(TypeError, match="unknown cache layer 'fx'"):
        cold_cache.assert_hits(fx=1)
    with pytest.raises(TypeError):
        cold_cache.assert_misses()
    if not torch.cuda.is_available():
        with pytest.raises(AssertionError, match="triton cannot be observed here"):
            cold_cache.assert_hits(triton=0)
        from pytest_compilecache import UnobservableLayerError
        with pytest.raises(UnobservableLayerError):
            cold_cache.stats.triton.hits


def test_a_bypass_is_counted_with_its_reason(cold_cache):
    from torch._inductor import config
    with config.patch({"fx_graph_cache": True}), torch._functorch.config.patch({"enable_autograd_cache": True}):
        @torch.compile
        def f(x):
            return torch.cond(x.sum() > 0, lambda y: y + 1, lambda y: y - 1, (x,))
        f(torch.randn(4))
    stats = cold_cache.stats
    assert stats.fx_graph.bypasses + stats.aot_autograd.bypasses >= 1, stats
    assert stats.fx_graph.bypass_reasons or stats.aot_autograd.bypass_reasons, stats


def test_a_compile_logs_nothing_torch_would_not(cold_cache):
    # The plugin listens to torch's loggers for bypass reasons; a newcomer found torch's INFO
    # "Output code written to" in a failing test's captured log, which plain pytest never shows.
    records = []
    handle = logging.Logger.callHandlers  # what a handler (pytest's capture among them) is given
    logging.Logger.callHandlers = lambda logger, record: (records.append(record), handle(logger, record))[1]
    try:
        torch.compile(lambda x: torch.tan(x) - 3)(torch.randn(8))
    finally:
        logging.Logger.callHandlers = handle
    chatty = [f"{r.levelname} {r.name}: {r.getMessage()[:80]}" for r in records
              if r.name != "torch.__trace" and r.levelno < logging.WARNING]
    assert not chatty, chatty


def test_environment_is_restored_after_cold_caches():
    assert {n: os.environ.get(n) for n in ENV_BEFORE} == ENV_BEFORE


def test_deliberate_failure_shows_the_table(cold_cache):
    torch.compile(double_sin)(torch.randn(8))
    cold_cache.assert_hits(fx_graph=1, aot_autograd=1)
'''


@pytest.mark.parametrize("mode", [pytest.param([], id="plain"),  # the compat tier: torch is reached the same way
                                  pytest.param(["-n", "2"], id="n2", marks=[pytest.mark.compat, pytest.mark.core])])
@pytest.mark.slow
def test_cold_cache_isolates_counts_and_restores(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], default_dir_of: Path, mode: list[str]
) -> None:
    pytester.makepyfile(test_inner=INNER)
    # Serial, a fresh process: the plugin loaded before torch, as in a project that imports torch in
    # its tests only; the -n 2 workers are forked from a process that has imported torch.
    result = run_inner(*mode, "-p", "no:cacheprovider", fresh=not mode)
    result.assert_outcomes(passed=7, failed=1)
    out = result.stdout.str()
    assert "compile cache hits differ: fx_graph expected 1, got 0; aot_autograd expected 1, got 0" in out
    assert "0 (expected 1)" in out
    assert not default_dir_of.exists(), f"the run created the shared default dir {default_dir_of}"
    leftovers = [p.name for p in default_dir_of.parent.iterdir() if p.name.startswith("pytest-compilecache-")]
    assert leftovers == [], "per-process cache roots must be removed at the end"


def test_force_disable_variables_are_reported(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    pytester.makepyfile(
        test_inner="""
        import torch

        def test_disabled(cold_cache):
            torch.compile(lambda x: x * 3)(torch.randn(4))
            cold_cache.assert_misses(fx_graph=1)
        """
    )
    result = run_inner()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "compilecache: WARNING: TORCHINDUCTOR_FX_GRAPH_CACHE=0 disables the FX graph cache; "
            "cache assertions are meaningless",
            "*cache assertions are meaningless here:*",
            "*TORCHINDUCTOR_FX_GRAPH_CACHE=0 disables the FX graph cache*",
        ]
    )


@pytest.mark.slow
def test_isolate_option_gives_every_test_its_own_dir(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], default_dir_of: Path
) -> None:
    pytester.makepyfile(
        test_inner="""
        import os
        import torch
        from torch._dynamo.utils import counters

        SEEN = set()

        def compile_and_count():
            before = counters["inductor"]["fxgraph_cache_miss"]
            torch.compile(lambda x: x.cos() + 1)(torch.randn(4))
            return counters["inductor"]["fxgraph_cache_miss"] - before

        def test_a():
            SEEN.add(os.environ["TORCHINDUCTOR_CACHE_DIR"])
            assert compile_and_count() == 1

        def test_b():
            SEEN.add(os.environ["TORCHINDUCTOR_CACHE_DIR"])
            assert compile_and_count() == 1

        def test_c():
            SEEN.add(os.environ["TORCHINDUCTOR_CACHE_DIR"])
            assert compile_and_count() == 1
            assert len(SEEN) >= 2 or os.environ.get("PYTEST_XDIST_WORKER")
        """
    )
    result = run_inner("-n", "2", ini="compile_cache_isolate = test")
    result.assert_outcomes(passed=3)
    assert not default_dir_of.exists(), f"the run created the shared default dir {default_dir_of}"
    result = run_inner("-p", "no:xdist", "--compile-cache-isolate")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["compilecache: isolation: a cache per test"])
    assert not default_dir_of.exists()


@pytest.mark.slow
def test_the_cpu_probes_are_kept_beside_the_headers_and_a_cold_test_first_finds_them_there(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """torch learns which vector instructions the CPU runs once a process, at its first C++ compile,
    by building six probe binaries in the cache folder of the moment (about 7 s where none are built,
    1.2 s where they are). A newcomer found a run's first ``cold_cache`` test paying the 7 s in every
    run, its folder empty by design; then the first run after a building run, whose warmup had built
    them in its own folder (the bundle carries them). They are kept beside the headers: linked there
    by the building run, found there by the next run's cold test, which builds none in its folder."""
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_a_cold="""
import torch

def test_cold_first(cold_cache):
    torch.compile(lambda x: torch.sinh(x) * 7)(torch.randn(8))
    built = sorted(p.name for p in cold_cache.path.rglob("*.so"))
    assert len(built) == 1, built  # the kernel, and no probe
""", test_b_warm="""
import torch
from conftest import f

def test_warm(warm_cache):
    torch.compile(f)(torch.randn(8))
""")
    headers = tmp_path / "headers"
    args = ("-o", f"compile_cache_headers_dir={headers}", "--compile-cache-bundle=b.bundle")
    built = run_inner(*args, "-k", "warm", fresh=True)
    built.assert_outcomes(passed=1, deselected=1)
    kept = {p: p.stat().st_mtime_ns for p in (headers / "cpu-probes").rglob("*.so")}
    assert kept, "the building run's probes were not kept beside the headers"
    # The bundle carries the probes too, but they are no test's kernel: a newcomer read "7 cpp" and
    # "7 carried" for a suite of one compiled kernel.
    built.stdout.fnmatch_lines(["*it holds 1 fx_graph, 1 aot_autograd, 1 cpp (*"])
    loaded = run_inner(*args, fresh=True)
    loaded.assert_outcomes(passed=2)
    loaded.stdout.fnmatch_lines(["*C++ binaries: 1 kernel carried, 1 fit this machine; and * CPU probes (*"])
    probes = int(loaded.stdout.str().split("fit this machine; and ")[1].split(" CPU probes")[0])
    # The command line counts the same two parts by the same names (a newcomer read 1, 2, 11 and 12).
    from pytest_compilecache.cli import main
    capsys.readouterr()
    assert main(["inspect", str(pytester.path / "b.bundle")]) == 0
    listed = capsys.readouterr().out
    assert f"(1 kernel, {probes} CPU probes)" in listed, listed
    assert main(["verify", str(pytester.path / "b.bundle")]) == 0
    verified = capsys.readouterr().out
    assert f"carried C++ binaries fit this machine (1 kernel, {probes} CPU probes)" in verified, verified
    assert {p: p.stat().st_mtime_ns for p in (headers / "cpu-probes").rglob("*.so")} == kept

    # A session with no bundle runs its warmup in a new folder every time: it places the kept probes
    # there before torch looks (a third newcomer's runs paid the 7 s in every such session).
    report = tmp_path / "probes.json"
    pytester.makeconftest(WARMUP_CONFTEST + f"""
import json, pathlib

def pytest_compilecache_warmup(cache):
    torch.compile(f)(torch.randn(8))
    kept = {{p.name: p.stat().st_ino for p in pathlib.Path({str(headers / "cpu-probes")!r}).rglob("*.so")}}
    placed = {{p.name: p.stat().st_ino == kept[p.name] for p in cache.path.rglob("*.so") if p.name in kept}}
    pathlib.Path({str(report)!r}).write_text(json.dumps(placed))
""")
    run_inner("-o", f"compile_cache_headers_dir={headers}", "-k", "warm", fresh=True).assert_outcomes(
        passed=1, deselected=1)
    placed = json.loads(report.read_text())
    assert placed and all(placed.values()), placed
