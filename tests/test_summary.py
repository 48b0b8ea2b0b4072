"""The terminal summary says what happened, never a silent zero, and each thing once."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Callable

import pytest

from helpers import WARMUP_CONFTEST, BuildBundle, torch_builds_precompiled_headers
from pytest_compilecache.bundle.format import parse

pytestmark = pytest.mark.floors

WARM_TEST = """
import torch
from conftest import f

def test_warm(warm_cache):
    torch.compile(f)(torch.randn(8))
    warm_cache.assert_hits(fx_graph=1, aot_autograd=1)
    assert warm_cache.stats.aot_autograd.from_bundle == 1  # the entry came from the bundle

def test_cold(cold_cache):
    torch.compile(lambda x: x.cos() + 1)(torch.randn(4))
    cold_cache.assert_misses(fx_graph=1)
"""


@pytest.mark.parametrize("workers", [pytest.param([], id="serial", marks=pytest.mark.slow),
                                     pytest.param(["-n", "2"], id="n2")])
def test_fixture_runs_without_options_summarise_real_counts(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], workers: list[str]
) -> None:
    """Only fixtures used (no bundle, isolation or report): the table holds the counts the report has.

    With two workers, the warmup is not called a bundle and the summary says how to keep it: a second
    newcomer, with ``warm_cache`` tests and no ``--compile-cache-bundle``, read "bundle (main): warmed up
    here, then loaded: /tmp/pytest-of-root/.../session.bundle", about a bundle never asked for, and found
    every run paying the whole warmup. One worker ran it, the other loaded it."""
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=WARM_TEST)
    plain = run_inner(*workers)
    plain.assert_outcomes(passed=2)
    reported = run_inner(*workers, "--compile-cache-report=report.json")
    reported.assert_outcomes(passed=2)
    totals = json.loads((pytester.path / "report.json").read_text())["totals"]
    assert totals["fx_graph"]["hits"] == 1 and totals["fx_graph"]["misses"] == 1
    text = plain.stdout.str()
    summary = text[text.index("compilecache"):]
    plain.stdout.fnmatch_lines(["*fx_graph*1*1*", "Dynamo over all tests*"])
    assert "compile time in tests: 0.0 s" not in summary
    assert "autotune      0" not in summary  # a GPU-only layer on CPU is '-', never 0
    assert "misses in tests whose cache starts empty by design (cold_cache, --compile-cache-isolate), of all " \
           "misses: fx_graph 1 of 1, aot_autograd 1 of 1" in summary, summary
    # "summed over workers" only where there were workers (a newcomer read it in a serial run)
    assert ("summed over workers" in summary) is bool(workers), summary
    if workers:
        summary = _summary(plain)
        assert "session.bundle" not in summary and "bundle (" not in summary, summary
        assert "warmup (" in summary and "ran here" in summary and \
            "loaded what this session's warmup compiled" in summary, summary
        assert "for this session's warm_cache tests only; --compile-cache-bundle=PATH keeps it for later runs" \
               in summary, summary


@pytest.mark.parametrize(("source", "args", "outcome"), [
    ("def test_plain():\n    pass\n", ["--compile-cache-report=report.json"], {"passed": 1}),
    ("def test_warm(warm_cache):\n    pass\n", [], {"skipped": 1}),
], ids=["no-torch", "warm-skipped"])
def test_no_compile_prints_no_table_of_zeros(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], source: str, args: list[str],
    outcome: dict[str, int],
) -> None:
    """Tests that compiled nothing (never imported torch, or skipped for want of a bundle) have nothing to tabulate."""
    pytester.makepyfile(test_plain=source)
    result = run_inner(*args)
    result.assert_outcomes(**outcome)
    text = result.stdout.str()
    assert "per-layer totals" not in text and "compile time in tests: 0.0 s" not in text, text
    result.stdout.fnmatch_lines(["*no counted test compiled anything*"])


def _summary(result: pytest.RunResult) -> str:
    text = result.stdout.str()
    return text[text.index("= compilecache ="):]


@pytest.fixture(scope="module")
def built_bundle(build_bundle: BuildBundle) -> bytes:
    """The bytes of a real bundle built by a session with the warmup hook (read by the cases below)."""
    return build_bundle({"conftest.py": WARMUP_CONFTEST, "test_model.py": WARM_TEST}).read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize(("case", "update"), [
    ("text", []), ("truncated", ["--compile-cache-update"]),
    ("corrupt", ["--compile-cache-update"]), ("corrupt", []),
], ids=["text-no-update", "truncated-update", "corrupt-update", "corrupt-no-update"])
def test_an_unreadable_bundle_still_warms_up_and_is_left_alone_said_once(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], built_bundle: bytes,
    case: str, update: list[str],
) -> None:
    """Not a bundle, truncated, or damaged inside (an entry's table of artifacts zeroed): the warmup runs, the
    file is left as it was, and it is said once. ``--compile-cache-update`` changes nothing once a bundle is
    found unusable (``saving.save`` and ``writes_bundle`` look at that first), so each kind runs once, and the
    damage inside, both with and without it."""
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=WARM_TEST)
    read = parse(io.BytesIO(built_bundle), Path("built.bundle"))
    table = read._start + read.entries[0].offset  # the entry's table of artifacts: nothing of it can be used
    bad = {"text": b"just some notes\n", "truncated": built_bundle[: len(built_bundle) // 2],
           "corrupt": built_bundle[:table] + bytes(200) + built_bundle[table + 200:]}[case]
    path = pytester.path / "b.bundle"
    path.write_bytes(bad)
    result = run_inner("-v", "--compile-cache-bundle=b.bundle", "--compile-cache-report=r.json", *update,
                       ini=f"compile_cache_home = {pytester.path / 'home'}")
    result.assert_outcomes(passed=2)
    summary = _summary(result)
    assert path.read_bytes() == bad
    # Told when found (by the header's first look, or where only loading finds it, then), before the first test, once.
    lines = result.stdout.lines
    told = [i for i, line in enumerate(lines) if "cannot be used" in line and not line.startswith("PROBLEM")]
    first_test = next(i for i, line in enumerate(lines) if "PASSED" in line)
    assert len(told) == 1 and told[0] < first_test, "\n".join(lines)
    assert lines[told[0]].startswith((f"compilecache: bundle {path}: cannot be used (see PROBLEM",
                                      f"compilecache: {path} cannot be used: the warmup runs in its place")), lines[told[0]]
    assert f"warmup: ran here: " in summary and f"; {path} could not be used (see PROBLEM below)" in summary, summary
    assert "session.bundle" not in summary, summary
    # Its hits came from the session's warmup, not from the bundle left alone (a newcomer).
    assert "from warmup" in summary and "from bundle" not in summary, summary
    assert "add --compile-cache-update" not in summary
    assert "bundle left alone" in summary
    problems = [line for line in summary.splitlines() if line.startswith("PROBLEM:")]
    assert len(problems) == 1, summary
    assert str(path) in problems[0]
    # The report says the same problem once, typed: what it concerns and the file it is about.
    report = json.loads((pytester.path / "r.json").read_text())["bundle"]
    assert report["problems"] == [problems[0].removeprefix("PROBLEM: ")]
    (detail,) = report["problem_details"]
    assert detail["concern"] == "bundle" and Path(detail["where"]).resolve() == path.resolve(), detail
    assert detail["text"] == report["problems"][0]


@pytest.mark.parametrize("update", [["--compile-cache-update"], []], ids=["update", "no-update"])
@pytest.mark.slow
def test_an_empty_bundle_file_is_a_bundle_to_create(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], update: list[str]
) -> None:
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=WARM_TEST)
    path = pytester.path / "b.bundle"
    path.write_bytes(b"")
    result = run_inner("--compile-cache-bundle=b.bundle", *update, ini=f"compile_cache_home = {pytester.path / 'home'}")
    result.assert_outcomes(passed=2)
    summary = _summary(result)
    assert "warmup ran here" in summary and "PROBLEM" not in summary, summary
    assert "bundle: warmed up here, then loaded:" in summary, "a newcomer read a building run's bare 'loaded'"
    assert f"bundle written: {path}: what the warmup compiled" in summary, summary
    assert path.stat().st_size > 0


@pytest.mark.parametrize("rebuild", [[], ["--compile-cache-rebuild"]], ids=["plain", "rebuild"])
@pytest.mark.slow
def test_a_bundle_path_under_a_file_is_one_problem(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], rebuild: list[str]
) -> None:
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=WARM_TEST)
    (pytester.path / "afile").write_text("not a folder")
    result = run_inner("--compile-cache-bundle=afile/b.bundle", *rebuild,
                       ini=f"compile_cache_home = {pytester.path / 'home'}")
    result.assert_outcomes(passed=2)
    summary = _summary(result)
    problems = [line for line in summary.splitlines() if line.startswith("PROBLEM:")]
    assert len(problems) == 1, summary
    assert f"{pytester.path / 'afile'} is a file, not a folder" in problems[0]
    (left_alone,) = [line for line in summary.splitlines() if "bundle left alone" in line]
    assert "move the file away" not in left_alone and "--compile-cache-rebuild" not in left_alone, left_alone
    assert "there is no file there to move: name another path" in left_alone, left_alone


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "n2"])
@pytest.mark.slow
def test_warnings_while_preparing_the_bundle_go_to_pytests_summary(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], workers: list[str]
) -> None:
    pytester.makeconftest(WARMUP_CONFTEST + """
import warnings

def pytest_compilecache_warmup(cache):
    warnings.warn("raised while warming up", UserWarning)
    torch.compile(f)(torch.randn(8))
""")
    pytester.makepyfile(test_model=WARM_TEST)
    result = run_inner(*workers, "--compile-cache-bundle=b.bundle", ini=f"compile_cache_home = {pytester.path / 'home'}")
    result.assert_outcomes(passed=2)
    assert "raised while warming up" not in result.stderr.str()
    result.stdout.fnmatch_lines(["*warnings summary*", "*UserWarning: raised while warming up*"])


def test_with_pytests_warnings_plugin_off_the_plugin_captures_no_warning(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    """``-p no:warnings`` means Python's own handling (stderr), for the plugin's work as for tests: a
    newcomer saw a warnings summary that pytest itself no longer prints."""
    pytester.makeconftest(WARMUP_CONFTEST + """
import warnings

def pytest_compilecache_warmup(cache):
    warnings.warn("raised while warming up", UserWarning)
    torch.compile(f)(torch.randn(8))
""")
    pytester.makepyfile(test_model=WARM_TEST)
    result = run_inner("-p", "no:warnings", "--compile-cache-bundle=b.bundle",
                       ini=f"compile_cache_home = {pytester.path / 'home'}")
    result.assert_outcomes(passed=2)
    assert "warnings summary" not in result.stdout.str()
    assert "UserWarning: raised while warming up" in result.stderr.str()


def test_a_warning_made_an_error_while_preparing_the_bundle_is_one_problem_not_an_internal_error(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    """``-W error::DeprecationWarning`` (or ``filterwarnings = error``) with a warning raised while the
    bundle is prepared outside any test (torch's own on import, or the warmup's): one problem naming
    the warning, never pytest's INTERNALERROR."""
    pytester.makeconftest(WARMUP_CONFTEST + """
import warnings

def pytest_compilecache_warmup(cache):
    warnings.warn("deprecated while warming up", DeprecationWarning)
""")
    pytester.makepyfile(test_model=WARM_TEST)
    result = run_inner("-W", "error::DeprecationWarning", "--compile-cache-bundle=b.bundle", "-rs",
                       ini=f"compile_cache_home = {pytester.path / 'home'}")
    text = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in text, text
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), text  # tests that import the
    # compiler meet the same error as in a run without the plugin; the run itself goes on
    if "turn into an error: DeprecationWarning" in text:  # torch warned on import (2.13's torch.jit does)
        assert text.count("turn into an error: DeprecationWarning") == 1, text
    else:  # a torch that imports quietly: the warmup's own warning fails the warmup, said as such
        assert "deprecated while warming up" in text and "WARMUP FAILED" in text, text
    assert not (pytester.path / "b.bundle").exists()


