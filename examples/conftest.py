"""The examples suite's conftest: the warmup that compiles every graph the suite uses, once per session."""

from __future__ import annotations

import pytest
from models import run_dynamic, run_inference, run_mlp_no_grad, run_training_step


@pytest.hookimpl(optionalhook=True)  # the suite still runs with -p no:compilecache
def pytest_compilecache_warmup(cache) -> None:  # type: ignore[no-untyped-def]
    """Compile every graph the suite uses, once per session; the bundle then carries them."""
    run_inference()
    run_training_step()
    run_mlp_no_grad()
    run_dynamic()
