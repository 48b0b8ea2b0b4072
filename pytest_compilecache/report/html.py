"""Compile columns in pytest-html's results table, through its optional hooks (registered only where
pytest-html is loaded, in the process that writes the report)."""

from __future__ import annotations

import html
from typing import Any

import pytest

from .model import REPORT_ATTR

#: ``(column class, header)`` of each column added, after pytest-html's own.
COLUMNS: tuple[tuple[str, str], ...] = (("compile_seconds", "Compile s"), ("fx_hits", "FX hits"),
                                        ("fx_misses", "FX misses"))


class HtmlColumns:
    """Adds compile seconds and FX graph hits and misses to each test's row (empty for tests not counted)."""

    def __init__(self) -> None:
        self._stats: dict[str, dict[str, Any]] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep each test's counts from its teardown report (pytest-html makes the test's rows then)."""
        stats = getattr(report, REPORT_ATTR, None)
        if stats is not None and report.when == "teardown":
            self._stats[report.nodeid] = stats

    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        cells.extend(f'<th class="sortable" data-column-type="{name}">{title}</th>' for name, title in COLUMNS)

    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        stats = self._stats.get(report.nodeid)
        values = ["", "", ""]
        if stats is not None:  # a count of a layer not observable here is "-"
            fx = stats.get("fx_graph", {})
            values = [f"{float(stats.get('compile_seconds', 0.0)):.2f}",
                      *(str(fx[k]) if fx.get("observable", True) and k in fx else "-" for k in ("hits", "misses"))]
        cells.extend(f'<td class="col-{name}">{html.escape(value)}</td>' for (name, _), value in zip(COLUMNS, values))