def test_a_warm_run_compares_its_session_with_the_building_runs_only_where_they_are_alike() -> None:
    """The saving claimed is the session's wall clock against the building run's, where both ran the same
    tests in as many processes; the first test of a process is said to carry torch's one-off start-up."""
    from pytest_compilecache.report.model import ProcessReport, SessionReport, Status, session_record
    from pytest_compilecache.report.terminal import summary_lines

    def summary(ran: set[str]) -> str:
        report = SessionReport(bundle_path="b.bundle", session_seconds=12.0, ran=ran)
        built = session_record(30.0, ["t::a"], 1, 22.0)
        report.processes = [ProcessReport(status=Status.LOADED, reason="b.bundle: here",
                                          history={"session": built, "tests": {"t::a": 2.0}})]
        report.add_test("t::a", {"compile_seconds": 7.5, "first_in_process": True})
        return "\n".join(summary_lines(report))

    text = summary({"t::a"})
    assert "this session against the run that built the bundle (the same test): 12.0 s now, 30.0 s then " \
           "(18.0 s less)" in text, text
    assert "compiling in tests and the warmup: 7.5 s now, 22.0 s then" in text, text
    assert "7.5 s in the first compiling test of each process, which pays torch's one-off start-up" in text, text
    other = summary({"t::a", "t::b"})
    assert "not compared with the run that built the bundle: this run ran 2 tests, the building run 1 test" in other
    assert "less" not in other and "MORE" not in other, other


