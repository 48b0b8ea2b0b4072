"""One session's start and end for the roles that report: checks before any test; save, report and exit status."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pytest

from ..expect.hooks import Keeper, Recorder
from ..report.model import Concern, Problem, ProcessReport, SessionReport
from ..storage.interface import BundleStore
from .collector import Collector
from .options import Options
from .progress import Progress
from .saving import exit_status, save, write_json
from .selection import stopped_early
from .start import check_at_start, check_remote, describe

#: When the plugin was loaded: a process's first session counts its wall clock from here, a later one from its start.
_LOADED: float | None = time.time()


def _session_started() -> float:
    """When this session began, as the user's clock sees it (see ``_LOADED``)."""
    global _LOADED
    started, _LOADED = _LOADED or time.time(), None
    return started


class SessionLife:
    """The session's report, collector and expectations' keeper, and its bundle as seen before any test."""

    def __init__(self, config: pytest.Config, options: Options, store: BundleStore | None, run: float,
                 progress: Progress, recorder: Recorder | None) -> None:
        self.options, self.store, self.run, self.progress = options, store, run, progress
        self.report = SessionReport(bundle_path=options.bundle_name, started=_session_started())
        self.collector = Collector(options, self.report)
        self.keeper = Keeper.create(config, options.expect, options.expect_update, recorder)
        self.at_start = describe(store if options.bundle is not None else None, self.report, options.rebuild)

    def register(self, plugins: pytest.PytestPluginManager) -> None:
        """The summary's collector and the expectations' keeper, beside the role."""
        plugins.register(self.collector, "compilecache-collector")
        if self.keeper is not None:
            plugins.register(self.keeper, "compilecache-expect-keeper")

    def start(self, process_dir: Path) -> None:
        """Look at a bundle URL and the remote cache; in strict mode, check the bundle before any test."""
        if self.options.bundle_url is not None:
            self.at_start = describe(self.store, self.report, self.options.rebuild)
        if self.at_start.problem and not self.at_start.repaired:
            self.report.problems.append(Problem(Concern.BUNDLE, self.at_start.problem,
                                                self.store.name if self.store is not None else ""))
        check_remote(self.options, self.report)
        with self.progress.showing():
            check_at_start(self.options, self.store, self.at_start, process_dir, self.report)

    def finish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode, processes: list[ProcessReport],
               artifacts: list[tuple[dict[str, str], bytes, Any]], pools: Path, left_out: str = "") -> None:
        """Save what the processes compiled, then the report, the JSON file and the exit status; ``left_out``: why
        the run did not run the whole suite, where the role knows (a worker died)."""
        self.report.processes = processes
        left_out = (left_out or next((p.left_out for p in processes if p.left_out), "")
                    or stopped_early(session, exitstatus)
                    or ("the warmup failed, so warm_cache tests were skipped" if self.report.warmup_failed else ""))
        with self.progress.showing():
            save(self.report, artifacts, self.store, self.options, self.at_start, self.run, pools, left_out)
        self.report.session_seconds = time.time() - self.report.started
        if self.keeper is not None:
            self.report.expectations = self.keeper.finish(session)
        self.report.written = write_json(self.options.report, self.report)
        exit_status(self.options, self.report, session)


def teller(config: pytest.Config) -> Callable[[str], None]:
    """Write a line of the plugin's on the terminal now, on a line of its own (after a test's dots)."""
    def tell(line: str) -> None:
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.ensure_newline()
            terminal.write_line(f"compilecache: {line}")

    return tell
