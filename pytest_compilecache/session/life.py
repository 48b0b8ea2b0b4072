"""One session's start and end for the roles that report: what it checks and says before any test (the bundle's
state, the remote cache, strict mode's checks); the save, the summary, the report and the exit status."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pytest

from .. import _torchapi, caught
from ..bundle import signing
from ..bundle.format import BundleError, Unreadable
from ..environment import caches_disabled_by_env
from ..report.model import REPORT_ATTR, Concern, Problem, ProcessReport, SessionReport, Status
from ..report.terminal import patch_lines, summary_lines
from ..storage.interface import BundleStore
from ..storage.packs import open_store
from ..storage.urls import redacted
from ..words import counted
from . import remote
from ..channel import BundleAtStart
from .folders import Folders
from .options import Isolation, Options, verbosity
from .saving import exit_status, save, write_json

if TYPE_CHECKING:
    from .testside import TestSide

#: When the plugin was loaded: a process's first session counts its wall clock from here, a later one from its start.
_LOADED: float | None = time.time()


def _session_started() -> float:
    """When this session began, as the user's clock sees it (see ``_LOADED``)."""
    global _LOADED
    started, _LOADED = _LOADED or time.time(), None
    return started


class SessionLife:
    """The session's report, its bundle as seen before any test, its header and summary."""

    def __init__(self, config: pytest.Config, options: Options, store: BundleStore | None, run: float,
                 folders: Folders, side: TestSide | None = None) -> None:
        self.options, self.store, self.run, self.folders, self.side = options, store, run, folders, side
        self._caught_before = caught.counts()
        self.report = SessionReport(bundle_path=options.bundle_name, started=_session_started())
        self.at_start = describe(store if options.bundle is not None else None, self.report, options.rebuild)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Look at a bundle URL and ping the remote cache; in strict mode, check the bundle before any test."""
        if session.config.option.collectonly:
            return
        if self.options.bundle_url is not None:
            self.at_start = describe(self.store, self.report, self.options.rebuild)
        if self.at_start.problem and not self.at_start.repaired:
            self.report.problems.append(Problem(Concern.BUNDLE, self.at_start.problem,
                                                self.store.name if self.store is not None else ""))
        url = self.options.remote
        if url is not None and (why := remote.unreachable(url)):  # torch hides a server it cannot reach
            self.report.remote_problem = why
            self.report.problems.append(Problem(Concern.REMOTE, f"remote cache {redacted(url)} is unreachable ({why}); "
                                                "torch switches its remote cache off in silence, so every remote "
                                                "lookup misses", redacted(url)))
            strict_failure(self.options, self.report.problems[-1:], "remote cache")
        if self.options.strict and self.store is not None and not self.options.rebuild:
            strict_failure(self.options, [self.at_start.problem] if self.at_start.problem
                           else self._entry_problems(self.store) if self.at_start.existed else [])

    def _entry_problems(self, store: BundleStore) -> list[str]:
        """Strict mode's check that PATH has an intact entry for this machine."""
        before = store.transfer
        try:
            _torchapi.bootstrap(str(self.folders.process))
            here = _torchapi.environment_fingerprint()
            bundle = store.read(here)
            if bundle is None:
                return []
            with bundle:
                entry = bundle.find(here)
                if entry is None:
                    return [bundle.mismatch(here)]
                secret = signing.key()
                if refused := bundle.signature_problem(entry, secret) if secret else "":
                    return [refused]
                bundle.members(entry)  # its table; each artifact is checked when read
        except (BundleError, _torchapi.TorchUnavailable) as exc:
            return [str(exc)]
        finally:
            self.report.checked_downloaded = store.transfer.since(before).downloaded
        return []

    def finish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode, processes: list[ProcessReport],
               artifacts: list[tuple[dict[str, str], bytes, Any]], left_out: str = "") -> None:
        """Save what the processes compiled, then the report, the JSON file and the exit status; ``left_out``: why
        the run did not run the whole suite, where the role knows (a worker died)."""
        self.report.processes = processes
        left_out = (left_out or next((p.left_out for p in processes if p.left_out), "")
                    or stopped_early(session, exitstatus)
                    or ("the warmup failed, so warm_cache tests were skipped" if self.report.warmup_failed else ""))
        save(self.report, artifacts, self.store, self.options, self.at_start, self.run,
             self.folders.shared / "binaries", left_out)
        self.report.session_seconds = time.time() - self.report.started
        self.report.caught = caught.since(self._caught_before)
        self.report.written = write_json(self.options.report, self.report)
        exit_status(self.options, self.report, session)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        process = self.side.bundle.process_report if self.side is not None else None
        return header_lines(self.options, self.report, process, verbosity(config, self.options))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            self.report.ran.add(report.nodeid)
            if (stats := getattr(report, REPORT_ATTR, None)) is not None:
                self.report.add_test(report.nodeid, stats)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """The ``compilecache`` section: when asked for, when tests were counted, or when something went wrong; never
        in a run that only collects."""
        report = self.report
        if not terminalreporter.config.option.collectonly and (
                self.options.active or self.options.warnings or report.totals is not None or report.all_problems()
                or any(p.status is not Status.UNUSED for p in report.processes)):
            level = verbosity(terminalreporter.config, self.options)
            warnings = self.options.warnings + self.options.home_notices
            lines = [*(f"WARNING: {w}" for w in warnings), *summary_lines(self.report, level),
                     *patch_lines(self.report, level > 0)]
            if lines:
                terminalreporter.ensure_newline()
                terminalreporter.section("compilecache")
                for line in lines:
                    terminalreporter.write_line(line)