@pytest.mark.slow
def test_rebuild_over_a_file_that_is_not_a_bundle_warms_up_and_leaves_it_alone(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    """--compile-cache-rebuild never writes over a file that is not a bundle: the warmup publishes to the
    session's own bundle, warm_cache tests run, and the advice does not offer --rebuild again."""
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=WARM_TEST)
    path = pytester.path / "text.bundle"
    path.write_bytes(b"hello, not a bundle\n")
    result = run_inner("-rs", "--compile-cache-bundle=text.bundle", "--compile-cache-rebuild",
                       ini=f"compile_cache_home = {pytester.path / 'home'}")
    result.assert_outcomes(passed=2)
    summary = _summary(result)
    assert path.read_bytes() == b"hello, not a bundle\n"
    # A newcomer read "bundle: warmed up here, then loaded: /tmp/pytest-of-root/.../session.bundle".
    assert "session.bundle" not in summary, summary
    assert f"warmup: ran here: " in summary and f"; {path} could not be used (see PROBLEM below): what it " \
           "compiled is for this session's warm_cache tests only" in summary, summary
    assert "bundle left alone" in summary and "nothing was compiled" not in summary, summary
    assert "--compile-cache-rebuild writes" not in summary, summary
    problems = [line for line in summary.splitlines() if line.startswith("PROBLEM:")]
    assert len(problems) == 1 and str(path) in problems[0], summary


