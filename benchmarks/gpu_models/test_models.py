"""Each real model, warm from the bundle: every cache layer hits, autotuning included."""

import json
import os

import pytest

import models


def test_00_process_start_up(cold_cache):
    models.warm_up_process()


@pytest.mark.parametrize("name", models.MODELS)
def test_model_is_warm(warm_cache, name):
    seconds = models.compile_and_run(name)
    stats = warm_cache.stats
    line = {"model": name, "seconds": seconds, "autotune": stats.autotune.to_dict(),
            "fx_graph": stats.fx_graph.to_dict(), "triton": stats.triton.to_dict(), "cpp": stats.cpp.to_dict()}
    if os.environ.get("GPU_MODELS_LOG"):
        with open(os.environ["GPU_MODELS_LOG"], "a") as f:
            f.write(json.dumps(line) + "\n")
    warm_cache.assert_misses(fx_graph=0, aot_autograd=0, autotune=0)
