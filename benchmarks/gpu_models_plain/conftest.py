"""The GPU model suite as a user runs it without the plugin: a kept cache folder, Dynamo reset between tests."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu_models"))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    import torch

    torch._dynamo.reset()
    yield
