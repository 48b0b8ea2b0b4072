"""One plugin object per pytest process role, chosen once, each registering only the hooks it needs.

- :class:`SingleProcess`: a run without xdist; runs tests, loads or builds the bundle, saves, reports.
- :class:`Worker`: an xdist worker; runs tests, hands its artifacts and bundle story to the controller.
- :class:`Controller`: the xdist controller; checks PATH before workers start, merges once, reports.

Each delegates to services in modules of their own: :mod:`.life` (the session's start and end, for
the roles that report), :mod:`.testside` (what a process that runs tests does, its bundle in
:mod:`.preparation`) and :mod:`.channel` (what the controller and a worker tell each other).
"""

from __future__ import annotations


import os
import time
import uuid
from pathlib import Path
from typing import Any, Generator, Iterator, Union

import pytest

from .. import files
from .._torchapi import defaultdir
from ..cache import CacheKind, CompileCache
from ..environment import SavedEnv
from ..expect.hooks import Recorder
from ..report.model import Concern, Problem, ProcessReport
from .capture import warnings_to_pytest
from .channel import FromWorker, ToWorker
from .folders import Folders
from .life import SessionLife, teller
from .options import Options
from .progress import Progress
from .saving import read_index
from .start import open_bundle_store
from .testside import TestSide
from .warmup import died_in_warmup


class _RunsTests:
    """The hooks of the roles that run tests; each role adds its own beginning and end."""

    def __init__(self, config: pytest.Config, options: Options, side: TestSide) -> None:
        self.config = config
        self.options = options
        self.side = side
        self.recorder = Recorder.create(config, options.expect, options.expect_update, side.counts)
        self._default_before: tuple[Any, Any] | None = None

    def start(self, plugins: pytest.PytestPluginManager, saved: SavedEnv | None) -> None:
        """Register this role's hooks; before collection, point compiles outside fixtures at this
        process's own folder (``saved``: the environment from before the first conftest, if taken)."""
        plugins.register(self, "compilecache-role")
        if self.recorder is not None:
            plugins.register(self.recorder, "compilecache-expect-recorder")
        self.side.configure(saved)
        if self.options.session_wide:
            folders = self.side.folders
            self._default_before = defaultdir.send_to(lambda: str(folders.process), str(self.options.headers_dir))

    def open_cache(self, request: pytest.FixtureRequest, kind: CacheKind) -> Iterator[CompileCache]:
        """The body of the ``cold_cache`` and ``warm_cache`` fixtures."""
        yield from self.side.open_cache(request, kind)

    def isolate(self, request: pytest.FixtureRequest) -> Iterator[CompileCache | None]:
        """The body of per-test isolation (``None`` for a test that starts before torch is imported)."""
        yield from self.side.isolate(request)

    def close(self) -> None:
        """Restore the environment and remove this process's folders."""
        if self._default_before is not None:
            defaultdir.send_to(*self._default_before)
        self.side.close()
        self.side.folders.remove(keep_root=True)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.side.runtest_setup(item)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Each role's end of the session, with its warnings in pytest's summary."""
        with warnings_to_pytest(self.config):
            self._finish(session)

    def _finish(self, session: pytest.Session) -> None:
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
        progress = Progress.of_store(config, store)
        side = TestSide(config, options, Folders(config), "main", run, store, lambda: self.life.at_start, progress,
                        teller(config))
        super().__init__(config, options, side)
        self.life = SessionLife(config, options, store, run, progress, self.recorder)

    def start(self, plugins: pytest.PytestPluginManager, saved: SavedEnv | None) -> None:
        """As every role that runs tests, and the session's collector and keeper beside it."""
        super().start(plugins, saved)
        self.life.register(plugins)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """The session's checks before any test (not in runs that only collect)."""
        if not self.config.option.collectonly:
            self.life.start(self.side.folders.process)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        with warnings_to_pytest(self.config):
            failure = self.side.bundle.prepare_for(session)
        if failure:
            raise pytest.UsageError(failure)

    def _finish(self, session: pytest.Session) -> None:
        process = self.side.bundle.finish()
        own = self.side.bundle.own_artifacts(process)
        env = process.env
        self.life.finish(session, [process], [(env, *own)] if own and env else [], self.side.folders.shared / "binaries")

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return self.life.header(self.side.bundle.process_report)