@pytest.mark.slow
def test_rebuild_writes_a_fresh_bundle_over_a_damaged_one(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], built_bundle: bytes
) -> None:
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=WARM_TEST)
    path = pytester.path / "b.bundle"
    path.write_bytes(built_bundle[: len(built_bundle) // 2])
    result = run_inner("--compile-cache-bundle=b.bundle", "--compile-cache-rebuild",
                       ini=f"compile_cache_home = {pytester.path / 'home'}")
    result.assert_outcomes(passed=2)
    summary = _summary(result)
    assert f"warmup ran here and wrote {path}" in summary, summary
    assert f"bundle written: {path}: what the warmup compiled" in summary, summary
    assert "; --compile-cache-rebuild writes a fresh one" in "\n".join(result.outlines)
    # A repair asked for is no problem: said once, not as PROBLEM lines, and the header does not call it unusable.
    assert "PROBLEM:" not in summary, summary
    assert "cannot be used" not in "\n".join(result.outlines), result.outlines
    assert "\n".join(result.outlines).count("lie past the end of the file") == 1, result.outlines
    from pytest_compilecache.bundle.format import read_manifest
    with read_manifest(path) as rebuilt:
        assert len(rebuilt.entries) == 1


@pytest.mark.parametrize("content", [None, b"hello, not a bundle\n"], ids=["missing", "not-a-bundle"])
def test_a_collect_only_run_prints_no_summary(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], content: bytes | None
) -> None:
    """docs/bundles.md: nothing happens in a --co run, so there is nothing to sum up or advise."""
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=WARM_TEST)
    path = pytester.path / "b.bundle"
    if content is not None:
        path.write_bytes(content)
    result = run_inner("--co", "-q", "--compile-cache-bundle=b.bundle", ini=f"compile_cache_home = {pytester.path / 'home'}")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["test_model.py::test_warm", "test_model.py::test_cold"])
    assert "compilecache" not in result.stdout.str() and "bundle" not in result.stdout.str(), result.stdout.str()
    assert path.read_bytes() == content if content is not None else not path.exists()


def test_lines_that_would_only_hold_zeros_are_left_out() -> None:
    """A newcomer saw "C++ binaries: 0 carried, 0 fit this machine" for every session-made bundle, and
    advice to update a bundle the session had nothing to add to."""
    from pytest_compilecache.report.model import ProcessReport, SessionReport, Status
    from pytest_compilecache.report.terminal import summary_lines
    from pytest_compilecache.session.saving import _missed

    report = SessionReport(bundle_path="b.bundle")
    report.processes = [ProcessReport(status=Status.LOADED, reason="b.bundle: here",
                                      binaries={"carried": 0, "fit": 0, "triton_kernels": 0})]
    report.add_test("t::warm", {"cache": "warm", "fx_graph": {"hits": 1, "misses": 0}})
    report.add_test("t::cold", {"cache": "cold", "fx_graph": {"hits": 0, "misses": 1}})
    assert "C++ binaries" not in "\n".join(summary_lines(report))
    assert not _missed(report), "a miss in a cold_cache test is no reason to update"
    report.processes[0].binaries = {"carried": 3, "fit": 0, "triton_kernels": 0}
    assert "C++ binaries: 3 kernels carried, 0 fit this machine" in "\n".join(summary_lines(report))
    report.add_test("t::plain", {"cache": "", "fx_graph": {"hits": 0, "misses": 1}})
    assert _missed(report)


