"""The load-or-warm-up side of a session, in process, beside ``tests/test_protocol.py``'s table of ``decide``: the
warmup marker every process reads, whether a session missed enough to advise an update, the exit status a failure
sets, what a dead warmup left, and the checks of option values that need no pytest process."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_compilecache.bundle.signing import KEY_ENV
from pytest_compilecache.environment import CACHE_DIR_VARS
from pytest_compilecache.report.model import Concern, Problem, ProcessReport, SessionReport, Status
from pytest_compilecache.session.life import header_lines, strict_failure
from pytest_compilecache.session.options import Isolation, Options, user_cache_dir
from pytest_compilecache.session.protocol import Outcome, WarmupMarker
from pytest_compilecache.session.remote import check_url
from pytest_compilecache.session.saving import _missed, exit_status
from pytest_compilecache.session.preparation import died_in_warmup, running_note


@pytest.mark.parametrize("outcome", list(Outcome))
def test_a_warmup_marker_reads_back_as_written(tmp_path: Path, outcome: Outcome) -> None:
    """Every outcome, its process and detail survive the marker file."""
    marker = WarmupMarker(outcome, "gw2", f"detail of {outcome.value}")
    marker.write(tmp_path / "warmup-done")
    assert WarmupMarker.read(tmp_path / "warmup-done") == marker


@pytest.mark.parametrize("content", [None, "", "{not json", '{"process": "gw0"}', '{"outcome": "exploded"}', "[1]"],
                         ids=["absent", "empty", "not-json", "no-outcome", "unknown-outcome", "a-list"])
def test_anything_but_a_marker_is_no_warmup_ended(tmp_path: Path, content: str | None) -> None:
    """A missing, half-written or foreign file means no warmup ended yet: ``None``, never an error."""
    path = tmp_path / "warmup-done"
    if content is not None:
        path.write_text(content)
    assert WarmupMarker.read(path) is None


def _report(*tests: tuple[str, dict[str, Any]]) -> SessionReport:
    report = SessionReport()
    for nodeid, stats in tests:
        report.add_test(nodeid, stats)
    return report


@pytest.mark.parametrize("tests, looked_up, missed", [
    ((), False, False),
    ((("c", {"cache": "cold", "fx_graph": {"misses": 2}}),), False, False),
    ((("c", {"cache": "cold", "fx_graph": {"misses": 2}}), ("w", {"cache": "warm", "fx_graph": {"misses": 1}})),
     False, True),
    ((("w", {"cache": "warm", "aot_autograd": {"misses": 1}}),), False, True),
    ((("w", {"cache": "warm", "fx_graph": {"misses": 1}, "misses_not_saved": {"fx_graph": 1}}),), False, False),
    ((("w", {"cache": "warm", "fx_graph": {"hits": 3}}),), False, False),
    ((("w", {"cache": "warm", "fx_graph": {"hits": 3}}),), True, True),
    ((("w", {"cache": "warm", "cpp": {"misses": 3}}),), True, False),
], ids=["no-test", "cold-only", "warm-miss", "aot-miss", "not-saved-block", "hits-only", "hits-looked-up",
        "other-layer"])
def test_an_update_is_advised_only_for_misses_outside_empty_caches(
        tests: tuple[tuple[str, dict[str, Any]], ...], looked_up: bool, missed: bool) -> None:
    """FX and AOTAutograd misses count, less those in cold caches and ``not_saved()`` blocks."""
    assert _missed(_report(*tests), looked_up) is missed


@pytest.mark.parametrize("strict, failed, problem, before, after", [
    (False, "boom", False, pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED),
    (False, "boom", False, pytest.ExitCode.NO_TESTS_COLLECTED, pytest.ExitCode.TESTS_FAILED),
    (False, "boom", False, pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERRUPTED),
    (False, None, True, pytest.ExitCode.OK, pytest.ExitCode.OK),
    (True, None, True, pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED),
    (True, None, False, pytest.ExitCode.OK, pytest.ExitCode.OK),
], ids=["warmup-failed", "warmup-failed-no-tests", "interrupted-kept", "problem-not-strict", "problem-strict",
        "strict-clean"])
def test_a_failed_warmup_or_a_strict_problem_fails_a_passing_session(
        strict: bool, failed: str | None, problem: bool, before: pytest.ExitCode, after: pytest.ExitCode) -> None:
    """Only a passing (or empty) session's status is changed, and only for a failure or a problem under strict."""
    report = SessionReport(processes=[ProcessReport(warmup_error=failed)],
                           problems=[Problem(Concern.BUNDLE, "damaged")] if problem else [])
    session = SimpleNamespace(exitstatus=before)
    exit_status(Options(strict=strict), report, session)  # type: ignore[arg-type]
    assert session.exitstatus == after


def test_a_process_that_died_in_the_warmup_is_named_with_its_lock(tmp_path: Path) -> None:
    """The note a process kept while warming up names its pid and the lock it held."""
    marker = tmp_path / "warmup-done"
    running_note(marker, "gw3").write_text(json.dumps({"pid": 4242, "lock": "/b/.x.lock"}))
    why = died_in_warmup(marker, "gw3")
    assert why.startswith("gw3 (pid 4242) died while running the warmup hook") and "holding /b/.x.lock" in why
    assert died_in_warmup(marker, "gw4") == ""


def test_a_damaged_running_note_says_nothing(tmp_path: Path) -> None:
    """A note that is not JSON (the process died writing it) names no death rather than failing."""
    marker = tmp_path / "warmup-done"
    running_note(marker, "gw0").write_text("{")
    assert died_in_warmup(marker, "gw0") == ""


