"""The GitHub job summary, in process: its Markdown for given facts, and how it is appended to the step's file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache.report.markdown import SUMMARY_ENV, TOP_TESTS, append_job_summary, job_summary
from pytest_compilecache.report.model import Concern, Problem, ProcessReport, SaveResult, SaveStatus, SessionReport, Status
from pytest_compilecache.stats import stats_from_counts

BUNDLE = "/nowhere/suite.bundle"


def _stats(seconds: float = 0.0, unobservable: dict[str, str] | None = None, **counts: int) -> dict[str, Any]:
    """One test's counts (``fx_graph__hits=2`` is ``fx_graph.hits``) and compile seconds."""
    flat = {name.replace("__", "."): n for name, n in counts.items()}
    return {**stats_from_counts(flat, unobservable or {}).to_dict(), "cache": "warm", "compile_seconds": seconds}


def _clean() -> SessionReport:
    report = SessionReport(bundle_path=BUNDLE, bundle_at_start="holds 1 entry")
    report.processes = [ProcessReport(status=Status.LOADED, reason=f"{BUNDLE}: torch on cpu")]
    report.add_test("t.py::a", _stats(0.5, fx_graph__hits=2, fx_graph__from_bundle=2))
    report.saved = SaveResult(SaveStatus.KEPT, "nothing to add")
    return report


def test_the_section_has_its_heading_and_ends_with_one_blank_line() -> None:
    """The section starts with its own heading and leaves one blank line for whatever a later step appends."""
    text = job_summary(_clean())
    assert text.startswith("## compilecache\n\n") and text.endswith("\n\n") and not text.endswith("\n\n\n")


def test_a_clean_run_has_no_warning_block() -> None:
    """No problem, no GitHub alert."""
    assert "[!WARNING]" not in job_summary(_clean())


def test_each_problem_is_one_line_of_the_warning_block() -> None:
    """Problems seen by several processes are said once; a problem of several lines gives its first."""
    report = _clean()
    damaged = Problem(Concern.BUNDLE, f"{BUNDLE}: damaged\n  details that belong in the log", BUNDLE)
    binary = Problem(Concern.BINARY, "x.so fails its checksum")
    report.problems.append(damaged)
    report.processes[0].problems = [damaged, binary]
    lines = job_summary(report).splitlines()
    start = lines.index("> [!WARNING]")
    assert lines[start + 1:start + 4] == [f"> {BUNDLE}: damaged", "> C++ binary not used: x.so fails its checksum", ""]


def test_a_failed_warmup_leads_the_warning_block_with_its_first_line() -> None:
    """The warmup's failure comes first, with the first line of its error."""
    report = _clean()
    report.processes[0].warmup_error = "\nRuntimeError: boom\n  at conftest.py:3\n"
    lines = job_summary(report).splitlines()
    assert lines[lines.index("> [!WARNING]") + 1] == (
        "> the warmup failed; this run's `warm_cache` tests skip (see the log): RuntimeError: boom")


def test_the_layer_table_has_a_row_per_observable_layer_that_counted() -> None:
    """Rows hold the totals of layers that counted; unobservable and idle layers have none."""
    report = SessionReport()
    report.add_test("a", _stats(unobservable={"triton": "no GPU"}, fx_graph__hits=3, fx_graph__from_bundle=2,
                                aot_autograd__misses=1, aot_autograd__bypasses=4))
    rows = [line for line in job_summary(report).splitlines() if line.startswith("| ") and "layer" not in line]
    assert rows == ["| fx_graph | 3 | 0 | 0 | 2 |", "| aot_autograd | 0 | 1 | 4 | 0 |"]


def test_dynamos_unobservable_counts_are_dashes() -> None:
    """Dynamo's line gives its counts, and a dash for one this torch cannot keep."""
    report = SessionReport()
    report.add_test("a", {**_stats(fx_graph__hits=1), "dynamo": {"graphs": 2, "recompiles": None, "graph_breaks": 1,
                                                                   "unobservable": {"recompiles": "old torch"}}})
    assert "Dynamo: 2 graphs, - recompiles, 1 graph breaks." in job_summary(report)


