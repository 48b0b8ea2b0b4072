"""pytest-html's compile columns, in process: the cells added for a test's counts, without pytest-html itself."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pytest_compilecache.report.html import COLUMNS, HtmlColumns
from pytest_compilecache.report.model import REPORT_ATTR


def _report(nodeid: str, when: str = "teardown", stats: dict[str, Any] | None = None) -> Any:
    """A test report as pytest-html hands it: a node id, its phase, and the plugin's counts where it has them."""
    report = SimpleNamespace(nodeid=nodeid, when=when)
    if stats is not None:
        setattr(report, REPORT_ATTR, stats)
    return report


def _row(columns: HtmlColumns, nodeid: str) -> list[str]:
    cells: list[str] = []
    columns.pytest_html_results_table_row(_report(nodeid), cells)
    return cells


def test_the_header_gains_one_sortable_column_each() -> None:
    """Three headers, in order, after whatever pytest-html put first."""
    cells = ["<th>Result</th>"]
    HtmlColumns().pytest_html_results_table_header(cells)
    assert cells[0] == "<th>Result</th>" and len(cells) == 1 + len(COLUMNS)
    assert all(f'data-column-type="{name}">{title}</th>' in cell for (name, title), cell in zip(COLUMNS, cells[1:]))


def test_a_counted_tests_row_holds_its_seconds_and_fx_counts() -> None:
    """The teardown report's counts fill the row: seconds to two places, FX hits and misses."""
    columns = HtmlColumns()
    columns.pytest_runtest_logreport(_report("t::a", stats={"compile_seconds": 1.239, "fx_graph": {"hits": 4,
                                                                                                   "misses": 1}}))
    assert _row(columns, "t::a") == ['<td class="col-compile_seconds">1.24</td>', '<td class="col-fx_hits">4</td>',
                                     '<td class="col-fx_misses">1</td>']


@pytest.mark.parametrize("when, stats", [("call", {"compile_seconds": 1.0}), ("teardown", None)],
                         ids=["not-teardown", "not-counted"])
def test_a_test_without_teardown_counts_has_empty_cells(when: str, stats: dict[str, Any] | None) -> None:
    """Only the teardown report carries the counts; a test without them gets empty cells, not zeros."""
    columns = HtmlColumns()
    columns.pytest_runtest_logreport(_report("t::a", when, stats))
    assert [cell.split(">")[1].split("<")[0] for cell in _row(columns, "t::a")] == ["", "", ""]


def test_an_unobservable_fx_layer_is_a_dash() -> None:
    """FX counts this machine cannot observe are ``-``, the seconds still given."""
    columns = HtmlColumns()
    columns.pytest_runtest_logreport(_report("t::a", stats={"compile_seconds": 0.5,
                                                           "fx_graph": {"observable": False, "reason": "x"}}))
    assert [cell.split(">")[1].split("<")[0] for cell in _row(columns, "t::a")] == ["0.50", "-", "-"]