def test_problems_keep_their_concern_from_a_worker_and_are_said_once() -> None:
    """Problems are typed (what they kept from working, the file they are about): a worker's arrive at
    the controller as they left, a problem two processes saw is said once, and the summary sorts by
    concern, not by the wording of a message."""
    from pytest_compilecache.report.model import Concern, Problem, ProcessReport, SessionReport, Status
    from pytest_compilecache.report.terminal import summary_lines

    damaged = Problem(Concern.BUNDLE, "b.bundle: damaged (bad checksum)", "b.bundle")
    binary = Problem(Concern.BINARY, "b.bundle: carried binary ab/x.so fails its checksum; not used", "b.bundle")
    hook = Problem(Concern.WARMUP, "the warmup hook failed: RuntimeError: boom")
    worker = ProcessReport(process="gw0", status=Status.WARMUP_FAILED, problems=[damaged, binary, hook],
                           warmup_error="RuntimeError: boom\n  at conftest.py:3")
    arrived = ProcessReport.from_json(json.loads(json.dumps(worker.to_json())))
    assert arrived.problems == [damaged, binary, hook]
    report = SessionReport(bundle_path="b.bundle", problems=[damaged])
    report.processes = [arrived, ProcessReport(process="gw1", problems=[damaged])]
    assert report.all_problems() == [damaged, hook] and report.binary_problems() == [binary]
    lines = summary_lines(report)
    assert lines.count(f"PROBLEM: {damaged.text}") == 1
    assert f"C++ binary not used: {binary.text}" in lines
    assert not any(hook.text in line for line in lines), "the failure block already says the warmup failed"
    document = report.to_json()["bundle"]
    assert document["problems"] == [damaged.text, hook.text]
    assert [p["concern"] for p in document["problem_details"]] == ["bundle", "binary", "warmup"]
    crash = Problem(Concern.WARMUP, "gw1 (pid 7) died while running the warmup hook, holding b.bundle.lock")
    report.problems.append(crash)
    assert f"PROBLEM: {crash.text}" in summary_lines(report), "a crash is not what the failure block says"



@pytest.mark.parametrize("update", [[], ["--compile-cache-update"]], ids=["kept", "update"])
def test_a_run_that_adds_nothing_to_an_existing_bundle_says_so(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], built_bundle: bytes, update: list[str]
) -> None:
    """Over an existing bundle, a run whose tests compiled nothing never claims that every compile hit
    (a newcomer read that beside a PROBLEM saying no bundle was used), and an updating run that adds
    nothing says so rather than a bare "bundle saved"."""
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=WARM_TEST.replace("def test_cold", "def test_idle(warm_cache):\n    pass\n\n"
                                                                    "def _unused"))
    (pytester.path / "b.bundle").write_bytes(built_bundle)
    idle = run_inner("--compile-cache-bundle=b.bundle", "-k", "idle", *update,
                     ini=f"compile_cache_home = {pytester.path / 'home'}")
    idle.assert_outcomes(passed=1, deselected=1)
    summary = _summary(idle)
    assert "every compile outside cold_cache tests hit" not in summary, summary
    # not_saved() is named only in a run that used one (a newcomer read it as jargon).
    assert "not_saved()" not in summary and "bundle (" not in summary, summary
    assert ("compiled nothing to add" if update else
            "no test outside cold_cache tests compiled anything: nothing to add") in summary, summary
    warm = run_inner("--compile-cache-bundle=b.bundle", "-k", "warm", "--compile-cache-report=r.json", *update,
                     ini=f"compile_cache_home = {pytester.path / 'home'}")
    warm.assert_outcomes(passed=1, deselected=1)
    summary = _summary(warm)
    if update:
        assert "bundle written" not in summary and "bundle updated: " in summary, summary
        assert "the tests compiled nothing it lacked; recorded their compile times" in summary, summary
        assert json.loads((pytester.path / "r.json").read_text())["bundle"]["saved"]["added"] is False
    else:
        assert "every compile outside cold_cache tests hit: nothing to add" in summary, summary


def test_a_miss_without_a_bundle_names_the_warmup_not_a_private_file(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    """Without --compile-cache-bundle, a warm test's miss is explained against this session's warmup,
    not a bundle file the user never named."""
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model="""
import torch
from conftest import f

def test_other_shape(warm_cache):
    torch.compile(f)(torch.randn(4))
    text = "\\n".join(warm_cache.stats.explanations(["fx_graph"]))
    assert "nearest entry in this session's warmup" in text, text
    assert "session.bundle" not in text, text
""")
    run_inner().assert_outcomes(passed=1)


