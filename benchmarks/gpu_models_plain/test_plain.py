"""Each real model compiled by a plain test (no plugin), on whatever cache folder the environment names."""

import json
import os

import pytest

import models


def test_00_process_start_up():
    models.warm_up_process()


@pytest.mark.parametrize("name", models.MODELS)
def test_model(name):
    seconds = models.compile_and_run(name)
    if os.environ.get("GPU_MODELS_LOG"):
        with open(os.environ["GPU_MODELS_LOG"], "a") as f:
            f.write(json.dumps({"model": name, "seconds": seconds}) + "\n")
