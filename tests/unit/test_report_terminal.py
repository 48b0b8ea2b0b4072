"""The terminal summary, in process: the lines printed for given facts, at the quiet default and under -v. Each test
builds a :class:`SessionReport` directly and reads the lines it renders to."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pytest

from pytest_compilecache.report.model import (
    Concern, Problem, ProcessReport, ReportWritten, SaveResult, SaveStatus, SessionReport, Status)
from pytest_compilecache.report.terminal import (
    SUMMARY_REASONS, attention_lines, bundle_lines, detailed_lines, explained_lines,
    headline, patch_lines, summary_lines)
from pytest_compilecache.stats import CacheStats, stats_from_counts

BUNDLE = "/nowhere/suite.bundle"


def _stats(cache: str = "warm", unobservable: dict[str, str] | None = None, **counts: int) -> dict[str, Any]:
    """One test's counts as a process reports them (``fx_graph__hits=2`` is ``fx_graph.hits``)."""
    flat = {name.replace("__", "."): n for name, n in counts.items()}
    return {**stats_from_counts(flat, unobservable or {}).to_dict(), "cache": cache}


def _loaded() -> SessionReport:
    """A clean run: the bundle loaded, every FX graph hit from it, nothing to save."""
    report = SessionReport(bundle_path=BUNDLE)
    report.processes = [ProcessReport(status=Status.LOADED, reason=f"{BUNDLE}: torch on cpu")]
    report.add_test("t.py::a", _stats(fx_graph__hits=2, fx_graph__from_bundle=2))
    report.saved = SaveResult(SaveStatus.KEPT, f"{BUNDLE} existed; every compile hit: nothing to add to it")
    return report


def _written() -> SessionReport:
    """A clean building run: the bundle written with what the tests compiled."""
    report = SessionReport(bundle_path=BUNDLE)
    report.processes = [ProcessReport(status=Status.MISSING, reason="no file yet", warmup_seconds=1.0)]
    report.add_test("t.py::a", _stats(fx_graph__misses=1))
    report.saved = SaveResult(SaveStatus.SAVED, path=BUNDLE, artifacts={"inductor": {"count": 1, "bytes": 10}},
                              bytes=2_000_000, seconds=0.1, added_artifacts={"inductor": 1})
    return report


def _session_only() -> SessionReport:
    """A clean run with a warmup and no bundle."""
    report = SessionReport()
    report.processes = [ProcessReport(status=Status.LOADED, own_warmup=True, warmup_seconds=2.5)]
    report.add_test("t.py::a", _stats(fx_graph__hits=1))
    return report


CLEAN: dict[str, Callable[[], SessionReport]] = {"loaded": _loaded, "written": _written, "session-only": _session_only}


@pytest.mark.parametrize("make", CLEAN.values(), ids=list(CLEAN))
def test_a_clean_run_says_one_line_by_default(make: Callable[[], SessionReport]) -> None:
    """Where all is well, the default summary is the headline alone."""
    report = make()
    assert summary_lines(report, 0) == [headline(report)] and headline(report)


@pytest.mark.parametrize("make", CLEAN.values(), ids=list(CLEAN))
def test_a_clean_run_says_nothing_when_quiet(make: Callable[[], SessionReport]) -> None:
    """``-q`` prints only what needs attention: nothing, in a clean run."""
    assert summary_lines(make(), -1) == []


@pytest.mark.parametrize("level", [-1, 0, 1])
@pytest.mark.parametrize("concern", [Concern.BUNDLE, Concern.SAVING, Concern.REMOTE, Concern.REPORT])
def test_a_problem_seen_everywhere_is_said_once_naming_its_file(concern: Concern, level: int) -> None:
    """A problem that the session and two workers saw is one ``PROBLEM:`` line, at every level, with its file."""
    report = _loaded()
    where = "/nowhere/report.json" if concern is Concern.REPORT else BUNDLE
    problem = Problem(concern, f"{where}: something went wrong", where)
    report.problems.append(problem)
    report.processes += [ProcessReport(process="gw0", problems=[problem]), ProcessReport(process="gw1", problems=[problem])]
    said = [line for line in summary_lines(report, level) if "something went wrong" in line]
    assert said == [f"PROBLEM: {where}: something went wrong"]


@pytest.mark.parametrize("level", [-1, 0, 1])
def test_a_carried_binary_not_used_is_said_once_at_every_level(level: int) -> None:
    """Binary problems are said apart from the others, once each, not as ``PROBLEM``."""
    report = _loaded()
    binary = Problem(Concern.BINARY, f"{BUNDLE}: ab/x.so fails its checksum; not used", BUNDLE)
    report.processes[0].problems = [binary, binary]
    said = [line for line in summary_lines(report, level) if "x.so" in line]
    assert said == [f"C++ binary not used: {binary.text}"]