def test_a_missing_torch_is_said_once(pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixture used where torch cannot be imported fails with one message, not the same one chained twice
    (pytest's one-line recap under "short test summary info" aside; a wide terminal shows it whole)."""
    hidden = pytester.mkdir("notorch")
    (hidden / "torch.py").write_text("raise ImportError(\"No module named 'torch'\")\n")
    monkeypatch.setenv("PYTHONPATH", str(hidden))
    pytester.makepyfile(test_model="def test_cold(cold_cache):\n    pass\n")
    result = run_inner("--compile-cache-bundle=b.bundle", ini=f"compile_cache_home = {pytester.path / 'home'}",
                       fresh=True)
    result.assert_outcomes(errors=1)
    text = result.stdout.str()
    report = text.split("short test summary info")[0]
    assert report.count("pytest-compilecache needs torch >= 2.7, but torch cannot be imported") == 1, text
    assert "During handling of the above exception" not in text, text


def test_a_save_says_apart_the_time_spent_importing_torch_first() -> None:
    """An xdist controller that ran no test imports torch's compiler only to save (several seconds): a
    newcomer read "0.23 MB in 4.41 s" as a slow save. The import is said apart, and is not in the save's
    seconds (``saving.save`` times it separately)."""
    from pytest_compilecache.report.model import SaveResult, SaveStatus, SessionReport
    from pytest_compilecache.report.terminal import summary_lines

    report = SessionReport(bundle_path="b.bundle")
    report.saved = SaveResult(SaveStatus.SAVED, path="b.bundle", artifacts={"inductor": {"count": 1, "bytes": 9}},
                              bytes=230_000, seconds=0.31, import_seconds=4.1)
    text = "\n".join(summary_lines(report))
    assert "bundle written: b.bundle: 1 fx_graph (0.23 MB in 0.31 s; before that, 4.10 s importing torch's " \
           "compiler in this process)" in text, text
    assert report.saved.to_json()["import_seconds"] == 4.1
    report.saved.import_seconds = 0.0
    assert "importing" not in "\n".join(summary_lines(report))


@pytest.mark.slow
@pytest.mark.compat
def test_a_building_run_an_updating_run_and_a_later_run_each_say_what_happened_to_the_bundle(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], tmp_path: Path,
    kernels_name_their_folder: bool,
) -> None:
    """What a newcomer found contradictory or mixed:

    - "warmup ran here and wrote PATH" beside "bundle saved: PATH: nothing new": in a building run the
      warmup writes the bundle and the end of the session records only the tests' compile times and use
      of it; an updating run's warmup that compiled nothing the bundle lacked wrote nothing new at all.
    - "the same N tests in the run that built the bundle" after an updating run that added a test: that
      test's figure comes from the updating run, the first to record it; the summary says so.
    - "compiling, warmups included: ... saved" counted a first-ever run's precompiled-header builds
      (about 5 s, kept per machine with or without a bundle) as the bundle's: the building run records
      them, and the comparison leaves them out on both sides, saying so (a private headers folder here).
    """
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=WARM_TEST)
    home = f"compile_cache_home = {pytester.path / 'home'}"
    args = ("-o", f"compile_cache_headers_dir={tmp_path / 'headers'}", "--compile-cache-bundle=b.bundle",
            "--compile-cache-report=r.json")
    path = pytester.path / "b.bundle"

    def report() -> dict:
        return json.loads((pytester.path / "r.json").read_text())

    def seconds() -> dict[str, float]:
        return {name.split("::")[1]: stats["compile_seconds"] for name, stats in report()["tests"].items()}

    built = run_inner(*args, ini=home)
    built.assert_outcomes(passed=2)
    summary = _summary(built)
    assert f"warmup ran here and wrote {path}: " in summary, summary
    assert "bundle updated" not in summary and "nothing new, only" not in summary, summary
    # The cold test compiled, and a cold test's compiles are never kept: "the tests compiled nothing
    # more" was untrue (a third newcomer). Artifacts are named by the layers of the table (fx_graph).
    assert f"bundle written: {path}: what the warmup compiled, when it ran; the tests added only their compile " \
           "times and which entries they used; it holds 1 fx_graph" in summary, summary
    assert report()["bundle"]["saved"]["added"] is False and report()["bundle"]["processes"][0]["wrote_bundle"]
    before = seconds()
    built_headers = report()["bundle"]["processes"][0]["headers_seconds"]
    headers = torch_builds_precompiled_headers()  # torch 2.7 has none to build
    # Recorded, not a build's 5 s: the suite's g++ hands back a header it has built before (tests/cached_cxx.py).
    assert built_headers > 0.0 if headers else built_headers == 0.0, built_headers

    pytester.makepyfile(test_more="""
import torch

def test_added(warm_cache):
    torch.compile(lambda x: x.tan() - 5)(torch.randn(8))
""")
    updated = run_inner(*args, "--compile-cache-update", ini=home)
    updated.assert_outcomes(passed=3)
    summary = _summary(updated)
    assert "warmup ran here: " in summary and f"; {path} already held everything it compiled" in summary, summary
    assert "not compared with the run that built the bundle: this run ran 3 tests, the building run 2 tests" in summary, summary
    assert "and wrote" not in summary, summary
    carried = not kernels_name_their_folder  # torch 2.7's kernels are found only in their own folder
    assert f"bundle written: {path}: added 1 fx_graph, 1 aot_autograd{', 1 cpp' if carried else ''}; it holds " \
           f"2 fx_graph, 2 aot_autograd{', 2 cpp' if carried else ' ('}" in summary, summary
    assert report()["bundle"]["saved"]["added_artifacts"] == {"aot_autograd": 1, "inductor": 1, **({"cpp": 1} if carried else {})}
    process = report()["bundle"]["processes"][0]
    assert process["wrote_bundle"] is False and process["warmup_found_all"] is True
    added = seconds()["test_added"]

    later = run_inner(*args, ini=home)
    later.assert_outcomes(passed=3)
    compared = report()["totals"]["compared_with_build"]
    # The bundle keeps the session that built it (2 tests): a run of 3 is not like it, and claims nothing.
    assert compared["tests"] == 3 and "session_seconds_saved" not in compared, compared
    assert compared["built_session_seconds"] > 0 and compared["processes"] == 1, compared
    assert report()["tests"]["test_model.py::test_warm"]["built_compile_seconds"] == \
        pytest.approx(before["test_warm"], abs=2e-3)
    summary = _summary(later)
    assert "not compared with the run that built the bundle: this run ran 3 tests, the building run 2 tests" \
        in summary, summary
    assert report()["bundle"]["processes"][0]["headers_seconds"] == 0.0  # kept: nothing built


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "n2"])
def test_the_summary_says_where_the_report_went_and_which_folders_it_made(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], workers: list[str]
) -> None:
    """A newcomer gave ``--compile-cache-report=/missing/dir/r.json``: the folders were made silently
    and nothing said where the report went. As pytest's ``--junitxml`` does, the summary says it. A later
    run into the same folders made none (serially: the controller alone writes the report under xdist, the
    same way)."""
    pytester.makepyfile(test_model="def test_plain(cold_cache):\n    pass\n")
    result = run_inner(*workers, "--compile-cache-report=out/deeper/r.json")
    result.assert_outcomes(passed=1)
    written = pytester.path / "out" / "deeper" / "r.json"
    assert json.loads(written.read_text())["format"] == 2
    summary = _summary(result)
    assert f"report written: {written} (made 2 folders for it, from {pytester.path / 'out'})" in summary, summary
    if not workers:
        again = run_inner("--compile-cache-report=out/deeper/r.json")
        assert f"report written: {written}\n" in _summary(again) + "\n", _summary(again)



