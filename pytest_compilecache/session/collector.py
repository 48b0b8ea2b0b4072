"""Gathers per-test counts from the reports (a worker's arrive on them too) and prints the compilecache summary."""

from __future__ import annotations

import os
from typing import Any

import pytest

from ..report.markdown import SUMMARY_ENV, append_job_summary
from ..report.model import REPORT_ATTR, Concern, Problem, SessionReport, Status
from ..report.terminal import patch_lines, summary_lines
from .options import Options


class Collector:
    """Registered beside the roles that report (single process, controller): gathers per-test
    counts from the reports (a worker's arrive on them too) and prints the summary."""

    def __init__(self, options: Options, report: SessionReport) -> None:
        self.options = options
        self.report = report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            self.report.ran.add(report.nodeid)
        stats = getattr(report, REPORT_ATTR, None)
        if stats is not None and report.when == "teardown":
            self.report.add_test(report.nodeid, stats)

    def _worth_saying(self, config: pytest.Config) -> bool:
        """When asked for, when tests were counted, or when something went wrong; never in a run that
        only collects (it does nothing to sum up)."""
        if config.option.collectonly:
            return False
        report = self.report
        used = any(p.status is not Status.UNUSED for p in report.processes)
        return (self.options.active or bool(self.options.warnings) or report.totals is not None or used or bool(report.all_problems())
                or report.expectations is not None)

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
        report = self.report
        if self._worth_saying(terminalreporter.config):
            terminalreporter.section("compilecache")
            for line in self.options.warnings:
                terminalreporter.write_line(f"WARNING: {line}")
            for line in summary_lines(report):
                terminalreporter.write_line(line)
            verbose = self.options.explain or terminalreporter.config.option.verbose > 0
            for line in patch_lines(report, verbose):
                terminalreporter.write_line(line)
