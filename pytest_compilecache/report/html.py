"""Compile columns in pytest-html's results table, through its optional hooks.

:class:`HtmlColumns` is registered only when pytest-html is loaded (its hook specifications exist
only then), in the process that writes the report (never an xdist worker).
"""

from __future__ import annotations

import html
from typing import Any

import pytest

from .model import REPORT_ATTR

#: ``(column class, header)`` of each column added, after pytest-html's own.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("compile_seconds", "Compile s"),
    ("fx_hits", "FX hits"),
    ("fx_misses", "FX misses"),
)


class HtmlColumns:
    """Adds compile seconds and FX graph hits and misses to each test's row (empty for tests not counted)."""

    def __init__(self) -> None:
        self._stats: dict[str, dict[str, Any]] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep each test's counts: they ride on its teardown report, pytest-html makes every row of
        the test then, from all its reports."""
        stats = getattr(report, REPORT_ATTR, None)
        if stats is not None and report.when == "teardown":
            self._stats[report.nodeid] = stats

    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        cells.extend(f'<th class="sortable" data-column-type="{name}">{title}</th>' for name, title in COLUMNS)

    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        stats = self._stats.get(report.nodeid)
        fx = stats.get("fx_graph", {}) if stats is not None else {}
        values = ("" if stats is None else f"{float(stats.get('compile_seconds', 0.0)):.2f}",
                  _count(fx, "hits", stats), _count(fx, "misses", stats))
        cells.extend(f'<td class="col-{name}">{html.escape(value)}</td>' for (name, _), value in zip(COLUMNS, values))


def _count(layer: dict[str, Any], kind: str, stats: dict[str, Any] | None) -> str:
    """The count as a cell: empty for a test not counted, ``-`` for a layer not observable here."""
    if stats is None:
        return ""
    return str(layer[kind]) if layer.get("observable", True) and kind in layer else "-"
