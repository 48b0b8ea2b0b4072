"""One plugin object per pytest process role (a run without xdist, an xdist worker, the xdist controller), chosen
once, each registering only the hooks it needs and delegating to :mod:`.life`, :mod:`.testside` and :mod:`.channel`."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Generator, Iterator, Union

import pytest

from .. import caught
from ..bundle.keyindex import KeyIndex
from ..report.model import Concern, Problem, ProcessReport
from ..channel import FromWorker, ToWorker
from .folders import Folders
from .life import Selection, SessionLife, open_bundle_store, teller
from .options import Options
from .testside import TestSide
from .preparation import died_in_warmup


@contextlib.contextmanager
def warnings_to_pytest(config: pytest.Config) -> Iterator[None]:
    """Capture warnings inside (preparing or saving a bundle) as pytest captures a test's, with the user's filters,
    for pytest's ``pytest_warning_recorded``; with ``-p no:warnings``, leave them to Python, as pytest does."""
    if config.pluginmanager.is_blocked("warnings"):
        yield
        return
    from _pytest.warnings import catch_warnings_for_item  # pytest's own, as for a test (every pytest >= 7.4)

    with catch_warnings_for_item(config, ihook=config.hook, when="runtest", item=None):
        yield


class _RunsTests:
    """The hooks of the roles that run tests; each role adds its own beginning and end."""

    #: Why strict mode stops the run before any test (:meth:`_stop` says how), or ``None``.
    strict_failure: str | None = None

    def __init__(self, config: pytest.Config, options: Options, side: TestSide) -> None:
        self.config, self.options, self.side = config, options, side
        self.selection = Selection(config)

    def start(self, plugins: pytest.PytestPluginManager) -> None:
        """Register this role's hooks; set the process's environment up (see :meth:`TestSide.configure`)."""
        plugins.register(self, "compilecache-role")
        plugins.register(self.selection, "compilecache-selection")
        self.side.configure()

    def close(self) -> None:
        """Restore the environment and remove this process's folders."""
        self.side.close()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        with warnings_to_pytest(self.config):
            self.strict_failure = self.side.bundle.prepare_for(session)
        if self.strict_failure:
            self._stop(session, self.strict_failure)

    def _stop(self, session: pytest.Session, failure: str) -> None:
        raise NotImplementedError

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.strict_failure:
            pytest.fail(self.strict_failure, pytrace=False)
        self.side.runtest_setup(item)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode) -> None:
        """Each role's end of the session, with its warnings in pytest's summary."""
        with warnings_to_pytest(self.config):
            process = self.side.bundle.finish()
            process.left_out = self.selection.left_out()
            self._finish(session, exitstatus, process, self.side.bundle.own_artifacts(process))

    def _finish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode, process: ProcessReport,
                own: tuple[bytes, KeyIndex] | None) -> None:
        raise NotImplementedError

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report = yield
        self.side.makereport(item, call, report)
        return report


class SingleProcess(_RunsTests):
    """A pytest run without xdist."""

    def __init__(self, config: pytest.Config, options: Options) -> None:
        run, store = time.time(), open_bundle_store(options)
        side = TestSide(config, options, Folders(config), "main", run, store, lambda: self.life.at_start,
                        teller(config))
        super().__init__(config, options, side)
        self.life = SessionLife(config, options, store, run, side.folders, side)

    def start(self, plugins: pytest.PytestPluginManager) -> None:
        """As every role that runs tests, and the session's report beside it."""
        super().start(plugins)
        plugins.register(self.life, "compilecache-collector")

    def _stop(self, session: pytest.Session, failure: str) -> None:
        raise pytest.UsageError(failure)

    def _finish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode, process: ProcessReport,
                own: tuple[bytes, KeyIndex] | None) -> None:
        env = process.env
        self.life.finish(session, exitstatus, [process], [(env, *own)] if own and env else [])


