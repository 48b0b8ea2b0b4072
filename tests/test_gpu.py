"""GPU: Triton and autotune layers with real kernels. Skipped where torch sees no CUDA device.

Run on a GPU machine with ``scripts/gpu-tests.sh``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is visible to torch"),
]

CONFTEST = '''
import os
import torch

def pointwise(x):
    return torch.nn.functional.gelu(x) * torch.sigmoid(x) + 1

def matmul_relu(a, b):
    return torch.relu(a @ b)

import triton.runtime.build

_build = triton.runtime.build._build


def _counted_build(name, *args, **kwargs):
    """Triton compiling one of its C modules (the driver's helpers, a launcher) with the system compiler."""
    with open(os.environ["WARMUP_LOG"] + ".builds", "a") as f:
        f.write(f"{name} in {os.environ.get('PYTEST_CURRENT_TEST', 'no test')}\\n")
    return _build(name, *args, **kwargs)


triton.runtime.build._build = _counted_build


def pytest_compilecache_warmup(cache):
    with open(os.environ["WARMUP_LOG"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    torch.compile(pointwise)(torch.randn(1024, device="cuda"))
    a = torch.randn(256, 256, device="cuda")
    torch.compile(matmul_relu, mode="max-autotune-no-cudagraphs")(a, a)
'''

TESTS = '''
import os
import torch
from conftest import matmul_relu, pointwise

def test_warm_triton_kernels_come_from_the_bundle(warm_cache):
    torch.compile(pointwise)(torch.randn(1024, device="cuda"))
    warm_cache.assert_misses(fx_graph=0)
    warm_cache.assert_hits(fx_graph=1)
    assert warm_cache.stats.triton.hits >= 1, warm_cache.stats.table()

def test_warm_max_autotune_hits_from_the_bundle(warm_cache):
    a = torch.randn(256, 256, device="cuda")
    torch.compile(matmul_relu, mode="max-autotune-no-cudagraphs")(a, a)
    warm_cache.assert_misses(fx_graph=0)
    warm_cache.assert_hits(fx_graph=1)
    print("\\nAUTOTUNE", warm_cache.stats.autotune.to_dict(), "TRITON", warm_cache.stats.triton.to_dict())
    autotune = warm_cache.stats.autotune  # every result found came from the bundle (a newcomer read from_bundle 0)
    assert autotune.from_bundle == autotune.hits, warm_cache.stats.table()

def test_cold_triton_compiles_then_hits_its_own_dir(cold_cache):
    assert os.environ["TRITON_CACHE_DIR"] == str(cold_cache.path / "triton")
    torch.compile(pointwise)(torch.randn(1024, device="cuda"))
    cold_cache.assert_misses(fx_graph=1)
    assert cold_cache.stats.triton.observable and cold_cache.stats.autotune.observable
    assert cold_cache.stats.triton.saved >= 1, cold_cache.stats.table()
    assert any((cold_cache.path / "triton").rglob("*.cubin")), "Triton wrote outside the test's own dir"
    cold_cache.reset_in_memory()
    torch.compile(pointwise)(torch.randn(1024, device="cuda"))
    cold_cache.assert_hits(fx_graph=1, aot_autograd=1)
'''


@pytest.mark.parametrize("mode", [[], ["-n", "2"]], ids=["plain", "n2"])
def test_gpu_cold_and_warm(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], monkeypatch: pytest.MonkeyPatch,
    default_dir_of: Path, mode: list[str],
) -> None:
    log = pytester.path / "warmups.log"
    monkeypatch.setenv("WARMUP_LOG", str(log))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_gpu_inner=TESTS)
    bundle = pytester.path / "gpu.bundle"
    report = pytester.path / "report.json"
    args = [*mode, "-s", f"--compile-cache-bundle={bundle}", f"--compile-cache-report={report}"]
    first = run_inner(*args)
    first.assert_outcomes(passed=3)
    assert len(log.read_text().split()) == 1
    from pytest_compilecache.bundle.format import read_manifest

    with read_manifest(bundle) as saved:
        saved.read_all()
    carried = {path for _, path in (saved.entries[0].binaries.files if saved.entries[0].binaries else {})}
    assert any(p.startswith("triton/") for p in carried), "Triton's own kernel cache is carried"
    assert any(p.startswith("cache/") for p in carried), "the max-autotune GEMM timings are carried"
    builds = Path(f"{log}.builds")
    assert builds.exists(), "the building run compiled Triton's C modules (this check can see them)"
    builds.unlink()
    second = run_inner(*args)
    second.assert_outcomes(passed=3)
    assert len(log.read_text().split()) == 1
    lines = builds.read_text().splitlines() if builds.exists() else []
    rebuilt = [line for line in lines if "::test_cold_" not in line]  # PYTEST_CURRENT_TEST names the test
    assert not rebuilt, f"Triton compiled its C modules again outside a cold_cache test: {rebuilt}"
    env = json.loads(report.read_text())["bundle"]["processes"][0]["env"]
    assert env["device"].startswith("NVIDIA") and env["triton"] != "none"
    assert not default_dir_of.exists()


FORK_TEST = '''
import multiprocessing
import torch


def _child(queue):
    queue.put(float(torch.ones(4, device="cuda").sum().item()))


def test_a_forked_child_can_use_cuda():
    assert not torch.cuda.is_initialized(), "CUDA was initialised before the test started"
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(queue,))
    child.start()
    child.join(120)
    assert child.exitcode == 0, "the forked child could not use CUDA"
    assert queue.get(timeout=5) == 4.0


def test_compiling_with_the_plugin_still_works(cold_cache):
    torch.compile(lambda x: x.sin() + 1)(torch.randn(8, device="cuda"))
    cold_cache.assert_misses(fx_graph=1)


def test_a_compile_outside_any_fixture_goes_into_the_bundle():
    torch.compile(lambda x: x.cos() * 2)(torch.randn(8, device="cuda"))
'''


@pytest.mark.parametrize("mode", [["bundle"], ["--compile-cache-isolate", "-n", "2", "--dist", "loadfile"]],
                         ids=["bundle", "isolate-n2"])
def test_the_plugin_never_initialises_cuda(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], mode: list[str]
) -> None:
    """Issue 8 item 4: after the plugin started (fingerprint, bundle load, stats), a test can fork and use CUDA.

    The bundle runs twice: the first writes PATH (from the compile outside any fixture: cold_cache
    compiles are never saved), the second loads it before the tests. No warmup hook: a compile in
    the test process initialises CUDA itself (torch's key reads the device).
    """
    pytester.makepyfile(test_fork=FORK_TEST)
    bundle = pytester.path / "x.bundle"
    args = mode if mode != ["bundle"] else [f"--compile-cache-bundle={bundle}"]
    for _ in range(2 if mode == ["bundle"] else 1):
        result = run_inner(*args, "-p", "no:randomly", "-rs")
        result.assert_outcomes(passed=3)
    if mode == ["bundle"]:
        result.stdout.fnmatch_lines(["*bundle: loaded*"])


WRAPPED = '''
import torch

def test_wrapped():
    f = torch.compile(lambda x: torch.relu(x) * 2 + 1, options={"cpp_wrapper": True})
    f(torch.randn(1024, device="cuda"))
'''


def test_a_cpp_wrapper_graph_never_fails_warm_and_updating_runs_drop_nothing(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    """A CUDA graph compiled with ``cpp_wrapper``. Where torch's C++ wrapper loads its kernels by their path in the
    building session's cache folder (torch 2.11 and earlier), the graph is left out of the bundle, said, and
    compiled again in each run (loaded from the bundle, it failed with "CUDA driver error: file not found"); else
    it hits. Either way the warm runs pass, and updating runs of the whole suite with
    ``compile_cache_max_unused_runs = 1`` drop none of its graph's artifacts."""
    pytester.makepyfile(test_wrapped=WRAPPED)
    bundle = pytester.path / "w.bundle"
    report = pytester.path / "r.json"
    args = (f"--compile-cache-bundle={bundle}", f"--compile-cache-report={report}")
    ini = "compile_cache_max_unused_runs = 1"
    built = run_inner(*args, ini=ini)
    built.assert_outcomes(passed=1)
    said = "not saved: 1 fx_graph and 1 aot_autograd compiled with cpp_wrapper"
    left_out = said in built.stdout.str()

    def counts(saved: dict[str, Any]) -> dict[str, int]:
        return {kind: n["count"] for kind, n in saved.get("artifacts", {}).items()}

    first = counts(json.loads(report.read_text())["bundle"]["saved"])
    graph = 0 if left_out else 1  # its AOTAutograd entry goes with it
    assert (first.get("inductor", 0), first.get("aot_autograd", 0)) == (graph, graph), (first, built.stdout.str())
    for _ in range(2):
        update = run_inner(*args, "--compile-cache-update", ini=ini)
        update.assert_outcomes(passed=1)
        assert (said in update.stdout.str()) == left_out
        saved = json.loads(report.read_text())["bundle"]["saved"]
        # An autotune result only a compile reads may go, when the graph hits; what the graph itself needs stays.
        assert set(saved.get("dropped_unused", {})) <= {"autotune"}, (saved, update.stdout.str())
        assert {k: n for k, n in counts(saved).items() if k != "autotune"} == \
            {k: n for k, n in first.items() if k != "autotune"}, (saved, first)
    (wrapped,) = json.loads(report.read_text())["tests"].values()
    if left_out:  # compiled again, Triton kernels and all
        assert wrapped["fx_graph"]["misses"] == 1 and wrapped["fx_graph"]["from_bundle"] == 0, wrapped
    else:
        assert wrapped["fx_graph"]["misses"] == 0 and wrapped["fx_graph"]["from_bundle"] >= 1, wrapped
        assert wrapped["triton"]["misses"] == 0, wrapped


def test_real_models_reload_with_no_autotune_miss(tmp_path: Path) -> None:
    """timm resnet18, a BERT and a max-autotune MLP: built in one run, warm in the next (a new process).

    The building run also compiles the MLP cold in a test of its own (autotuning in a second folder
    after the warmup's). Each warm test of the suite asserts ``fx_graph``, ``aot_autograd`` and
    ``autotune`` misses == 0, no benchmark (Triton configs, coordinate descent, GEMM choices) and
    no autotune result written, so the second run passing means every autotune lookup hit after
    the reload from disk and nothing was measured again.
    """
    pytest.importorskip("timm")
    pytest.importorskip("transformers")
    import os
    import subprocess
    import sys

    suite = Path(__file__).parent.parent / "benchmarks" / "gpu_models"
    bundle = tmp_path / "models.bundle"
    # No captured logs (torch's DEBUG lines would push the failing assertion out of the message);
    # each warm test's figures (what it measured, saved and looked up) are logged to a file instead.
    args = [sys.executable, "-m", "pytest", str(suite), "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
            "-p", "no:logging", "--tb=line", f"--compile-cache-bundle={bundle}", f"--rootdir={suite}"]
    for run in ("built", "reloaded"):
        log = tmp_path / f"{run}.jsonl"
        env = {**os.environ, "GPU_MODELS_COLD_MLP": "1" if run == "built" else "", "GPU_MODELS_LOG": str(log)}
        done = subprocess.run(args + [f"--compile-cache-report={tmp_path / run}.json"], capture_output=True,
                              text=True, timeout=900, env=env)
        figures = log.read_text() if log.exists() else "(no warm test logged its figures)"
        assert done.returncode == 0, (f"{run} run failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}\n"
                                      f"warm tests' figures:\n{figures[-8000:]}")
    tests = json.loads((tmp_path / "reloaded.json").read_text())["tests"]
    warm = {k: v for k, v in tests.items() if "is_warm" in k}
    assert len(warm) == 3
    assert all(v["autotune"]["misses"] == 0 and v["autotune"]["saved"] == 0 for v in warm.values()), warm
    assert sum(v["autotune"]["hits"] for v in warm.values()) > 0, warm
    assert all(v["autotune"]["from_bundle"] == v["autotune"]["hits"] for v in warm.values()), warm