@pytest.mark.parametrize("level", [-1, 0, 1])
def test_a_failed_warmup_says_its_traceback_once_and_not_again_as_a_problem(level: int) -> None:
    """The failure's block carries the error indented; its own warmup problem is not repeated."""
    report = _loaded()
    report.processes[0] = ProcessReport(status=Status.WARMUP_FAILED, warmup_error="Traceback:\n  boom\nValueError: x\n",
                                        problems=[Problem(Concern.WARMUP, "the warmup hook failed: ValueError: x")])
    lines = summary_lines(report, level)
    start = lines.index("WARMUP FAILED (this run's warm_cache tests skip):")
    assert lines[start + 1:start + 4] == ["  Traceback:", "    boom", "  ValueError: x"]
    assert not any("the warmup hook failed" in line for line in lines)


def test_reasons_not_saved_are_said_once_over_all_processes() -> None:
    """Two workers that left the same thing out of the bundle give one ``not saved:`` line."""
    report = _loaded()
    report.processes = [ProcessReport(process=f"gw{i}", not_saved=["a graph with a hook", f"only in gw{i}"])
                        for i in range(2)]
    assert [line for line in attention_lines(report) if line.startswith("not saved:")] == [
        "not saved: a graph with a hook", "not saved: only in gw0", "not saved: only in gw1"]


def test_a_bundle_left_alone_is_said_even_when_quiet() -> None:
    """A save that did not go as asked (left alone) needs attention: said under -q."""
    report = _loaded()
    report.saved = SaveResult(SaveStatus.LEFT_ALONE, f"{BUNDLE} was neither used nor written")
    assert f"bundle left alone: {BUNDLE} was neither used nor written" in summary_lines(report, -1)


@pytest.mark.parametrize("reason, said", [
    ("an update was asked (--compile-cache-update) but the tests failed", True),
    ("every compile hit: nothing to add to it", False),
], ids=["update-asked", "nothing-to-add"])
def test_a_kept_bundle_needs_attention_only_where_an_update_was_asked(reason: str, said: bool) -> None:
    """``bundle kept`` is said quietly only where the user asked for an update that did not happen."""
    report = _loaded()
    report.saved = SaveResult(SaveStatus.KEPT, reason)
    assert (f"bundle kept: {reason}" in attention_lines(report)) is said


@pytest.mark.parametrize("hits, from_bundle, misses", [(3, 3, 0), (2, 1, 4), (0, 0, 1)])
def test_the_headline_counts_the_fx_graphs(hits: int, from_bundle: int, misses: int) -> None:
    """The headline's FX figures are the tests' totals, and where the hits came from."""
    report = _loaded()
    report.tests.clear()
    report.totals = None
    report.add_test("t.py::a", _stats(fx_graph__hits=hits, fx_graph__from_bundle=from_bundle, fx_graph__misses=misses))
    came = f" ({from_bundle} from the bundle)" if from_bundle else ""
    assert f"FX graphs: {hits} hit{came}, {misses} missed" in headline(report)


@pytest.mark.parametrize("cold_misses, said", [(2, " (all in cold_cache or isolated tests)"),
                                               (1, " (1 in cold_cache or isolated tests)")])
def test_misses_in_caches_that_start_empty_are_told_apart(cold_misses: int, said: str) -> None:
    """The headline says how many of the misses happened in caches empty by design."""
    report = SessionReport()
    report.add_test("t.py::cold", _stats("cold", fx_graph__misses=cold_misses))
    report.add_test("t.py::warm", _stats(fx_graph__misses=2 - cold_misses))
    assert headline(report) == f"FX graphs: 0 hit, 2 missed{said}"


def test_graph_breaks_and_recompiles_join_the_headline_only_when_counted() -> None:
    """Dynamo's breaks and recompiles are named where there were any, not as zeros."""
    report = SessionReport()
    report.add_test("t.py::a", _stats(fx_graph__hits=1))
    assert "graph breaks" not in headline(report) and "recompiles" not in headline(report)
    report.add_test("t.py::b", _stats(fx_graph__hits=1, dynamo__graph_breaks=2, dynamo__recompiles=3))
    assert headline(report).endswith(", 2 graph breaks, 3 recompiles")


def test_an_unobservable_fx_layer_says_why_instead_of_counts() -> None:
    """FX graphs that cannot be observed are said with the reason, never as zeros."""
    report = SessionReport()
    report.add_test("t.py::a", _stats(unobservable={"fx_graph": "torch too old"}, aot_autograd__hits=1))
    assert headline(report) == "FX graphs not observable: torch too old"