class Worker(_RunsTests):
    """An xdist worker: runs tests, then hands its artifacts and bundle story to the controller."""

    def __init__(self, config: pytest.Config, options: Options) -> None:
        told = ToWorker.get(config.workerinput)  # type: ignore[attr-defined]
        folders = Folders(config, Path(told.shared) if told.shared else None)
        store = open_bundle_store(options, told.store_unreachable)
        process = str(config.workerinput.get("workerid", "worker"))  # type: ignore[attr-defined]
        self._caught_before = caught.counts()
        super().__init__(config, options, TestSide(config, options, folders, process, told.run, store,
                                                   lambda: told.at_start))

    def _stop(self, session: pytest.Session, failure: str) -> None:
        session.shouldstop = failure

    def _finish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode, process: ProcessReport,
                own: tuple[bytes, KeyIndex] | None) -> None:
        process.caught = caught.since(self._caught_before)
        FromWorker(process, own).put(self.config.workeroutput,  # type: ignore[attr-defined]
                                     self.side.folders.shared)


class Controller:
    """The xdist controller: runs no test; checks PATH first, merges every worker's artifacts once."""

    side = None

    def __init__(self, config: pytest.Config, options: Options) -> None:
        self.config, self.options = config, options
        self.folders = Folders(config)
        self.store = open_bundle_store(options)
        self.life = SessionLife(config, options, self.store, time.time(), self.folders)
        self.processes: list[ProcessReport] = []
        self.artifacts: list[tuple[dict[str, str], bytes, KeyIndex | None]] = []
        self._died_in_warmup: dict[str, str] = {}
        self._died: list[str] = []

    def start(self, plugins: pytest.PytestPluginManager) -> None:
        """Register this role's hooks and the session's report (it runs no test: it redirects nothing)."""
        plugins.register(self, "compilecache-role")
        plugins.register(self.life, "compilecache-collector")

    def close(self) -> None:
        """Remove the shared folder."""
        self.folders.remove(keep_root=False)

    def pytest_configure_node(self, node: Any) -> None:
        """Tell a new worker what :class:`ToWorker` holds."""
        ToWorker(str(self.folders.shared), self.life.at_start, self.life.run,
                 self.store.unreachable if self.store is not None else "").put(node.workerinput)

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """Collect a worker's bundle story; for a worker that died in the warmup, say so."""
        told = FromWorker.get(getattr(node, "workeroutput", {}))
        if told is not None:
            self.processes.append(told.process)
            if told.own is not None and told.process.env:
                self.artifacts.append((told.process.env, *told.own))
        if error is not None:
            worker = str(node.gateway.id)
            self._died.append(worker)
            if why := died_in_warmup(self.folders.shared / "warmup-done", worker):
                self._died_in_warmup[worker] = why
                self.life.report.problems.append(Problem(Concern.WARMUP, why))

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """xdist blames the test it had handed a dead worker; say when the warmup killed it instead."""
        node = getattr(report, "node", None)
        if why := self._died_in_warmup.get(str(node.gateway.id)) if node is not None else None:
            report.longrepr = f"{report.longrepr}\ncompilecache: {why}; this test had not started"

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode) -> None:
        with warnings_to_pytest(self.config):
            died = (f"a worker died ({', '.join(self._died)}), so what its tests used is not known"
                    if self._died else "")
            self.life.finish(session, exitstatus, self.processes, self.artifacts, died)


Role = Union["SingleProcess", "Worker", "Controller"]


def choose_role(config: pytest.Config, options: Options) -> Role:
    """This process's role, chosen once as pytest-cov and xdist tell it: a worker, the controller, or a plain run."""
    if hasattr(config, "workerinput"):
        return Worker(config, options)
    if config.pluginmanager.hasplugin("xdist") and not config.option.collectonly \
            and getattr(config.option, "dist", "no") != "no" and getattr(config.option, "tx", None):
        elsewhere = [spec for spec in config.option.tx if "ssh=" in spec or "socket=" in spec]
        if elsewhere and options.has_bundle:
            raise pytest.UsageError(
                f"--tx {elsewhere[0]}: --compile-cache-bundle needs every worker on this machine (they share its "
                "folders: the warmup's lock, the pool of binaries); run them here (-n N), or without a bundle")
        return Controller(config, options)
    return SingleProcess(config, options)