class Selection:
    """Watches what a process that runs tests left out of its collection: deselected tests (``-k``, ``-m``,
    ``--deselect``, ``--sw``), a run of the last failures (``--lf``), collection errors, and tests or files named on
    the command line (not ``testpaths``)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        where = Path(config.invocation_params.dir)
        source = getattr(config, "args_source", None)
        given = source is None or source.name == "ARGS"  # not testpaths, not the invocation folder
        self._named = [arg for arg in config.args if given and ("::" in arg or (where / arg).is_file())]
        self._deselected = 0
        self._errors = 0
        self._last_failed = False

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self._deselected += len(items)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._errors += 1

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self) -> None:
        # --lf skips files and drops passed tests during collection, without deselecting them.
        last_failed = self.config.pluginmanager.get_plugin("lfplugin")
        self._last_failed = bool(self.config.getoption("lf", False) and getattr(last_failed, "lastfailed", None))

    def left_out(self) -> str:
        """Why this process ran part of the suite, in words; "" when it ran every test its paths hold."""
        if self._last_failed:
            return "it ran the last failures only (--lf)"
        if self._named:
            return f"it named tests or files ({self._named[0]}{', ...' if len(self._named) > 1 else ''})"
        if self._deselected:
            return f"it deselected {counted(self._deselected, 'test')} (-k, -m, --deselect or --sw)"
        if self._errors:
            return f"{counted(self._errors, 'collection error')} left tests out"
        return ""


def teller(config: pytest.Config) -> Callable[[str], None]:
    """Write a line of the plugin's on the terminal now, on a line of its own (after a test's dots)."""
    def tell(line: str) -> None:
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.ensure_newline()
            terminal.write_line(f"compilecache: {line}")

    return tell


def stopped_early(session: pytest.Session, exitstatus: int | pytest.ExitCode) -> str:
    """Why the session did not run every test it selected (``-x``, ``--maxfail``, an interrupt), or ""."""
    if session.shouldfail or session.shouldstop:  # set by pytest, or by the xdist controller at --maxfail
        return f"it stopped early ({session.shouldfail or session.shouldstop})"
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        return "it was interrupted"
    return ""


def open_bundle_store(options: Options, unreachable: str = "") -> BundleStore | None:
    """The session's bundle store (``None`` without a bundle); ``unreachable``: why the controller stopped asking it."""
    where = options.bundle_url or options.bundle
    return None if where is None else open_store(where, options.lock_timeout, options.home / "bundle-copies",
                                                 options.storage_options, options.network_timeout, unreachable)


def describe(store: BundleStore | None, report: SessionReport, rebuild: bool = False) -> BundleAtStart:
    """How the bundle looks now, without torch and without a download (in words: ``report.bundle_at_start``);
    with ``rebuild``, damage is what the session repairs, said here once."""
    if store is None:
        return BundleAtStart()
    look = store.describe()  # a problem's reason is said once, as a PROBLEM in the summary
    report.bundle_existed = look.exists
    repaired = bool(look.problem) and rebuild and look.unreadable is Unreadable.DAMAGED
    report.bundle_at_start = (f"{look.problem}; --compile-cache-rebuild writes a fresh one" if repaired else
                              f"{store.name}: cannot be used (see PROBLEM in the compilecache summary)"
                              if look.problem else look.text)
    return BundleAtStart(look.exists, look.problem, repaired)


def header_lines(options: Options, report: SessionReport, process: ProcessReport | None, level: int) -> list[str]:
    """The lines under pytest's header: by default one, naming what the user set up (none where nothing is); with
    ``level`` 1 (``-v``) also what is off; a warning always."""
    mode = {Isolation.OFF: "off", Isolation.TEST: "a cache per test",
            Isolation.WORKER: "a kept cache per worker"}[options.isolation]
    said = [f"bundle {report.bundle_at_start}"] if options.has_bundle else []
    if signing.key() and options.has_bundle:
        said.append(f"bundles are signed and checked with {signing.KEY_ENV}")
    elif level > 0 and options.has_bundle:
        said.append(f"bundles are unsigned (set {signing.KEY_ENV} to sign and check them)")
    if options.isolation is not Isolation.OFF or level > 0:
        said.append(f"isolation: {mode}")
    if options.remote is not None:
        state = f"UNREACHABLE: {report.remote_problem}" if report.remote_problem else "reachable"
        said.append(f"remote cache {redacted(options.remote)} (FX graph, AOTAutograd, autotune): {state}")
    if level > 0 and process is not None and process.status is not Status.UNUSED:
        said.append(f"bundle {process.status.value}: {process.reason}")
    lines = ([f"compilecache: {said[0]}" + "".join(f"; {part}" for part in said[1:])] if said and level <= 0
             else [f"compilecache: {part}" for part in said])
    return lines + [f"compilecache: WARNING: {line}; cache assertions are meaningless"
                    for line in caches_disabled_by_env()]


def strict_failure(options: Options, problems: Sequence[Problem | str], what: str = "bundle") -> None:
    if options.strict and problems:
        raise pytest.UsageError(f"--compile-cache-strict: {what} problem at session start:\n  "
                                + "\n  ".join(map(str, problems)))
