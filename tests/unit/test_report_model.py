"""The report's model, in process: its JSON forms read back as they were written, and the facts the summaries are
built from (problems once each, where hits came from, what a save wrote, the comparison with the building run)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_compilecache.bundle.format import Unreadable
from pytest_compilecache.report.model import (
    Comparison, Concern, Problem, ProcessReport, SaveResult, SaveStatus, SessionReport, Status,
    session_record)


def _through_json(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as it arrives after a trip through JSON (a worker's output, the report file)."""
    arrived: dict[str, Any] = json.loads(json.dumps(data))
    return arrived


PROCESSES = {
    "default": ProcessReport(),
    "loaded": ProcessReport(process="gw3", status=Status.LOADED, reason="b.bundle: torch on cpu",
                            loaded={"inductor": 2, "aot_autograd": 1}, loaded_bytes=12_345, load_seconds=0.25,
                            on_demand={"inductor": 4}, placed={"inductor": 1}, placed_bytes=99, downloaded_bytes=0,
                            binaries={"carried": 3, "fit": 2}, history={"session": {"seconds": 3.0}},
                            not_saved=["a graph with a hook"], headers_seconds=1.5),
    "problems": ProcessReport(process="gw0", status=Status.WARMUP_FAILED, warmup_error="RuntimeError: boom",
                              warmup_seconds=2.0, problems=[Problem(Concern.BUNDLE, "b.bundle: damaged", "b.bundle"),
                                                            Problem(Concern.BINARY, "x.so fails its checksum"),
                                                            Problem(Concern.WARMUP, "the hook failed")]),
    "unreadable": ProcessReport(status=Status.UNUSABLE, bundle_unreadable="b.bundle: truncated",
                                bundle_unreadable_kind=Unreadable.DAMAGED, wrote_bundle=True, own_warmup=True,
                                warmup_found_all=True, warmup_folder="/w", left_out="2 tests deselected"),
}


@pytest.mark.parametrize("name", sorted(PROCESSES))
def test_a_process_report_reads_back_equal_after_json(name: str) -> None:
    """What a worker sends home (``to_json``, through JSON) is the report it made, field for field."""
    report = PROCESSES[name]
    assert ProcessReport.from_json(_through_json(report.to_json())) == report


def test_a_process_reports_json_splits_binary_problems_from_the_rest() -> None:
    """``problems`` and ``binary_problems`` hold the texts by concern; ``problem_details`` keeps every one typed."""
    data = PROCESSES["problems"].to_json()
    assert data["problems"] == ["b.bundle: damaged", "the hook failed"]
    assert data["binary_problems"] == ["x.so fails its checksum"]
    assert [(p["concern"], p["where"]) for p in data["problem_details"]] == [
        ("bundle", "b.bundle"), ("binary", ""), ("warmup", "")]


def test_a_process_report_from_json_with_fields_missing_takes_the_defaults() -> None:
    """A report from a worker that knew fewer fields (or more) reads, its unknown fields left out."""
    report = ProcessReport.from_json({"process": "gw1", "status": "loaded", "field_of_a_newer_plugin": 1})
    assert report == ProcessReport(process="gw1", status=Status.LOADED)


def test_a_save_not_asked_for_says_nothing_in_json() -> None:
    """The report's ``saved`` is empty where no bundle was asked for, whatever else the result holds."""
    assert SaveResult(reason="ignored", bytes=5, transfer={"uploaded": 3}).to_json() == {}


@pytest.mark.parametrize("status", [SaveStatus.KEPT, SaveStatus.LEFT_ALONE, SaveStatus.NOTHING, SaveStatus.FAILED])
def test_a_save_that_wrote_nothing_gives_its_reason_not_figures(status: SaveStatus) -> None:
    """A kept, left alone, empty or failed save says why, and carries no size, path or artifacts."""
    data = SaveResult(status, "why it did not", path="b.bundle", bytes=7, artifacts={"inductor": {"count": 1}}).to_json()
    assert data == {"status": status.value, "reason": "why it did not"}


