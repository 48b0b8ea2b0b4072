"""The pytest hooks and fixtures; each delegates to the session object kept in ``config.stash``."""

from __future__ import annotations

import shutil
from typing import Any, Generator, Iterator

import pytest

from . import _torchapi, hooks
from .cache import CompileCache
from .session import CompileCacheSession, ControllerSession, make_session

_SESSION = pytest.StashKey[CompileCacheSession]()
_REPORT_ATTR = "compilecache"


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("compilecache", "torch.compile cache isolation and bundles (pytest-compilecache)")

    def option(name: str, ini_type: str | None, help: str, **kwargs: Any) -> None:
        dest = name.replace("-", "_")
        group.addoption(f"--{name}", dest=dest, default=None, help=f"{help} (ini: {dest})", **kwargs)
        parser.addini(dest, help=help, type=ini_type)  # type: ignore[arg-type]

    option("compile-cache-isolate", "bool", "give every test its own empty torch.compile cache directories",
           action="store_true")
    option("compile-cache-bundle", "string", "Mega-Cache bundle to load at session start and save at the end "
           "(env: PYTEST_COMPILE_CACHE_BUNDLE)", metavar="PATH")
    option("compile-cache-update", "bool", "merge this session's artifacts into an existing bundle",
           action="store_true")
    option("compile-cache-strict", "bool", "fail the session when the bundle cannot be loaded or saved",
           action="store_true")
    option("compile-cache-lock-timeout", "string", "seconds to wait for the bundle lock (default 900)",
           metavar="SECONDS", type=float)
    option("compile-cache-report", "string", "write per-test and total cache counts as JSON to FILE",
           metavar="FILE")
    parser.addini("compile_cache_headers_dir", default="",
                  help="folder for precompiled C++ headers, shared by all tests and runs (default: in .pytest_cache)")


def pytest_configure(config: pytest.Config) -> None:
    session = make_session(config)
    config.stash[_SESSION] = session
    session.configure()
    if session.options.isolate_all:
        config.pluginmanager.register(_IsolateEveryTest(), "compilecache-isolate-all")
    if session.options.active:
        config.pluginmanager.register(_CountEveryTest(session), "compilecache-count")


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is not None:
        session.close()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_SESSION].sessionstart()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    cc = node.config.stash[_SESSION]
    if isinstance(cc, ControllerSession):
        cc.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    cc = node.config.stash[_SESSION]
    if isinstance(cc, ControllerSession):
        cc.node_down(node)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    cc = session.config.stash[_SESSION]
    cc.finish()
    status = cc.exit_status()
    if status is not None and session.exitstatus == 0:
        session.exitstatus = status


def pytest_report_header(config: pytest.Config) -> list[str]:
    return config.stash[_SESSION].header()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    lines = config.stash[_SESSION].summary()
    if lines:
        terminalreporter.section("compilecache")
        for line in lines:
            terminalreporter.write_line(line)


def _isolated(request: pytest.FixtureRequest, kind: str) -> Iterator[CompileCache]:
    session = request.config.stash[_SESSION]
    cache = session.new_cache(request.node.nodeid, kind)
    try:
        if kind == "warm":
            template = session.warm_template()
            if template is None:
                report = session.preparer_report
                pytest.skip(
                    f"warm_cache needs a usable bundle ({report.status}: {report.reason}); get one with "
                    "--compile-cache-bundle=PATH after a run that builds it, or a pytest_compilecache_warmup hook"
                )
            shutil.copytree(template, cache.path, dirs_exist_ok=True)
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


@pytest.fixture
def warm_cache(request: pytest.FixtureRequest) -> Iterator[CompileCache]:
    """An isolated torch.compile cache already filled from the session's bundle.

    Skipped, with a reason, when the session has no usable bundle.
    """
    yield from _isolated(request, "warm")


class _IsolateEveryTest:
    """Registered only with ``--compile-cache-isolate``: an isolated cache around every test."""

    @pytest.fixture(autouse=True)
    def _compile_cache_isolation(self, request: pytest.FixtureRequest) -> Iterator[CompileCache | None]:
        if "cold_cache" in request.fixturenames or "warm_cache" in request.fixturenames:
            yield None
        else:
            yield from _isolated(request, "cold")


class _CountEveryTest:
    """Registered only when isolation, a bundle or a report is on: per-test counts on the reports."""

    def __init__(self, session: CompileCacheSession) -> None:
        self.session = session

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.session.test_started(item.nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report = yield
        if call.when == "teardown":
            stats = self.session.test_finished(item.nodeid)
            if stats is not None:
                setattr(report, _REPORT_ATTR, stats)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        stats = getattr(report, _REPORT_ATTR, None)
        if stats is not None and report.when == "teardown":
            self.session.add_test_report(report.nodeid, stats)