def test_a_run_that_counted_tests_but_compiled_nothing_says_so() -> None:
    """Counted tests with no compile say it in one line, not as a table of zeros."""
    report = SessionReport()
    report.add_test("t.py::a", _stats())
    assert summary_lines(report, 0) == ["no counted test compiled anything"]


def test_dynamos_reasons_beyond_the_limit_are_counted_not_listed() -> None:
    """Under -v, the first reasons of each kind are listed, the rest counted."""
    reasons = {f"dynamo.recompile_reason/reason {i}": 1 for i in range(SUMMARY_REASONS + 3)}
    report = SessionReport()
    report.add_test("t.py::a", {**stats_from_counts({"fx_graph.hits": 1, **reasons}, {}).to_dict(), "cache": "warm"})
    text = "\n".join(detailed_lines(report))
    assert f"recompile: reason {SUMMARY_REASONS - 1}" in text and f"recompile: reason {SUMMARY_REASONS}" not in text
    assert "... and 3 more reasons, per test in --compile-cache-report" in text


def test_explanations_beyond_the_limit_are_counted_not_listed() -> None:
    """Explained misses: the layer's summary, the first explanations, and how many more."""
    texts = {f"fx_graph.explanation/why {i}": 1 for i in range(SUMMARY_REASONS + 2)}
    totals = stats_from_counts({"fx_graph.misses": 7, "fx_graph.miss_kind/new code": 7, **texts}, {})
    lines = explained_lines(totals)
    assert lines[:2] == ["misses explained:", f"  fx_graph: {SUMMARY_REASONS + 2} misses explained: 7 new code"]
    assert [line.strip() for line in lines[2:-1]] == [f"why {i}" for i in range(SUMMARY_REASONS)]
    assert lines[-1] == "    ... and 2 more, per test in --compile-cache-report"


def test_no_explanations_no_lines() -> None:
    """A run that explained no miss adds no heading."""
    assert explained_lines(stats_from_counts({"fx_graph.misses": 2}, {})) == []


def test_what_was_loaded_is_said_with_its_figures() -> None:
    """Under -v, the loaded artifacts, their size and time come from the process's facts."""
    report = _loaded()
    report.processes[0].loaded, report.processes[0].loaded_bytes = {"aot_autograd": 1, "inductor": 3}, 4_560_000
    report.processes[0].load_seconds = 0.123
    assert "  loaded 3 fx_graph, 1 aot_autograd (4.56 MB of compiled artifacts in 0.12 s)" in bundle_lines(report)


def test_what_was_read_on_demand_is_said_as_a_part_of_what_the_entry_holds() -> None:
    """On-demand reading says, per layer, how many of the entry's artifacts were asked for."""
    report = _loaded()
    report.processes[0].on_demand, report.processes[0].placed = {"inductor": 5}, {"inductor": 2}
    report.processes[0].placed_bytes = 1_500_000
    assert ("  on demand: 2 of 5 fx_graph read when needed (1.50 MB unpacked into the cache folder)"
            in bundle_lines(report))


@pytest.mark.parametrize("downloaded", [0, 3_250_000])
def test_a_bundle_url_says_what_it_downloaded(downloaded: int) -> None:
    """A URL's process says the megabytes downloaded, or that everything was on this machine already."""
    url = "s3://bucket/suite.bundle"
    report = SessionReport(bundle_path=url)
    report.processes = [ProcessReport(status=Status.LOADED, reason=f"{url}: torch on cpu", downloaded_bytes=downloaded)]
    lines = bundle_lines(report)
    if downloaded:
        assert f"  downloaded {downloaded / 1e6:.2f} MB from {url}" in lines
    else:
        assert "  nothing downloaded: every part of it the tests used was on this machine already" in lines


@pytest.mark.parametrize("made, folders, said", [
    ("", 0, "report written: /r/out.json"),
    ("/r", 1, "report written: /r/out.json (made the folder /r for it)"),
    ("/r", 3, "report written: /r/out.json (made 3 folders for it, from /r)"),
], ids=["no-folder", "one-folder", "three-folders"])
def test_the_report_line_says_the_folders_made_for_it(made: str, folders: int, said: str) -> None:
    """Under -v, where the report went and the folders made for it."""
    report = _loaded()
    report.written = ReportWritten("/r/out.json", made, folders)
    assert detailed_lines(report)[-1] == said