def test_a_saved_bundles_json_holds_its_figures_and_what_was_added() -> None:
    """A save that wrote PATH carries its path, size, time, artifacts, what it added and why it was not counted."""
    saved = SaveResult(SaveStatus.SAVED, path="b.bundle", artifacts={"inductor": {"count": 3, "bytes": 9}},
                       bytes=1234, seconds=0.5, added=True, added_artifacts={"inductor": 1}, not_counted="deselected",
                       repaired=["damaged entry"], transfer={"downloaded": 1, "uploaded": 2})
    data = saved.to_json()
    assert (data["path"], data["bytes"], data["seconds"], data["artifacts"]) == (
        saved.path, saved.bytes, saved.seconds, saved.artifacts)
    assert (data["added"], data["added_artifacts"], data["not_counted"]) == (True, {"inductor": 1}, "deselected")
    assert data["repaired"] == ["damaged entry"] and data["transfer"] == {"downloaded": 1, "uploaded": 2}


def test_an_unchanged_bundle_claims_no_additions() -> None:
    """``UNCHANGED`` keeps the figures of what PATH holds, but neither ``added`` nor ``not_counted``."""
    data = SaveResult(SaveStatus.UNCHANGED, path="b.bundle", bytes=10, added_artifacts={"inductor": 1},
                      not_counted="deselected").to_json()
    assert data["status"] == "unchanged" and data["bytes"] == 10
    assert not {"added", "added_artifacts", "not_counted"} & set(data)


def test_a_problem_seen_by_every_process_is_one_problem() -> None:
    """The session's and every process's copies of one text are one problem, the first seen kept."""
    first = Problem(Concern.BUNDLE, "b.bundle: damaged", "b.bundle")
    again = Problem(Concern.SAVING, "b.bundle: damaged")
    other = Problem(Concern.REMOTE, "redis://h:1 is unreachable", "redis://h:1")
    report = SessionReport(problems=[first], processes=[ProcessReport(problems=[again, other]),
                                                        ProcessReport(problems=[first])])
    assert report.every_problem() == [first, other]


def test_a_damaged_entry_names_the_tests_that_ran_without_it() -> None:
    """A problem naming a key that tests missed because it was damaged lists those tests, sorted, once each."""
    report = SessionReport(problems=[Problem(Concern.BUNDLE, "entry fx/abc123 is damaged")])
    report.add_test("t.py::b", {"ran_without_damaged": {"abc123": "damaged"}})
    report.add_test("t.py::a", {"ran_without_damaged": {"abc123": "damaged", "zzz": "other"}})
    report.add_test("t.py::c", {})
    (problem,) = report.every_problem()
    assert problem.text == "entry fx/abc123 is damaged; tests that ran without it: t.py::a, t.py::b"


def test_the_failure_block_is_not_said_again_as_a_problem() -> None:
    """A failed warmup's own problem is left to its block; another warmup problem (a crash) is not."""
    said = Problem(Concern.WARMUP, "the hook failed")
    crash = Problem(Concern.WARMUP, "gw1 died in the warmup")
    report = SessionReport(problems=[crash],
                           processes=[ProcessReport(status=Status.WARMUP_FAILED, problems=[said])])
    assert report.all_problems() == [crash, said]
    assert report.problems_beside_the_failure() == [crash]


def test_adding_tests_sums_their_counts_and_compile_seconds() -> None:
    """The session's totals are the sum of the tests' counts; compile seconds add up."""
    report = SessionReport()
    report.add_test("a", {"compile_seconds": 1.25, "fx_graph": {"hits": 2, "misses": 1}})
    report.add_test("b", {"compile_seconds": 0.5, "fx_graph": {"hits": 3}, "dynamo": {"graphs": 4}})
    assert report.totals is not None
    assert (report.totals.fx_graph.hits, report.totals.fx_graph.misses, report.totals.dynamo.graphs) == (5, 1, 4)
    assert report.compile_seconds == 1.75


