"""Gathers per-test counts from the reports (a worker's arrive on them too) and prints the compilecache summary."""

from __future__ import annotations

from typing import Any

import pytest

from ..report.model import REPORT_ATTR, SessionReport, Status
from ..report.terminal import summary_lines
from .options import Options


class Collector:
    """Registered beside the roles that report (single process, controller): gathers per-test
    counts from the reports (a worker's arrive on them too) and prints the summary."""

    def __init__(self, options: Options, report: SessionReport) -> None:
        self.options = options
        self.report = report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        stats = getattr(report, REPORT_ATTR, None)
        if stats is not None and report.when == "teardown":
            self.report.add_test(report.nodeid, stats)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """The ``compilecache`` section: when asked for, when tests were counted, or when something went wrong."""
        report = self.report
        used = any(p.status is not Status.UNUSED for p in report.processes)
        if self.options.active or report.totals is not None or used or report.all_problems() \
                or report.expectations is not None:
            terminalreporter.section("compilecache")
            for line in summary_lines(report):
                terminalreporter.write_line(line)
