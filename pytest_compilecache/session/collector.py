"""Gathers per-test counts from the reports (a worker's arrive on them too) and prints the compilecache summary."""

from __future__ import annotations

import os
from typing import Any

import pytest

from ..report.markdown import SUMMARY_ENV, append_job_summary
from ..report.model import REPORT_ATTR, Concern, Problem, SessionReport, Status
from ..report.terminal import patch_lines, summary_lines
from .options import Options, verbosity


class Collector:
    """Registered beside the roles that report (a run without xdist, the xdist controller)."""

    def __init__(self, options: Options, report: SessionReport) -> None:
        self.options, self.report = options, report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            self.report.ran.add(report.nodeid)
        stats = getattr(report, REPORT_ATTR, None)
        if stats is not None and report.when == "teardown":
            self.report.add_test(report.nodeid, stats)

    def _worth_saying(self, config: pytest.Config) -> bool:
        """When asked for, when tests were counted, or when something went wrong; never in a run that only collects."""
        report = self.report
        return not config.option.collectonly and bool(
            self.options.active or self.options.warnings or report.totals is not None or report.all_problems()
            or report.expectations is not None or any(p.status is not Status.UNUSED for p in report.processes))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Under GitHub Actions, append the compilecache section to the job summary (after the roles' end)."""
        if self._worth_saying(session.config):
            try:
                append_job_summary(self.report)
            except OSError as exc:
                self.report.problems.append(Problem(Concern.REPORT, f"{SUMMARY_ENV}: could not append the job summary: "
                                                    f"{exc}", os.environ.get(SUMMARY_ENV, "")))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """The ``compilecache`` section, when :meth:`_worth_saying`."""
        if self._worth_saying(terminalreporter.config):
            level = verbosity(terminalreporter.config, self.options)
            warnings = self.options.warnings + self.options.home_notices
            lines = [*(f"WARNING: {w}" for w in warnings), *summary_lines(self.report, level),
                     *patch_lines(self.report, level > 0)]
            if lines:
                terminalreporter.ensure_newline()  # ends the progress line, so the section adds no empty line
                terminalreporter.section("compilecache")
                for line in lines:
                    terminalreporter.write_line(line)
