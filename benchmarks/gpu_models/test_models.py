"""Each real model, warm from the bundle: every cache layer hits, autotuning included."""

import json
import os

import models
import pytest


def test_00_process_start_up():
    """As the kept folder's twin does: no fixture, so that both sides compile it from their cache
    (a ``cold_cache`` test here compiled it cold on the plugin's side alone)."""
    models.warm_up_process()


@pytest.mark.skipif(not os.environ.get("GPU_MODELS_COLD_MLP"), reason="GPU_MODELS_COLD_MLP is not set")
def test_01_cold_max_autotune_mlp(cold_cache):
    """A cold compile of the max-autotune MLP before the warm tests (it benchmarks, in its own folder)."""
    models.compile_and_run("mlp_max_autotune")


@pytest.fixture
def benchmarks(monkeypatch):
    """What autotuning measured and wrote during the test.

    Kernel timings taken by Triton's autotuner (``bench``: all configs, coordinate descent, combo
    kernels), the times it compared all configs, Inductor's GEMM autotuning, each kernel handed to
    coordinate descent (templates are handed over and return at once) and every autotune result saved (the kernel's file, the config, the function
    that asked). Not torch's ``coordesc_tuning_bench`` counter: an FX graph cache hit replays the
    counters of the compile that wrote the entry, so it reports the building run's benchmarks.
    """
    import sys

    from torch._inductor import select_algorithm
    from torch._inductor.runtime import autotune_cache, triton_heuristics

    counts = {"kernel_timings": 0, "triton_configs": 0, "gemm_choices": 0, "saves": []}

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

    counting(triton_heuristics.CachingAutotuner, "bench", "kernel_timings")
    counting(triton_heuristics.CachingAutotuner, "benchmark_all_configs", "triton_configs")
    counting(select_algorithm.AlgorithmSelectorCache, "make_benchmark_fn", "gemm_choices")
    save = autotune_cache.AutotuneCache.save

    def saving(self, config, time_taken_ns, *args, **kwargs):
        caller = sys._getframe(1)
        key = self.local_cache[1] if self.local_cache else "?"
        counts["saves"].append({"file": os.path.basename(str(key)), "caller": caller.f_code.co_name,
                                "found_by_coordesc": kwargs.get("found_by_coordesc", args[0] if args else None),
                                "config": str(config), "time_taken_ms": time_taken_ns // 1_000_000})
        return save(self, config, time_taken_ns, *args, **kwargs)

    monkeypatch.setattr(autotune_cache.AutotuneCache, "save", saving)
    counts["lookups"], counts["retuned"] = [], []
    check = triton_heuristics.check_autotune_cache

    def checking(configs, filename, inductor_meta):
        found = check(configs, filename, inductor_meta)
        counts["lookups"].append({"file": os.path.basename(str(filename)), "configs": len(configs),
                                  "coordesc": inductor_meta.get("coordinate_descent_tuning"),
                                  "disabled": inductor_meta.get("force_disable_caches"),
                                  "cache": found[1] is not None, "info": found[2].get("autotune_cache_state")})
        return found

    monkeypatch.setattr(triton_heuristics, "check_autotune_cache", checking)
    tune = triton_heuristics.CachingAutotuner.coordinate_descent_tuning

    def retuning(self, launcher, *args, **kwargs):
        counts["retuned"].append({"kernel": self.inductor_meta.get("kernel_name"),
                                  "file": os.path.basename(str(self.filename)),
                                  "heuristic": str(self.heuristic_type),
                                  "found_by_coordesc": getattr(launcher.config, "found_by_coordesc", None),
                                  "save_hook": self.save_cache_hook is not None and self.save_cache_hook is not False,
                                  "info": dict(getattr(self, "autotune_cache_info", {}) or {}),
                                  "static": self.is_statically_launchable()})
        return tune(self, launcher, *args, **kwargs)

    monkeypatch.setattr(triton_heuristics.CachingAutotuner, "coordinate_descent_tuning", retuning)
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
    assert not benchmarks["saves"] and stats.autotune.saved == 0, f"a warm test wrote autotune results: {line}"
    measured = (benchmarks["kernel_timings"], benchmarks["triton_configs"], benchmarks["gemm_choices"])
    assert measured == (0, 0, 0), f"a warm test benchmarked: {line}"