@pytest.mark.parametrize("url, fault", [
    ("redis://localhost:6379/0", ""),
    ("rediss://cache.example:6380", ""),
    ("unix:///run/redis.sock", ""),
    ("http://localhost:6379", "is not a Redis URL"),
    ("redis://:6379", "names no host"),
    ("redis://localhost:port", "has a port that is not a number"),
], ids=["redis", "rediss", "unix", "http", "no-host", "bad-port"])
def test_a_remote_cache_url_is_checked_before_use(url: str, fault: str) -> None:
    """A Redis URL torch accepts passes; anything else says what is wrong with it, quoting it."""
    said = check_url(url)
    assert (said == "") if not fault else (said.startswith(repr(url)) and fault in said)


@pytest.mark.parametrize("options, wide, active", [
    (Options(), False, False),
    (Options(isolation=Isolation.TEST), True, True),
    (Options(bundle_url="s3://b/x.bundle"), True, True),
    (Options(report=Path("r.json")), False, True),
    (Options(remote="redis://h:1"), False, True),
], ids=["nothing", "isolation", "bundle", "report", "remote"])
def test_what_makes_the_plugin_do_session_wide_work(options: Options, wide: bool, active: bool) -> None:
    """Isolation or a bundle redirect compiles; a report or a remote cache only make the session active."""
    assert (options.session_wide, options.active) == (wide, active)


def test_a_bundle_url_is_named_without_its_credentials() -> None:
    """Messages name a URL without a password or a query; a path is named whole."""
    assert Options(bundle_url="s3://user:secret@host/x.bundle?token=1").bundle_name == "s3://host/x.bundle"
    assert Options(bundle=Path("/b/x.bundle")).bundle_name == "/b/x.bundle"
    assert Options().bundle_name is None


@pytest.mark.skipif(sys.platform != "linux", reason="the XDG folder is Linux's")
def test_the_plugins_home_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The per-user folder is under ``XDG_CACHE_HOME`` where it is set."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert user_cache_dir() == tmp_path / "pytest-compilecache"


@pytest.fixture
def _plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No signing key and no variable that switches caches off."""
    for name in (KEY_ENV, "TORCHINDUCTOR_FORCE_DISABLE_CACHES", "TORCH_COMPILE_FORCE_DISABLE_CACHES",
                 "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE", *CACHE_DIR_VARS):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("_plain_env")
def test_the_header_says_nothing_where_nothing_was_set_up() -> None:
    """A run without the plugin's options prints no header line by default."""
    assert header_lines(Options(), SessionReport(), None, 0) == []


@pytest.mark.usefixtures("_plain_env")
def test_the_header_is_one_line_by_default_and_one_line_per_part_verbose() -> None:
    """By default the parts share one line; under -v each is a line, and what is off is said too."""
    options = Options(bundle=Path("/b/x.bundle"), isolation=Isolation.WORKER)
    report = SessionReport(bundle_at_start="/b/x.bundle: 1 entry")
    process = ProcessReport(status=Status.LOADED, reason="here")
    assert header_lines(options, report, process, 0) == [
        "compilecache: bundle /b/x.bundle: 1 entry; isolation: a kept cache per worker"]
    assert header_lines(options, report, process, 1) == [
        "compilecache: bundle /b/x.bundle: 1 entry",
        f"compilecache: bundles are unsigned (set {KEY_ENV} to sign and check them)",
        "compilecache: isolation: a kept cache per worker", "compilecache: bundle loaded: here"]


@pytest.mark.usefixtures("_plain_env")
def test_the_header_warns_of_a_variable_that_switches_caches_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable that disables caches is a warning even where nothing else is said."""
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    assert header_lines(Options(), SessionReport(), None, -1) == [
        "compilecache: WARNING: TORCHINDUCTOR_FX_GRAPH_CACHE=0 disables the FX graph cache; cache assertions are "
        "meaningless"]


@pytest.mark.usefixtures("_plain_env")
def test_the_header_says_an_unreachable_remote_cache_without_its_password() -> None:
    """The remote cache is named without credentials, and whether it answered."""
    report = SessionReport(remote_problem="ConnectionError: refused")
    (line,) = header_lines(Options(remote="redis://u:pw@h:1/0?x=1"), report, None, 0)
    assert line == ("compilecache: remote cache redis://h:1/0 (FX graph, AOTAutograd, autotune): UNREACHABLE: "
                    "ConnectionError: refused")


def test_strict_mode_stops_the_session_on_problems_at_start_listing_each() -> None:
    """Under strict, problems at start are one usage error listing each, texts and typed problems alike."""
    with pytest.raises(pytest.UsageError) as error:
        strict_failure(Options(strict=True), ["b.bundle: damaged", Problem(Concern.REMOTE, "no answer")], "remote cache")
    assert str(error.value) == ("--compile-cache-strict: remote cache problem at session start:\n  b.bundle: damaged"
                                "\n  no answer")


@pytest.mark.parametrize("strict, problems", [(True, []), (False, ["b.bundle: damaged"])],
                         ids=["strict-no-problem", "problem-not-strict"])
def test_without_strict_or_without_a_problem_the_session_goes_on(strict: bool, problems: list[str]) -> None:
    """Nothing is raised unless strict mode meets a problem (the same call under strict with a problem raises)."""
    strict_failure(Options(strict=strict), problems)
    with pytest.raises(pytest.UsageError):
        strict_failure(Options(strict=True), problems or ["b.bundle: damaged"])