def test_workers_are_listed_in_their_order() -> None:
    """Workers report as they finish; a newcomer read gw1's bundle block above gw0's. gw10 comes after gw2."""
    from pytest_compilecache.report.model import ProcessReport, SessionReport, Status
    from pytest_compilecache.report.terminal import summary_lines

    report = SessionReport(bundle_path="b.bundle")
    report.processes = [ProcessReport(process=name, status=Status.LOADED, reason=f"b.bundle: {name}")
                        for name in ("gw10", "gw1", "gw2", "gw0")]
    said = [line.split(")")[0] for line in summary_lines(report) if line.startswith("bundle (")]
    assert said == ["bundle (gw0", "bundle (gw1", "bundle (gw2", "bundle (gw10"], said


SEVERAL_GRAPHS_CONFTEST = """
import torch

FUNCTIONS = [
    lambda x: torch.sin(x) * 2 + 1,
    lambda x: torch.nn.functional.gelu(x @ x.T).softmax(dim=-1),
    lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]).relu().max(dim=0).values,
]

def pytest_compilecache_warmup(cache):
    for function in FUNCTIONS:
        torch.compile(function)(torch.randn(16, 16))
"""

SEVERAL_GRAPHS_TEST = """
import pytest
import torch
from conftest import FUNCTIONS

@pytest.mark.parametrize("index", range(len(FUNCTIONS)))
def test_warm(warm_cache, index):
    torch.compile(FUNCTIONS[index])(torch.randn(16, 16))
    warm_cache.assert_misses(fx_graph=0)
"""


