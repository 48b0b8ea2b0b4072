"""Each real model, warm from the bundle: every cache layer hits, autotuning included."""

import json
import os

import pytest

import models


def test_00_process_start_up(cold_cache):
    models.warm_up_process()


@pytest.mark.skipif(not os.environ.get("GPU_MODELS_COLD_MLP"), reason="GPU_MODELS_COLD_MLP is not set")
def test_01_cold_max_autotune_mlp(cold_cache):
    """A cold compile of the max-autotune MLP before the warm tests (it benchmarks, in its own folder)."""
    models.compile_and_run("mlp_max_autotune")


@pytest.fixture
def benchmarks(monkeypatch):
    """How many times Triton's autotuner and Inductor's GEMM autotuning benchmark during the test."""
    from torch._inductor import select_algorithm
    from torch._inductor.runtime import triton_heuristics

    counts = {"triton_configs": 0, "gemm_choices": 0}

    def counting(owner, name, key):
        original = owner.__dict__.get(name)
        if original is None:
            counts[key] = -1  # not in this torch
            return
        function = original.__func__ if isinstance(original, (classmethod, staticmethod)) else original

        def wrapper(*args, **kwargs):
            counts[key] += 1
            return function(*args, **kwargs)

        kind = type(original) if isinstance(original, (classmethod, staticmethod)) else (lambda f: f)
        monkeypatch.setattr(owner, name, kind(wrapper))

    counting(triton_heuristics.CachingAutotuner, "benchmark_all_configs", "triton_configs")
    counting(select_algorithm.AlgorithmSelectorCache, "make_benchmark_fn", "gemm_choices")
    return counts


@pytest.mark.parametrize("name", models.MODELS)
def test_model_is_warm(warm_cache, benchmarks, name):
    seconds = models.compile_and_run(name)
    stats = warm_cache.stats
    line = {"model": name, "seconds": seconds, "benchmarks": dict(benchmarks), "autotune": stats.autotune.to_dict(),
            "fx_graph": stats.fx_graph.to_dict(), "triton": stats.triton.to_dict(), "cpp": stats.cpp.to_dict()}
    if os.environ.get("GPU_MODELS_LOG"):
        with open(os.environ["GPU_MODELS_LOG"], "a") as f:
            f.write(json.dumps(line) + "\n")
    warm_cache.assert_misses(fx_graph=0, aot_autograd=0, autotune=0)
