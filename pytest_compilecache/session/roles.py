"""One plugin object per pytest process role, chosen once, each registering only the hooks it needs.

- :class:`SingleProcess`: a run without xdist; runs tests, loads or builds the bundle, saves, reports.
- :class:`Worker`: an xdist worker; runs tests, hands its artifacts and bundle story to the controller.
- :class:`Controller`: the xdist controller; checks PATH before workers start, merges once, reports.

Each delegates to services in modules of their own: :mod:`.start` (checks before any test),
:mod:`.testside` (what a process that runs tests does), :mod:`.preparation` (its bundle), :mod:`.saving` (the end of the session) and
:mod:`.collector` (per-test counts and the summary, beside the single process and the controller).
"""


import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Generator, Iterator, Union

import pytest

from .. import files
from .._torchapi import defaultdir
from ..cache import CacheKind, CompileCache
from ..environment import SavedEnv
from ..expect.hooks import Keeper, Recorder
from ..report.model import Concern, Problem, ProcessReport, SessionReport
from .capture import warnings_to_pytest
from .collector import Collector
from .folders import Folders
from .options import Options
from .progress import Progress
from .saving import Saver, exit_status, read_index, write_json
from .start import check_at_start, check_remote, describe, header_lines, open_bundle_store
from .testside import TestSide
from .warmup import died_in_warmup

WORKER_OUTPUT_KEY = "compilecache"

#: When the plugin was loaded (before conftests import torch): the first session of a process counts
#: its wall clock from here; a later one in the same process (an in-process ``pytester`` run) from its own start.
_LOADED: float | None = time.time()