@pytest.mark.slow
def test_the_claimed_saving_is_what_the_wall_clock_shows_on_a_fresh_runner(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, run_inner: Callable[..., pytest.RunResult],
) -> None:
    """As on a CI runner that restores only the bundle: built with one HOME and TMPDIR, run warm with a
    fresh one. No figure of the summary is negative, and the saving it claims is the two runs' wall clocks'
    difference within 30% (or 2 s of a process's start and exit); a run with another number of processes
    claims none. The first two runs are fresh processes; the third, whose wall clock is not compared, is forked
    from the suite's zygote. C++ is built by the suite's g++ (``tests/cached_cxx.py``), whose outputs are keyed by
    their sources: these graphs are compiled nowhere else in the suite, so the building run's kernels are built
    here, as on a runner, and the zygote's Inductor config (``cpp.cxx``) is the fresh processes'.
    (The comparison's arithmetic for several processes is the same, tested in the unit tier.)"""
    import re
    import time

    pytester.makeconftest(SEVERAL_GRAPHS_CONFTEST)
    pytester.makepyfile(test_model=SEVERAL_GRAPHS_TEST)
    for name in ("XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTEST_XDIST_WORKER",
                 "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)

    def run(home: str, *args: str, forked: bool = False) -> tuple[float, str, dict]:
        folder = pytester.path / home
        (folder / "tmp").mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv("HOME", str(folder))
        monkeypatch.setenv("TMPDIR", str(folder / "tmp"))
        started = time.monotonic()
        inner = run_inner if forked else pytester.runpytest_subprocess
        result = inner("-p", "no:cacheprovider", "-o", "verbosity_compilecache=1", *args,
                       "--compile-cache-bundle=b.bundle", "--compile-cache-report=r.json")
        wall = time.monotonic() - started
        result.assert_outcomes(passed=3)
        summary = _summary(result)
        negative = re.findall(r"-\d+\.\d+ s", summary)
        assert not negative, summary
        return wall, summary, json.loads((pytester.path / "r.json").read_text())

    cold, _, _ = run("runner-1")
    wall, summary, report = run("runner-2")
    compared = report["totals"]["compared_with_build"]
    claimed, measured = compared["session_seconds_saved"], cold - wall
    if compared["headers_left_out"]:  # one run built torch's headers, the other found them: alike without them
        measured -= compared["built_headers_seconds"] - compared["headers_seconds"]
    print(f"claimed {claimed:.1f} s less, the wall clocks {measured:.1f} s ({cold:.1f} - {wall:.1f})")
    assert "not_compared" not in compared, summary
    # The claim and the clocks agree (within 30%, or 2 s of a loaded machine's start and exit outside the plugin's
    # clock); on a loaded 2-core machine a fresh runner's warm run may even take longer, and must then say so.
    assert abs(claimed - measured) <= max(0.3 * abs(measured), 2.0), \
        f"claimed {claimed:.1f} s less, the wall clocks {measured:.1f} s\n{summary}"
    said = re.search(r"\((\d+\.\d) s (less|MORE)", summary)
    assert said is not None, summary
    # the report's figure, to the tenth the summary prints it (the report keeps more digits: no second rounding)
    assert abs(float(said.group(1)) - abs(claimed)) <= 0.051 and (said.group(2) == "less") == (claimed >= 0), summary
    first = [name for name, stats in report["tests"].items() if stats.get("first_in_process")]
    assert len(first) == 1, first  # torch's start-up, once a process
    _, summary, report = run("runner-3", "-n", "2", forked=True)
    compared = report["totals"]["compared_with_build"]
    assert "session_seconds_saved" not in compared, compared
    assert ("not compared with the run that built the bundle: this run had 2 processes (xdist workers), the "
            "building run 1 process") in summary, summary


def test_a_bundle_with_nothing_to_save_says_it_was_not_written() -> None:
    """``bundle nothing to save:`` read oddly to a newcomer."""
    from pytest_compilecache.report.model import SaveResult, SaveStatus, SessionReport
    from pytest_compilecache.report.terminal import summary_lines

    report = SessionReport(bundle_path="b.bundle")
    report.saved = SaveResult(SaveStatus.NOTHING, "no test compiled anything to save")
    lines = summary_lines(report)
    assert "bundle not written, nothing to save: no test compiled anything to save" in lines, lines


CAUGHT_TEST = """
from pytest_compilecache.session.protocol import WarmupMarker

def test_reads_a_damaged_marker(tmp_path, cold_cache):
    (tmp_path / "warmup-done").write_text("{not json")
    assert WarmupMarker.read(tmp_path / "warmup-done") is None
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "n2"])
def test_an_error_the_plugin_went_on_past_is_counted_under_v_and_in_the_report_never_a_problem(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], workers: list[str]
) -> None:
    """A real error the plugin caught (a damaged warmup marker: the warmup would run again), in each of two tests,
    from the workers too: one line under -v, summed in the JSON report, nothing by default (serially: the
    controller alone prints the summary under xdist, the same way), no problem in strict mode."""
    pytester.makepyfile(test_a=CAUGHT_TEST, test_b=CAUGHT_TEST)
    where = "reading the session's warmup marker (JSONDecodeError)"
    verbose = run_inner(*workers, "--compile-cache-report=r.json", "--compile-cache-strict")
    verbose.assert_outcomes(passed=2)
    assert verbose.ret == 0
    lines = [line for line in _summary(verbose).splitlines() if line.startswith("caught and went on past:")]
    assert lines == [f"caught and went on past: 2 x {where}"], _summary(verbose)
    assert json.loads((pytester.path / "r.json").read_text())["caught"] == {where: 2}
    if not workers:
        quiet = run_inner("-o", "verbosity_compilecache=auto")
        quiet.assert_outcomes(passed=2)
        assert "caught and went on past" not in quiet.stdout.str()