class Worker(_RunsTests):
    """An xdist worker: runs tests, then hands its artifacts and bundle story to the controller."""

    def __init__(self, config: pytest.Config, options: Options) -> None:
        told = ToWorker.get(config.workerinput)  # type: ignore[attr-defined]
        folders = Folders(config, Path(told.shared) if told.shared else None)
        store = open_bundle_store(options, told.store_unreachable)
        process = str(config.workerinput.get("workerid", "worker"))  # type: ignore[attr-defined]
        super().__init__(config, options, TestSide(config, options, folders, process, told.run, store,
                                                   lambda: told.at_start))
        self.strict_failure: str | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        with warnings_to_pytest(self.config):
            self.strict_failure = self.side.bundle.prepare_for(session)
        if self.strict_failure:
            session.shouldstop = self.strict_failure

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.strict_failure:
            pytest.fail(self.strict_failure, pytrace=False)
        self.side.runtest_setup(item)

    def _finish(self, session: pytest.Session) -> None:
        process = self.side.bundle.finish()
        own = self.side.bundle.own_artifacts(process)
        if own is not None:
            name = f"{os.getpid()}-{uuid.uuid4().hex}"
            path = self.side.folders.shared / f"artifacts-{name}.bin"
            files.write_atomic(path, own[0], fsync=False)
            process.artifacts_file = str(path)
            index = self.side.folders.shared / f"index-{name}.bin"
            files.write_atomic(index, own[1].pack(), fsync=False)
            process.index_file = str(index)
        FromWorker(process).put(self.config.workeroutput)  # type: ignore[attr-defined]


class Controller:
    """The xdist controller: runs no test; checks PATH first, merges every worker's artifacts once."""

    def __init__(self, config: pytest.Config, options: Options) -> None:
        self.config = config
        self.options = options
        self.folders = Folders(config)
        self.store = open_bundle_store(options)
        progress = Progress.of_store(config, self.store)
        self.life = SessionLife(config, options, self.store, time.time(), progress, None)
        self.processes: list[ProcessReport] = []
        self._died_in_warmup: dict[str, str] = {}

    def start(self, plugins: pytest.PytestPluginManager, saved: SavedEnv | None) -> None:
        """Register this role's hooks, the session's collector and keeper; the controller runs no test,
        so it redirects nothing."""
        plugins.register(self, "compilecache-role")
        self.life.register(plugins)

    def open_cache(self, request: pytest.FixtureRequest, kind: CacheKind) -> Iterator[CompileCache]:
        """Never called: the controller runs no test."""
        raise RuntimeError("the xdist controller runs no tests")

    def isolate(self, request: pytest.FixtureRequest) -> Iterator[CompileCache | None]:
        """Never called: the controller runs no test."""
        raise RuntimeError("the xdist controller runs no tests")

    def close(self) -> None:
        """Remove the shared folder."""
        self.folders.remove(keep_root=False)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """The session's checks, before workers start."""
        self.life.start(self.folders.process)

    def pytest_configure_node(self, node: Any) -> None:
        """Tell a new worker where the session's shared folder is, what the bundle was at start, and
        whether its store stopped answering."""
        ToWorker(str(self.folders.shared), self.life.at_start, self.life.run,
                 self.store.unreachable if self.store is not None else "").put(node.workerinput)

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """Collect a worker's bundle story; for a worker that died in the warmup, say so."""
        told = FromWorker.get(getattr(node, "workeroutput", {}))
        if told is not None:
            self.processes.append(told.process)
        if error is not None:
            worker = str(node.gateway.id)
            why = died_in_warmup(self.folders.shared / "warmup-done", worker)
            if why:
                self._died_in_warmup[worker] = why
                self.life.report.problems.append(Problem(Concern.WARMUP, why))

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """xdist blames the test it had handed a dead worker; say when the warmup killed it instead."""
        node = getattr(report, "node", None)
        why = self._died_in_warmup.get(str(node.gateway.id)) if node is not None else None
        if why:
            report.longrepr = f"{report.longrepr}\ncompilecache: {why}; this test had not started"

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        with warnings_to_pytest(self.config):
            artifacts = [(process.env, Path(process.artifacts_file).read_bytes(), read_index(process.index_file))
                         for process in self.processes
                         if process.artifacts_file and process.env and os.path.exists(process.artifacts_file)]
            self.life.finish(session, self.processes, artifacts, self.folders.shared / "binaries")

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return self.life.header(None)


#: The plugin object of this process's role.
Role = Union["SingleProcess", "Worker", "Controller"]


def choose_role(config: pytest.Config, options: Options) -> Role:
    """This process's role, chosen once: an xdist worker (told as pytest-cov tells it), the controller, or
    a run without xdist."""
    if hasattr(config, "workerinput"):
        return Worker(config, options)
    if is_controller(config):
        return Controller(config, options)
    return SingleProcess(config, options)


def is_controller(config: pytest.Config) -> bool:
    """Whether xdist will distribute this run, decided as xdist decides it."""
    if not config.pluginmanager.hasplugin("xdist") or config.option.collectonly:
        return False
    return getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None))