def test_misses_in_caches_that_start_empty_are_counted_apart() -> None:
    """Cold and isolated tests' misses are by design; ``not_saved`` misses count only outside them."""
    report = SessionReport()
    report.add_test("cold", {"cache": "cold", "fx_graph": {"misses": 2}, "aot_autograd": {"misses": 1},
                             "misses_not_saved": {"fx_graph": 7}})
    report.add_test("iso", {"cache": "isolated", "fx_graph": {"misses": 1}})
    report.add_test("warm", {"cache": "warm", "fx_graph": {"misses": 5}, "misses_not_saved": {"fx_graph": 3}})
    assert report.misses_in_cold_caches() == {"fx_graph": 3, "aot_autograd": 1}
    assert report.misses_not_saved() == {"fx_graph": 3}


@pytest.mark.parametrize("processes, bundle_path, expected", [
    ([ProcessReport(status=Status.LOADED, own_warmup=True)], "b.bundle", "warmup"),
    ([ProcessReport(status=Status.LOADED, own_warmup=True), ProcessReport(status=Status.LOADED)], "b.bundle", "bundle"),
    ([ProcessReport(status=Status.LOADED)], None, "bundle"),
    ([], None, "warmup"),
    ([], "b.bundle", "bundle"),
], ids=["own-warmup-only", "one-loaded-the-bundle", "loaded-bundle", "nothing-no-bundle", "nothing-with-bundle"])
def test_hits_are_said_to_come_from_the_warmup_only_where_no_process_loaded_the_bundle(
        processes: list[ProcessReport], bundle_path: str | None, expected: str) -> None:
    """``from the bundle`` unless every process that loaded loaded only this session's warmup."""
    assert SessionReport(bundle_path=bundle_path, processes=processes).hits_came_from() == expected


def test_a_save_that_added_artifacts_is_written_and_names_them() -> None:
    """A save that added part of what the bundle holds names the additions, then what it holds."""
    report = SessionReport(saved=SaveResult(SaveStatus.SAVED, artifacts={"inductor": {"count": 3}},
                                            added_artifacts={"inductor": 1}))
    assert report.written_words() == ("written", "added 1 fx_graph; it holds 3 fx_graph")


def test_a_save_that_added_nothing_only_updated_the_record() -> None:
    """Without additions and without a warmup that wrote PATH, the save only recorded use."""
    report = SessionReport(saved=SaveResult(SaveStatus.SAVED, artifacts={"inductor": {"count": 2}}, added=False))
    verb, what = report.written_words()
    assert verb == "updated" and "compiled nothing it lacked" in what and what.endswith("it holds 2 fx_graph")


def test_a_save_after_the_warmup_wrote_the_bundle_says_the_warmup_wrote_it() -> None:
    """Where the warmup wrote PATH itself, the save credits it rather than the tests."""
    report = SessionReport(saved=SaveResult(SaveStatus.SAVED, artifacts={"inductor": {"count": 2}}, added=False),
                           processes=[ProcessReport(wrote_bundle=True)])
    verb, what = report.written_words()
    assert verb == "written" and what.startswith("what the warmup compiled") and what.endswith("2 fx_graph")


def test_session_figures_over_processes() -> None:
    """Warmup seconds add up over processes; header seconds are the longest; the first warmup error is kept."""
    report = SessionReport(processes=[ProcessReport(warmup_seconds=1.5, headers_seconds=2.0),
                                      ProcessReport(warmup_seconds=None, headers_seconds=3.5, warmup_error="boom"),
                                      ProcessReport(warmup_seconds=0.25, warmup_error="later")])
    assert (report.warmup_seconds, report.headers_seconds, report.warmup_failed) == (1.75, 3.5, "boom")


def test_the_building_runs_figures_keep_only_numbers() -> None:
    """``built_tests`` reads the loaded bundle's per-test record and leaves out what is not a number."""
    report = SessionReport(processes=[ProcessReport(history={}),
                                      ProcessReport(history={"tests": {"a": 1, "b": 2.5, "c": "x", "d": None}})])
    assert report.built_tests() == {"a": 1.0, "b": 2.5}