def test_a_bundle_inside_the_current_folder_is_named_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The headline names a bundle under the current folder by its relative path; one outside stays whole."""
    monkeypatch.chdir(tmp_path)
    inside = _loaded()
    inside.bundle_path = str(tmp_path / "sub" / "x.bundle")
    assert headline(inside).startswith(f"bundle {os.path.join('sub', 'x.bundle')} loaded")
    assert headline(_loaded()).startswith(f"bundle {BUNDLE} loaded")


def test_a_bundle_not_loaded_says_its_status_and_why() -> None:
    """A bundle that was not used, with no problem, says what became of it and the reason."""
    report = SessionReport(bundle_path=BUNDLE)
    report.processes = [ProcessReport(status=Status.INCOMPATIBLE, reason="no entry for torch 2.9 on cpu")]
    assert headline(report) == f"bundle {BUNDLE} incompatible: no entry for torch 2.9 on cpu"


@pytest.mark.parametrize("saved, said", [
    (SaveResult(SaveStatus.UNCHANGED, seconds=0.25), f"bundle unchanged: {BUNDLE} already holds everything this run "
                                                     "compiled (0.25 s)"),
    (SaveResult(SaveStatus.FAILED, "disk full"), "bundle failed: disk full"),
], ids=["unchanged", "failed"])
def test_the_saves_outcome_is_its_last_bundle_line(saved: SaveResult, said: str) -> None:
    """Under -v, the save's status and its figures or reason."""
    report = _loaded()
    report.saved = saved
    assert bundle_lines(report)[-1] == said


def test_artifacts_dropped_as_unused_are_counted() -> None:
    """A save that dropped unused artifacts says how many, by layer."""
    report = _written()
    report.saved.dropped_unused = {"inductor": 2, "aot_autograd": 1}
    assert ("  dropped as unused in the last updating runs (compile_cache_max_unused_runs): 2 fx_graph, "
            "1 aot_autograd") in bundle_lines(report)


def test_compile_time_says_the_warmup_and_workers() -> None:
    """The compile time line sums the tests' seconds, says it sums over workers, and adds the warmup."""
    report = SessionReport(processes=[ProcessReport(process="gw0", warmup_seconds=1.25), ProcessReport(process="gw1")])
    report.add_test("a", {"compile_seconds": 2.0})
    report.add_test("b", {"compile_seconds": 0.5})
    (line,) = [line for line in detailed_lines(report) if line.startswith("compile time in tests")]
    assert line.startswith("compile time in tests: 2.5 s of wall time") and "; summed over workers)" in line
    assert line.endswith(", plus 1.2 s in the warmup")


def _patched(took: list[str], missed: dict[str, str], off: dict[str, str]) -> SessionReport:
    status = {"torch": "2.9.0", "newer": False, "took": took, "missed": missed, "features_off": off}
    return SessionReport(processes=[ProcessReport(patches=status)])


def test_verbose_patch_lines_count_the_patches_and_name_those_not_said_as_features_off() -> None:
    """Under -v: how many took and did not; a miss a feature already names is not listed again."""
    report = _patched(["a", "b"], {"c": "no such attribute", "d": "gone"}, {"pgo counts": "d: gone"})
    assert patch_lines(report, verbose=True) == [
        "torch patches (torch 2.9.0): 2 took, 2 did not",
        "off on torch 2.9.0: pgo counts (d: gone)", "  not taken: c: no such attribute"]
    assert patch_lines(report, verbose=False) == ["off on torch 2.9.0: pgo counts (d: gone)"]


def test_no_patch_lines_where_torchs_compiler_was_never_set_up() -> None:
    """A session whose processes never set torch up says nothing of patches, even under -v."""
    assert patch_lines(SessionReport(processes=[ProcessReport()]), verbose=True) == []


def test_no_counted_test_under_verbose_says_how_tests_are_counted() -> None:
    """Under -v, a run with no counted test says what makes a test counted, not an empty table."""
    assert detailed_lines(SessionReport())[0].startswith("no counted test compiled anything (a test is counted when")


def test_per_layer_totals_under_verbose_carry_the_figures() -> None:
    """Under -v, the per-layer table holds the session's totals."""
    report = SessionReport()
    report.add_test("a", _stats(fx_graph__hits=4, fx_graph__misses=1))
    report.add_test("b", _stats(fx_graph__hits=3))
    assert report.totals == CacheStats.from_dict(_stats(fx_graph__hits=7, fx_graph__misses=1))
    table = detailed_lines(report)[1]
    fx_row = next(line.split() for line in table.splitlines() if line.strip().startswith("fx_graph"))
    assert fx_row[:4] == ["fx_graph", "7", "1", "0"]