def test_no_compile_says_so_instead_of_a_table() -> None:
    """A run that compiled nothing has a sentence, not a table of zeros."""
    report = SessionReport()
    report.add_test("a", _stats())
    text = job_summary(report)
    assert "No test compiled anything." in text and "| layer |" not in text


def test_the_top_tests_are_the_slowest_compiling_ones_in_order() -> None:
    """At most ``TOP_TESTS`` tests, slowest first; tests that spent no time compiling are not ranked."""
    report = SessionReport()
    for i in range(TOP_TESTS + 2):
        report.add_test(f"t.py::test_{i:02d}", _stats(0.1 * (i + 1), fx_graph__misses=i))
    report.add_test("t.py::idle", _stats(0.0))
    lines = job_summary(report).splitlines()
    rows = [line for line in lines if line.startswith("| `t.py::")]
    expected = [f"t.py::test_{i:02d}" for i in range(TOP_TESTS + 1, 1, -1)]
    assert [row.split("`")[1] for row in rows] == expected
    assert rows[0].split(" | ")[1:4] == [f"{0.1 * (TOP_TESTS + 2):.2f}", "0", str(TOP_TESTS + 1)]
    assert f"**The {TOP_TESTS} tests that spent the most time compiling** (of {TOP_TESTS + 3} counted)" in lines


def test_the_building_runs_column_appears_only_where_the_bundle_recorded_the_tests() -> None:
    """The building run's seconds are a column where the loaded bundle recorded them, blank for other tests."""
    report = _clean()
    assert "in the building run" not in job_summary(report)
    report.add_test("t.py::b", _stats(0.25))
    report.processes[0].history = {"tests": {"t.py::a": 3.0}}
    rows = {row.split("`")[1]: row.split(" | ") for row in job_summary(report).splitlines() if row.startswith("| `")}
    assert rows["t.py::a"][2] == "3.00" and rows["t.py::b"][2] == ""


@pytest.mark.parametrize("nodeid, cell", [
    ("t.py::test[a|b]", "`t.py::test[a\\|b]`"),
    ("t.py::test[`x`]", "`t.py::test['x']`"),
    ("t.py::test[a\nb]", "`t.py::test[a b]`"),
], ids=["pipe", "backtick", "newline"])
def test_a_test_id_cannot_break_its_table_cell(nodeid: str, cell: str) -> None:
    """Pipes are escaped, backticks replaced and newlines flattened inside a cell."""
    report = SessionReport()
    report.add_test(nodeid, _stats(1.0, fx_graph__hits=1))
    assert f"| {cell} | 1.00 |" in job_summary(report)


def test_the_bundles_details_are_nested_under_its_bullet() -> None:
    """The terminal's indented detail lines become nested bullets."""
    report = _clean()
    report.processes[0].loaded, report.processes[0].loaded_bytes = {"inductor": 2}, 1_000_000
    lines = job_summary(report).splitlines()
    at = lines.index(f"- bundle: loaded: {BUNDLE}: torch on cpu")
    assert lines[at + 1].startswith("  - loaded 2 fx_graph (1.00 MB")
    assert f"**Bundle** `{BUNDLE}` at the start: holds 1 entry" in lines


def test_no_job_summary_without_githubs_variable(tmp_path: Path) -> None:
    """Outside GitHub Actions nothing is written and nothing returned."""
    assert append_job_summary(_clean(), environ={}) is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("before", ["", "# earlier step\n", "# earlier step without a newline"],
                         ids=["empty", "ends-in-newline", "no-final-newline"])
def test_the_job_summary_is_appended_after_earlier_steps(tmp_path: Path, before: str) -> None:
    """What earlier steps wrote is kept, and the section starts on a line of its own."""
    path = tmp_path / "summary.md"
    path.write_text(before)
    assert append_job_summary(_clean(), environ={SUMMARY_ENV: str(path)}) == path
    separator = "\n" if before and not before.endswith("\n") else ""
    assert path.read_text() == before + separator + job_summary(_clean())
