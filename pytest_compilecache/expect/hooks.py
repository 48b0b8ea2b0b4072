"""The two plugin objects of ``--compile-cache-expect``: :class:`Recorder` beside the tests, :class:`Keeper`
beside the summary; which records are unused is said in docs/expectations.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Generator, Protocol

import pytest

from .. import _torchapi
from ..report.model import ExpectationsReport
from ..channel import EXPECT_ATTR, send_unused, unused_from
from . import fileformat
from .fileformat import Expectations, ExpectFileError
from .records import DYNAMO_FIELDS, FIELDS, Measured, changes, describe



def load(path: Path) -> Expectations | None:
    """The expectations file, or ``None`` when there is none yet; a bad one is a :class:`pytest.UsageError`."""
    try:
        return fileformat.read(path)
    except ExpectFileError as exc:
        raise pytest.UsageError(f"--compile-cache-expect: {exc}") from None


def shown(path: Path, root: Path) -> str:
    """``path`` as messages show it: relative to the rootdir where it lies under it."""
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


class Counting(Protocol):
    """What the recorder asks of the session's per-test counts."""

    def so_far(self, item: pytest.Item) -> dict[str, int] | None: ...

    def cache_kind(self, item: pytest.Item) -> str | None: ...


class Recorder:
    """Beside the tests: measures each recorded test at the end of its call, and fails it on a change."""

    def __init__(self, config: pytest.Config, path: Path, update: bool, counts: Counting,
                 expectations: Expectations | None) -> None:
        self.config = config
        self.update = update
        self.path = shown(path, config.rootpath)
        self.counts = counts
        self.expectations = expectations
        #: The records this session finds unused (known once collection is done).
        self.unused: list[str] = []
        self._deselected = False
        self._files: set[str] = set()
        self._made_with: dict[str, str] | None = None

    @classmethod
    def create(cls, config: pytest.Config, path: Path | None, update: bool, counts: Counting) -> "Recorder | None":
        """The recorder, when ``--compile-cache-expect=PATH`` is given."""
        return None if path is None else cls(config, path, update, counts, load(path))

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self._deselected = self._deselected or bool(items)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.passed and "::" not in report.nodeid and (self.config.rootpath / report.nodeid).is_file():
            self._files.add(report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Judge which records are unused; a worker sends them to the controller."""
        records = self.expectations.tests if self.expectations is not None else {}
        self.unused = unused(records, session, self._deselected, self._files, self.counts)
        send_unused(self.config, self.unused)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report: pytest.TestReport = yield
        if call.when == "call" and report.passed and not hasattr(report, "wasxfail") \
                and self.counts.cache_kind(item) is not None:
            self._measure(item, report)
        return report

    def _measure(self, item: pytest.Item, report: pytest.TestReport) -> None:
        delta = self.counts.so_far(item)
        if delta is None:
            measured = Measured.from_counts({}, {}, {})  # torch's compiler never loaded: nothing compiled
        else:
            measured = Measured.from_counts(delta, _torchapi.unobservable_layers(), _torchapi.unobservable_fields())
        if self._made_with is None:
            self._made_with = _torchapi.made_with()
        payload: dict[str, Any] = {"record": measured.record, "made_with": self._made_with}
        recorded = self.expectations.tests.get(item.nodeid) if self.expectations is not None else None
        if recorded is None:
            payload["status"] = "not recorded"
        else:
            assert self.expectations is not None
            same = not self.expectations.made_with or self.expectations.made_with == self._made_with
            changed = changes(recorded, measured.record, FIELDS if same else DYNAMO_FIELDS)
            payload["status"] = "regressed" if changed else "compared"
            if changed and not self.update:
                report.outcome = "failed"
                report.longrepr = _failure(item, describe(changed, measured, self.path, f"{self.config.rootpath}/"))
        setattr(report, EXPECT_ATTR, payload)


def _failure(item: pytest.Item, message: str) -> Any:
    """A failure report of ``message`` alone, as ``pytest.fail(message, pytrace=False)`` in the test gives."""
    try:
        pytest.fail(message, pytrace=False)
    except pytest.fail.Exception:
        return item.repr_failure(pytest.ExceptionInfo.from_current())
    raise AssertionError("unreachable")


def unused(records: dict[str, Any], session: pytest.Session, deselected: bool, files: set[str],
           counts: Counting) -> list[str]:
    """The records whose tests, within what this session selected, are gone or no longer recorded."""
    config = session.config
    if not records or config.getoption("lf", False) or config.getoption("stepwise", False):
        return []
    items = {item.nodeid: item for item in session.items}
    unrecorded = [n for n in records if n in items and counts.cache_kind(items[n]) is None]
    if deselected:  # -k, -m, --deselect: a record matching no test may belong to one not selected
        return sorted(unrecorded)
    scopes = [scope for scope in (_scope(arg, config) for arg in config.args) if scope is not None]

    def gone_or_collected(nodeid: str) -> bool:
        file = nodeid.split("::")[0]
        return (file in files or not (config.rootpath / file).exists()) and any(_within(nodeid, s) for s in scopes)

    return sorted(unrecorded + [n for n in records if n not in items and gone_or_collected(n)])


def _scope(arg: str, config: pytest.Config) -> str | None:
    """A command-line argument as the node-id prefix it selects (``""``: everything), or ``None`` outside the rootdir."""
    path, *parts = arg.split("::")
    try:
        relative = (config.invocation_params.dir / path).resolve().relative_to(config.rootpath.resolve())
    except ValueError:
        return None
    prefix = "" if str(relative) == "." else relative.as_posix()
    return "::".join([prefix, *parts]) if parts else prefix


def _within(nodeid: str, scope: str) -> bool:
    if not scope:
        return True
    if "::" in scope:
        return nodeid == scope or nodeid.startswith((scope + "::", scope + "["))
    file = nodeid.split("::")[0]
    return file == scope or file.startswith(scope + "/")


class Keeper:
    """Beside the summary: gathers every test's measurement, writes the file once, fills the report."""

    def __init__(self, config: pytest.Config, path: Path, update: bool, expectations: Expectations | None,
                 recorder: Recorder | None) -> None:
        self.path = path
        self.update = update
        self.shown = shown(path, config.rootpath)
        self.expectations = expectations
        self.recorder = recorder
        self.measured: dict[str, dict[str, Any]] = {}
        self._unused: set[str] = set()

    @classmethod
    def create(cls, config: pytest.Config, path: Path | None, update: bool,
               recorder: Recorder | None) -> "Keeper | None":
        """The keeper, when ``--compile-cache-expect=PATH`` is given (sharing the recorder's reading of the file)."""
        if path is None:
            return None
        return cls(config, path, update, recorder.expectations if recorder is not None else load(path), recorder)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = getattr(report, EXPECT_ATTR, None)
        if report.when == "call" and isinstance(payload, dict):
            self.measured[report.nodeid] = payload

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        self._unused.update(unused_from(node))

    def finish(self, session: pytest.Session) -> ExpectationsReport:
        """Compare the counts, write the file (with ``--compile-cache-expect-update``), and say what happened."""
        file = self.expectations or Expectations()
        made_with = next((dict(p["made_with"]) for p in self.measured.values() if p.get("made_with")), {})
        status = {nodeid: payload.get("status") for nodeid, payload in sorted(self.measured.items())}
        report = ExpectationsReport(self.shown, self.update, compared=sum(s != "not recorded" for s in status.values()),
                                    regressed=[n for n, s in status.items() if s == "regressed"],
                                    not_recorded=[n for n, s in status.items() if s == "not recorded"],
                                    recorded_with=dict(file.made_with), made_with=made_with,
                                    exists=self.expectations is not None)
        unused = self.recorder.unused if self.recorder is not None else sorted(self._unused)
        report.unused = [n for n in unused if n in file.tests and n not in self.measured]
        if self.update and not session.config.option.collectonly:
            report.written = self._write(session, file, report)
            if not report.written_ok and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return report

    def _write(self, session: pytest.Session, file: Expectations, report: ExpectationsReport) -> str:
        if session.exitstatus == pytest.ExitCode.INTERRUPTED:
            return "left alone: the session was interrupted"
        kept = {n: r for n, r in file.tests.items() if n not in self.measured and n not in report.unused}
        if report.other_machine and kept:
            return (f"left alone: the records of {len(kept)} tests not recorded by this run were made with "
                    f"{report.machine(report.recorded_with)}, this run has {report.machine(report.made_with)}; update "
                    "every test at once (no -k, -m or paths, no failures) to record this machine")
        records = {**kept, **{n: p["record"] for n, p in self.measured.items()}}
        try:
            changed = fileformat.write(self.path, Expectations(report.made_with or file.made_with, records))
        except OSError as exc:
            return f"could not be written: {exc.strerror or exc}"
        return "written" if changed else "unchanged"

