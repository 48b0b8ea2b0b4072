"""The hook a user's conftest implements to compile the suite's graphs once per session."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cache import CompileCache


def pytest_compilecache_warmup(cache: "CompileCache") -> None:
    """Compile whatever the suite needs, inside ``cache`` (an isolated cache already active).
    Runs at most once per session, only when the bundle is missing, does not match this machine, or
    ``--compile-cache-update`` is given; what it compiles is saved into the bundle (docs/bundles.md)."""