def _session_started() -> float:
    """When this session began, as the user's clock sees it (see ``_LOADED``)."""
    global _LOADED
    started, _LOADED = _LOADED or time.time(), None
    return started


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

    def start(self, plugins: pytest.PytestPluginManager, saved: SavedEnv | None) -> None:
        """As every role that runs tests, and the summary's collector beside it."""
        super().start(plugins, saved)
        plugins.register(self.collector, "compilecache-collector")
        if self.keeper is not None:
            plugins.register(self.keeper, "compilecache-expect-keeper")

    def __init__(self, config: pytest.Config, options: Options) -> None:
        self.run = time.time()
        self.store = open_bundle_store(options)
        super().__init__(config, options, TestSide(config, options, Folders(config), "main", self.run, self.store))
        self.report = SessionReport(bundle_path=options.bundle_name, started=_session_started())
        self.collector = Collector(options, self.report)
        self.keeper = Keeper.create(config, options.expect, options.expect_update, self.recorder)
        self.report.bundle_at_start, self.side.bundle.existed, self.side.bundle.problem = \
            describe(self.store if options.bundle is not None else None)
        self.side.bundle.progress = Progress.for_config(config, self.store.name if self.store is not None else "")
        self.side.bundle.progress.attach(self.store)
        self.side.bundle.tell = _teller(config)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Look at a bundle URL and the remote cache; in strict mode, check the bundle before any test
        (not in runs that only collect)."""
        if not self.config.option.collectonly:
            if self.options.bundle_url is not None:
                self.report.bundle_at_start, self.side.bundle.existed, self.side.bundle.problem = \
                    describe(self.store)
            if self.side.bundle.problem:
                self.report.problems.append(Problem(Concern.BUNDLE, self.side.bundle.problem, self.store.name
                                                    if self.store is not None else ""))
            check_remote(self.options, self.report)
            with self.side.bundle.progress.showing():
                check_at_start(self.options, self.store, self.side.bundle.problem, self.side.bundle.existed,
                                self.side.folders.process, self.report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        with warnings_to_pytest(self.config):
            failure = self.side.bundle.prepare_for(session)
        if failure:
            raise pytest.UsageError(failure)

    def _finish(self, session: pytest.Session) -> None:
        process = self.side.bundle.finish()
        own = self.side.bundle.own_artifacts(process)
        self.report.processes = [process]
        env = process.env
        pools = self.side.folders.shared / "binaries"
        with self.side.bundle.progress.showing():
            Saver(self.store, self.options, self.side.bundle.existed, self.run, pools, self.side.bundle.problem).save(
                self.report, [(env, *own)] if own and env else [])
        self.report.session_seconds = time.time() - self.report.started
        if self.keeper is not None:
            self.report.expectations = self.keeper.finish(session)
        self.report.written = write_json(self.options.report, self.report)
        exit_status(self.options, self.report, session)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return header_lines(self.options, self.report, self.side.bundle.process_report)



class Worker(_RunsTests):
    """An xdist worker: runs tests, then hands its artifacts and bundle story to the controller."""

    def __init__(self, config: pytest.Config, options: Options) -> None:
        workerinput: dict[str, Any] = config.workerinput  # type: ignore[attr-defined]
        shared = workerinput.get("compilecache_shared")
        folders = Folders(config, Path(shared) if shared else None)
        run = float(workerinput.get("compilecache_run", time.time()))
        store = open_bundle_store(options, str(workerinput.get("compilecache_store_unreachable", "")))
        super().__init__(config, options, TestSide(config, options, folders, str(workerinput.get("workerid", "worker")),
                                                   run, store))
        self.side.bundle.existed = bool(workerinput.get("compilecache_bundle_existed", False))
        self.side.bundle.problem = str(workerinput.get("compilecache_bundle_problem", ""))
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
        self.config.workeroutput[WORKER_OUTPUT_KEY] = process.to_json()  # type: ignore[attr-defined]


class Controller:
    """The xdist controller: runs no test; checks PATH first, merges every worker's artifacts once."""

    def __init__(self, config: pytest.Config, options: Options) -> None:
        self.config = config
        self.options = options
        self.folders = Folders(config)
        self.run = time.time()
        self.store = open_bundle_store(options)
        self.report = SessionReport(bundle_path=options.bundle_name, started=_session_started())
        self.collector = Collector(options, self.report)
        self.keeper = Keeper.create(config, options.expect, options.expect_update, None)
        self.report.bundle_at_start, self.bundle_existed, self.start_problem = \
            describe(self.store if options.bundle is not None else None)
        self._died_in_warmup: dict[str, str] = {}
        self.progress = Progress.for_config(config, self.store.name if self.store is not None else "")
        self.progress.attach(self.store)

    def start(self, plugins: pytest.PytestPluginManager, saved: SavedEnv | None) -> None:
        """Register this role's hooks and the summary's collector; the controller runs no test, so it
        redirects nothing."""
        plugins.register(self, "compilecache-role")
        plugins.register(self.collector, "compilecache-collector")
        if self.keeper is not None:
            plugins.register(self.keeper, "compilecache-expect-keeper")

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
        """Look at a bundle URL and the remote cache; in strict mode, check the bundle before workers start."""
        if self.options.bundle_url is not None:
            self.report.bundle_at_start, self.bundle_existed, self.start_problem = describe(self.store)
        if self.start_problem:
            self.report.problems.append(Problem(Concern.BUNDLE, self.start_problem,
                                                self.store.name if self.store is not None else ""))
        check_remote(self.options, self.report)
        with self.progress.showing():
            check_at_start(self.options, self.store, self.start_problem, self.bundle_existed, self.folders.process,
                            self.report)

    def pytest_configure_node(self, node: Any) -> None:
        """Tell a new worker where the session's shared folder is, whether PATH existed at start, and
        whether its store stopped answering."""
        node.workerinput["compilecache_shared"] = str(self.folders.shared)
        node.workerinput["compilecache_bundle_existed"] = self.bundle_existed
        node.workerinput["compilecache_bundle_problem"] = self.start_problem
        node.workerinput["compilecache_run"] = self.run
        node.workerinput["compilecache_store_unreachable"] = self.store.unreachable if self.store is not None else ""

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """Collect a worker's bundle story; for a worker that died in the warmup, say so."""
        output = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY)
        if output is not None:
            self.report.processes.append(ProcessReport.from_json(output))
        if error is not None:
            worker = str(node.gateway.id)
            why = died_in_warmup(self.folders.shared / "warmup-done", worker)
            if why:
                self._died_in_warmup[worker] = why
                self.report.problems.append(Problem(Concern.WARMUP, why))

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
            self._finish(session)

    def _finish(self, session: pytest.Session) -> None:
        blobs = []
        for process in self.report.processes:
            file = process.artifacts_file
            if file and process.env and os.path.exists(file):
                blobs.append((process.env, Path(file).read_bytes(), read_index(process.index_file)))
        with self.progress.showing():
            Saver(self.store, self.options, self.bundle_existed, self.run, self.folders.shared / "binaries",
                  self.start_problem).save(self.report, blobs)
        self.report.session_seconds = time.time() - self.report.started
        if self.keeper is not None:
            self.report.expectations = self.keeper.finish(session)
        self.report.written = write_json(self.options.report, self.report)
        exit_status(self.options, self.report, session)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return header_lines(self.options, self.report, None)




def _teller(config: pytest.Config) -> Callable[[str], None]:
    """Write a line of the plugin's on the terminal now, on a line of its own (after a test's dots)."""
    def tell(line: str) -> None:
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.ensure_newline()
            terminal.write_line(f"compilecache: {line}")

    return tell


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