def test_a_session_record_does_not_depend_on_the_order_tests_ran_in() -> None:
    """The digest of the tests that ran is the same in any order and with repeats; other tests change it."""
    one = session_record(1.0, ["b", "a", "a"], 1, 0.5)
    two = session_record(9.0, ["a", "b"], 2, 0.1)
    assert one["digest"] == two["digest"] and one["tests"] == 2
    assert session_record(1.0, ["a", "c"], 1, 0.5)["digest"] != one["digest"]


def _loaded(built: dict[str, Any], ran: set[str], workers: int = 1) -> SessionReport:
    report = SessionReport(bundle_path="b.bundle", session_seconds=5.0, ran=ran)
    report.processes = [ProcessReport(process=f"gw{i}", status=Status.LOADED, history={"session": built})
                        for i in range(workers)]
    return report


def test_no_comparison_without_a_building_record_or_a_test_that_ran() -> None:
    """No comparison where the loaded bundle recorded no session, or this one ran no test."""
    assert _loaded({}, {"t::a"}).compared_with_build() is None
    assert _loaded(session_record(9.0, ["t::a"], 1, 1.0), set()).compared_with_build() is None


@pytest.mark.parametrize("ran, workers, why", [
    ({"t::a", "t::b"}, 1, "this run ran 2 tests, the building run 1 test"),
    ({"t::b"}, 1, "this run ran 1 test, the building run 1 test (other ones)"),
    ({"t::a"}, 2, "this run had 2 processes (xdist workers), the building run 1 process"),
], ids=["more-tests", "other-tests", "more-workers"])
def test_unlike_runs_are_not_compared_and_say_why(ran: set[str], workers: int, why: str) -> None:
    """Other tests, or as many tests in another number of processes, are said, and no saving is claimed."""
    compared = _loaded(session_record(9.0, ["t::a"], 1, 1.0), ran, workers).compared_with_build()
    assert compared is not None and compared.not_compared.startswith(why)
    assert compared.saved == 0.0 and compared.brief() == ""
    assert "session_seconds_saved" not in compared.to_json()


@pytest.mark.parametrize("now, then", [(5.0, 9.0), (9.0, 5.0)], ids=["faster", "slower"])
def test_a_comparison_says_the_difference_in_wall_seconds(now: float, then: float) -> None:
    """``saved`` is then minus now; the words say ``less`` or ``MORE`` with the figure, and JSON keeps it."""
    compared = Comparison(1, 1, now, then, 0.0, 0.0)
    assert compared.saved == then - now
    word = "less" if then > now else "MORE"
    assert f"{abs(then - now):.1f} s {word}" in compared.brief()
    assert compared.to_json()["session_seconds_saved"] == round(then - now, 3)


def test_runs_of_as_many_workers_are_compared_by_the_sessions_wall_clock() -> None:
    """Under xdist the session's clock is the controller's (each worker loaded the same record): the saving is the
    building session's seconds less this one's, not a sum over workers."""
    compared = _loaded(session_record(9.0, ["t::a", "t::b"], 2, 4.0), {"t::a", "t::b"}, 2).compared_with_build()
    assert compared is not None and not compared.not_compared and compared.processes == 2
    assert compared.saved == 9.0 - 5.0 and "on 2 workers" in compared.sentence()


def test_the_report_document_leaves_out_unused_processes_and_cold_tests_building_figures() -> None:
    """Processes that did nothing with the bundle are left out; a cold test gets no building run's figure."""
    report = SessionReport(bundle_path="b.bundle", checked_downloaded=0)
    report.processes = [ProcessReport(process="gw0"),
                        ProcessReport(process="gw1", status=Status.LOADED, history={"tests": {"w": 2.0, "c": 3.0}})]
    report.add_test("w", {"cache": "warm", "compile_seconds": 0.5})
    report.add_test("c", {"cache": "cold", "compile_seconds": 0.5})
    document = report.to_json()
    assert [p["process"] for p in document["bundle"]["processes"]] == ["gw1"]
    assert document["tests"]["w"]["built_compile_seconds"] == 2.0
    assert "built_compile_seconds" not in document["tests"]["c"]
    assert "checked_downloaded_bytes" not in document["bundle"] and "expectations" not in document
    assert document["totals"]["compile_seconds"] == 1.0
