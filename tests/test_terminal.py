"""The terminal summary's levels, rendered from a report with no torch and no pytest run: one line when all is well,
problems always, everything under -v; and the comparison with the bundle's building run, like with like."""

from __future__ import annotations

from pytest_compilecache.report.model import (
    Comparison, Concern, Problem, ProcessReport, SaveResult, SaveStatus, SessionReport, Status)
from pytest_compilecache.report.terminal import summary_lines
from pytest_compilecache.stats import stats_from_counts


def warm_report(**session: float) -> SessionReport:
    """Two tests that hit the bundle, loaded from ``/b/suite.bundle`` whose building run took ``session``."""
    built = {"seconds": 20.0, "tests": 2, "processes": 1, "compile_seconds": 15.0, **session}
    report = SessionReport(bundle_path="/b/suite.bundle", session_seconds=8.0)
    report.processes.append(ProcessReport(status=Status.LOADED, reason="/b/suite.bundle: torch on cpu",
                                          history={"session": built}))
    for test in ("t.py::a", "t.py::b"):
        report.ran.add(test)
        report.add_test(test, {**stats_from_counts({"fx_graph.hits": 1, "fx_graph.from_bundle": 1},
                                                   {"triton": "no GPU"}).to_dict(), "cache": "warm"})
    report.saved = SaveResult(SaveStatus.KEPT, "/b/suite.bundle existed; every compile hit: nothing to add to it")
    built_digest = report.session_record(0)["digest"]
    report.processes[0].history["session"]["digest"] = built_digest
    return report


def test_all_well_is_one_line_and_quiet_is_nothing() -> None:
    report = warm_report()
    (line,) = summary_lines(report, 0)
    assert "bundle /b/suite.bundle loaded, unchanged" in line and "FX graphs: 2 hit (2 from the bundle)" in line
    assert "8.0 s against 20.0 s in the run that built the bundle (12.0 s less)" in line
    assert summary_lines(report, -1) == []
    detailed = "\n".join(summary_lines(report, 1))
    assert "per-layer totals over all tests" in detailed and "Dynamo over all tests" in detailed


def test_a_problem_is_said_at_every_level_once() -> None:
    report = warm_report()
    report.problems.append(Problem(Concern.BUNDLE, "/b/suite.bundle: member fx_graph/abc is damaged"))
    for level in (-1, 0, 1):
        said = [line for line in summary_lines(report, level) if "is damaged" in line]
        assert said == ["PROBLEM: /b/suite.bundle: member fx_graph/abc is damaged"], (level, said)


def test_headers_built_in_one_run_only_are_left_out_of_both() -> None:
    # A fresh runner builds torch's headers (5.3 s) that the building run found in its home: not a cost of the bundle.
    fresh = Comparison(2, 1, seconds_now=10.5, seconds_then=9.3, compile_now=6.0, compile_then=5.0,
                       headers_now=5.3, headers_then=0.0)
    assert fresh.saved == 9.3 - 5.2
    assert "MORE" not in fresh.sentence() and "leaving out the 5.3 s this run spent" in fresh.sentence()
    alike = Comparison(2, 1, 10.5, 9.3, 6.0, 5.0, headers_now=5.3, headers_then=5.0)
    assert round(alike.saved, 6) == -1.2 and "1.2 s MORE" in alike.sentence() and "leaving out" not in alike.sentence()


def test_the_building_runs_headers_come_from_its_record() -> None:
    report = warm_report(headers_seconds=7.1)
    compared = report.compared_with_build()
    assert compared is not None and compared.headers_then == 7.1 and compared.headers_differ
    assert "8.0 s against 12.9 s in the run that built the bundle (4.9 s less; leaving out the 7.1 s that run spent building" in summary_lines(report, 0)[0]


def test_a_bundle_that_could_not_be_used_is_never_called_loaded() -> None:
    # The session's own warmup loaded in its place: the summary said "bundle bad.bundle: loaded".
    report = SessionReport(bundle_path="/b/bad.bundle")
    report.processes.append(ProcessReport(status=Status.LOADED, own_warmup=True, reason="this session's warmup"))
    report.problems.append(Problem(Concern.BUNDLE, "/b/bad.bundle: truncated: the artifacts lie past the end"))
    report.saved = SaveResult(SaveStatus.LEFT_ALONE, "/b/bad.bundle was neither used nor written (see PROBLEM below)")
    line, *rest = summary_lines(report, 0)
    assert "loaded" not in line and "bundle /b/bad.bundle not used (see PROBLEM below)" in line, line
    assert sum("truncated" in text for text in rest) == 1, rest


def test_a_written_bundle_says_what_it_holds_not_only_what_was_added() -> None:
    report = SessionReport(bundle_path="/b/new.bundle")
    report.processes.append(ProcessReport(status=Status.LOADED, wrote_bundle=True))
    report.saved = SaveResult(SaveStatus.SAVED, path="/b/new.bundle", bytes=310_000, added_artifacts={"inductor": 1},
                              artifacts={"inductor": {"count": 4, "bytes": 1}, "aot_autograd": {"count": 4, "bytes": 1}})
    (line,) = summary_lines(report, 0)
    assert "bundle /b/new.bundle written (holds 4 fx_graph, 4 aot_autograd; 0.31 MB)" in line, line


def test_a_run_whose_tests_were_not_counted_does_not_say_none_compiled() -> None:
    # A plain test that compiles is not counted without a fixture or a session-wide option.
    assert summary_lines(SessionReport(), 0) == []
    assert "no counted test compiled anything" in summary_lines(SessionReport(), 1)[0]


def test_an_update_says_what_it_added_and_a_url_is_left_whole() -> None:
    report = SessionReport(bundle_path="s3://bucket/suite.bundle", bundle_existed=True)
    report.processes.append(ProcessReport(status=Status.LOADED, warmup_seconds=1.0))
    report.saved = SaveResult(SaveStatus.SAVED, path="s3://bucket/suite.bundle", bytes=310_000,
                              added_artifacts={"inductor": 1}, artifacts={"inductor": {"count": 4, "bytes": 1}})
    (line,) = summary_lines(report, 0)
    assert "bundle s3://bucket/suite.bundle updated (added 1 fx_graph; holds 4 fx_graph; 0.31 MB)" in line, line


def test_a_torch_newer_than_the_register_and_a_wrapper_fault_in_any_process_are_said_once() -> None:
    from pytest_compilecache.report.model import ProcessReport
    from pytest_compilecache.report.terminal import patch_lines

    def process(name: str, features_off: dict[str, str]) -> ProcessReport:
        status = {"torch": "2.16.0", "newer": True, "took": ["a"], "missed": {}, "faults": {},
                  "features_off": features_off}
        return ProcessReport(process=name, patches=status)

    report = SessionReport()
    report.processes = [process("main", {}), process("gw0", {"pgo layer counts": "x failed (KeyError: 1)"})]
    lines = patch_lines(report, verbose=False)
    assert lines == ["torch 2.16.0 is newer than any release the register of patches was checked on (2.15.0): a "
                     "feature it cannot take is said below, if any",
                     "off on torch 2.16.0: pgo layer counts (x failed (KeyError: 1))"]
