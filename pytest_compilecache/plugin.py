"""The pytest hooks and fixtures; each delegates to the session object kept in ``config.stash``."""

from __future__ import annotations

from typing import Iterator

import pytest

from . import _torchapi
from .cache import CompileCache
from .session import CompileCacheSession

_SESSION = pytest.StashKey[CompileCacheSession]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("compilecache", "torch.compile cache isolation and bundles (pytest-compilecache)")
    group.addoption(
        "--compile-cache-isolate",
        action="store_true",
        default=None,
        dest="compile_cache_isolate",
        help="give every test its own empty torch.compile cache directories (ini: compile_cache_isolate)",
    )
    parser.addini(
        "compile_cache_isolate",
        type="bool",
        default=False,
        help="give every test its own empty torch.compile cache directories",
    )
    parser.addini(
        "compile_cache_headers_dir",
        default="",
        help="folder for precompiled C++ headers, shared by all tests and runs (default: in .pytest_cache)",
    )


def pytest_configure(config: pytest.Config) -> None:
    session = CompileCacheSession(config)
    config.stash[_SESSION] = session
    session.start()
    if session.isolate_all:
        config.pluginmanager.register(_IsolateEveryTest(), "compilecache-isolate-all")


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is not None:
        session.close()


def pytest_report_header(config: pytest.Config) -> list[str]:
    return config.stash[_SESSION].header()


def _isolated(request: pytest.FixtureRequest, kind: str) -> Iterator[CompileCache]:
    session = request.config.stash[_SESSION]
    try:
        cache = session.new_cache(request.node.nodeid, kind)
        cache.__enter__()
    except _torchapi.TorchUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cache
    finally:
        cache.__exit__(None, None, None)


@pytest.fixture
def cold_cache(request: pytest.FixtureRequest) -> Iterator[CompileCache]:
    """An empty, isolated torch.compile cache for this test; see :class:`CompileCache`."""
    yield from _isolated(request, "cold")


class _IsolateEveryTest:
    """Registered only with ``--compile-cache-isolate``: an isolated cache around every test."""

    @pytest.fixture(autouse=True)
    def _compile_cache_isolation(self, request: pytest.FixtureRequest) -> Iterator[CompileCache | None]:
        if "cold_cache" in request.fixturenames or "warm_cache" in request.fixturenames:
            yield None
        else:
            yield from _isolated(request, "cold")
