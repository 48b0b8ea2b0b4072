"""The fast tier's base: tests here run in this process, with no torch and no subprocess.

A test that imports torch, or starts a process, belongs in ``tests/`` beside the end-to-end tests."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, Iterator

import pytest


@pytest.fixture(scope="session")
def _torch_compiler_imported_before_pytester() -> None:
    """Overrides the suite's: a unit test uses no pytester and no torch, so nothing is imported first."""


@pytest.fixture(autouse=True)
def _no_torch_no_subprocess(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a unit test starts no process: move it to tests/")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    torch_before = "torch" in sys.modules
    yield
    if not torch_before:
        assert "torch" not in sys.modules, "a unit test imports no torch: move it to tests/"
