"""The session's report: what each process did with the bundle, per-test counts, what was saved.
Filled by the plugin's roles; rendered by :mod:`.terminal` and :meth:`SessionReport.to_json`."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import itertools
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, Iterable

from ..bundle.format import Unreadable
from ..stats import CacheStats
from ..words import artifact_counts

REPORT_FORMAT = 2
#: The attribute of a test's teardown report that carries its counts (from a worker too).
REPORT_ATTR = "compilecache"


class Status(enum.Enum):
    """What became of the bundle in one process."""

    UNUSED = "unused"
    NONE = "none"
    LOADED = "loaded"
    MISSING = "missing"
    INCOMPATIBLE = "incompatible"
    UNUSABLE = "unusable"
    IGNORED = "ignored"
    NOT_A_BUNDLE = "not a bundle"
    WARMUP_FAILED = "warmup failed"


class SaveStatus(enum.Enum):
    """What became of PATH at the end of the session."""

    NOT_ASKED = ""
    SAVED = "saved"
    UNCHANGED = "unchanged"
    KEPT = "kept"
    LEFT_ALONE = "left alone"
    NOTHING = "nothing to save"
    FAILED = "failed"


class Concern(enum.Enum):
    """What a problem kept from working."""

    BUNDLE = "bundle"
    WARMUP = "warmup"
    BINARY = "binary"
    SAVING = "saving"
    REMOTE = "remote cache"
    REPORT = "report"


@dataclass(frozen=True)
class Problem:
    """One problem: what it kept from working, its text, and the file or URL it names (``""`` where none)."""

    concern: Concern
    text: str
    where: str = ""

    def __str__(self) -> str:
        return self.text

    def to_json(self) -> dict[str, str]:
        """``{"concern", "where", "text"}``."""
        return {"concern": self.concern.value, "where": self.where, "text": self.text}


@dataclass
class ProcessReport:
    """What happened to the bundle in one process; workers send it to the controller as JSON."""

    process: str = "main"
    status: Status = Status.UNUSED
    reason: str = ""
    #: Artifacts (by type) read into the cache folder before the first test, their bytes, and the seconds it took.
    loaded: dict[str, int] = field(default_factory=dict)
    loaded_bytes: int = 0
    load_seconds: float = 0.0
    #: Artifacts the entry holds that are read only when needed, and those read.
    on_demand: dict[str, int] = field(default_factory=dict)
    placed: dict[str, int] = field(default_factory=dict)
    placed_bytes: int = 0
    #: Bytes this process downloaded from a bundle URL (``None``: the bundle is a local path).
    downloaded_bytes: int | None = None
    warmup_seconds: float | None = None
    warmup_stats: dict[str, Any] | None = None
    warmup_error: str | None = None
    env: dict[str, str] | None = None
    history: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    binaries: dict[str, int] = field(default_factory=dict)
    #: Why the bundle could not be read here (a damaged file, not a bundle), and what kind of problem that is.
    bundle_unreadable: str = ""
    bundle_unreadable_kind: Unreadable | None = None
    #: Whether this process's warmup wrote what it compiled into PATH itself.
    wrote_bundle: bool = False
    #: Whether the session's bundle already held everything this process's warmup compiled (nothing written).
    warmup_found_all: bool = False
    #: Seconds this process spent building torch's precompiled C++ headers (kept per machine).
    headers_seconds: float = 0.0
    #: The folder this process's warmup compiled in, kept between runs (worker mode); else "".
    warmup_folder: str = ""
    #: Whether this process loaded only what the session's warmup compiled, not PATH's entry.
    own_warmup: bool = False
    #: The register of patches (``patches.status()``); ``None`` where torch's compiler was never set up here.
    patches: dict[str, Any] | None = None
    #: Why this process ran part of the suite (deselected tests, collection errors, tests named); "" if it did not.
    left_out: str = ""
    #: What this process compiled but did not save, and why (one sentence each): no problem, a limit of torch's.
    not_saved: list[str] = field(default_factory=list)
    #: Errors this worker caught and went on past in its session (``caught.since``): said under ``-v`` only.
    caught: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A plain dict (for ``workeroutput`` and the JSON report)."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "status": self.status.value,
                "problems": [p.text for p in self.problems if p.concern is not Concern.BINARY],
                "binary_problems": [p.text for p in self.problems if p.concern is Concern.BINARY],
                "problem_details": [p.to_json() for p in self.problems],
                "bundle_unreadable_kind": self.bundle_unreadable_kind.value if self.bundle_unreadable_kind else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ProcessReport":
        """The inverse of :meth:`to_json`."""
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        kind = values.get("bundle_unreadable_kind")
        return cls(**{**values, "status": Status(values.get("status", Status.UNUSED.value)),
                      "problems": [Problem(Concern(p["concern"]), p["text"], p.get("where", ""))
                                   for p in data.get("problem_details", [])],
                      "bundle_unreadable_kind": Unreadable(kind) if kind else None})


@dataclass(frozen=True)
class ReportWritten:
    """Where the ``--compile-cache-report`` file went, the outermost folder made for it, and how many were made."""

    path: str
    made: str = ""
    folders_made: int = 0


@dataclass
class SaveResult:
    """What the end of the session did to PATH."""

    status: SaveStatus = SaveStatus.NOT_ASKED
    reason: str = ""
    path: str = ""
    artifacts: dict[str, dict[str, int]] = field(default_factory=dict)
    bytes: int = 0
    seconds: float = 0.0
    #: ``{artifact type: count}`` dropped because none of the last updating runs used them.
    dropped_unused: dict[str, int] = field(default_factory=dict)
    #: For a bundle at a URL: ``{"downloaded": bytes, "uploaded": bytes}`` while saving.
    transfer: dict[str, int] = field(default_factory=dict)
    #: With ``SAVED``: whether the run added an artifact or binary (False: only its use was recorded).
    added: bool = True
    #: With ``SAVED``: ``{artifact type: count}`` of artifacts the bundle did not hold before (``cpp``: binaries).
    added_artifacts: dict[str, int] = field(default_factory=dict)
    #: Seconds spent importing torch's compiler before saving (not in ``seconds``).
    import_seconds: float = 0.0
    #: Why this updating run does not count toward ``compile_cache_max_unused_runs`` ("" where it counts or
    #: nothing is dropped as unused).
    not_counted: str = ""
    #: With ``--compile-cache-rebuild``: what of PATH could not be read and was written afresh.
    repaired: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The JSON form; empty when nothing was asked."""
        if self.status is SaveStatus.NOT_ASKED:
            return {}
        data: dict[str, Any] = {"status": self.status.value}
        if self.status in (SaveStatus.SAVED, SaveStatus.UNCHANGED):
            data.update(path=self.path, artifacts=self.artifacts, bytes=self.bytes, seconds=self.seconds,
                        dropped_unused=self.dropped_unused, import_seconds=self.import_seconds)
            if self.status is SaveStatus.SAVED:
                data.update(added=self.added, added_artifacts=self.added_artifacts,
                            **({"not_counted": self.not_counted} if self.not_counted else {}))
            if self.repaired:
                data["repaired"] = self.repaired
        else:
            data["reason"] = self.reason
        if self.transfer:
            data["transfer"] = self.transfer
        return data


@dataclass(frozen=True)
class Comparison:
    """This session against the run that built its bundle: wall clock and compiling (tests and warmup), compared
    only for the same tests in as many processes (else ``not_compared`` says why); where only one run built torch's
    precompiled C++ headers, their seconds are left out of both sides."""

    tests: int
    processes: int
    seconds_now: float
    seconds_then: float
    compile_now: float
    compile_then: float
    not_compared: str = ""
    headers_now: float = 0.0
    headers_then: float = 0.0

    @property
    def headers_differ(self) -> bool:
        """Whether one run built the headers and the other found them ready."""
        return (self.headers_now >= HEADERS_NOTED) != (self.headers_then >= HEADERS_NOTED)

    def _alike(self, now: float, then: float) -> tuple[float, float]:
        return (now - self.headers_now, then - self.headers_then) if self.headers_differ else (now, then)

    @property
    def saved(self) -> float:
        """Wall seconds this session took less than the building run (negative: more); 0 when not compared."""
        now, then = self._alike(self.seconds_now, self.seconds_then)
        return 0.0 if self.not_compared else then - now

    def _clocks(self) -> tuple[float, float, str, str]:
        """The wall clocks now and then, ``3.0 s less`` (or ``MORE``), and what was left out of them (``""``: nothing)."""
        now, then = self._alike(self.seconds_now, self.seconds_then)
        verdict = f"{then - now:.1f} s less" if then >= now else f"{now - then:.1f} s MORE"
        if not self.headers_differ:
            return now, then, verdict, ""
        this = self.headers_now >= HEADERS_NOTED
        return now, then, verdict, (f"leaving out the {self.headers_now if this else self.headers_then:.1f} s "
                                    f"{'this' if this else 'that'} run spent building torch's C++ headers and CPU "
                                    f"probes, which {'that' if this else 'this'} run found ready in the plugin's home")

    def brief(self) -> str:
        """The comparison in a clause of the one-line summary."""
        if self.not_compared:
            return ""
        now, then, verdict, left_out = self._clocks()
        return (f"{now:.1f} s against {then:.1f} s in the run that built the bundle ({verdict}"
                f"{'; ' + left_out if left_out else ''})")

    def sentence(self) -> str:
        """This session against the run that built its bundle, in one sentence."""
        compile_now, compile_then = self._alike(self.compile_now, self.compile_then)
        compiling = f"compiling in tests and the warmup: {compile_now:.1f} s now, {compile_then:.1f} s then"
        if self.not_compared:
            return f"not compared with the run that built the bundle: {self.not_compared}; {compiling}"
        now, then, verdict, left_out = self._clocks()
        tests = "the same test" if self.tests == 1 else f"the same {self.tests} tests"
        where = "" if self.processes == 1 else f" on {self.processes} workers"
        return (f"this session against the run that built the bundle ({tests}{where}): {now:.1f} s now, "
                f"{then:.1f} s then ({verdict}), each from the plugin's start to the session's end"
                f"{', ' + left_out if left_out else ''}; {compiling}")

    def to_json(self) -> dict[str, Any]:
        """The report's ``totals.compared_with_build``."""
        return {"tests": self.tests, "processes": self.processes, "session_seconds": round(self.seconds_now, 3),
                "built_session_seconds": round(self.seconds_then, 3), "compile_seconds": round(self.compile_now, 3),
                "built_compile_seconds": round(self.compile_then, 3),
                "headers_seconds": round(self.headers_now, 3), "built_headers_seconds": round(self.headers_then, 3),
                "headers_left_out": self.headers_differ,
                **({"not_compared": self.not_compared} if self.not_compared
                   else {"session_seconds_saved": round(self.saved, 3)})}


#: Seconds of header building below which a run is taken to have found the headers ready.
HEADERS_NOTED = 0.05


def session_record(seconds: float, tests: Iterable[str], processes: int, compile_seconds: float,
                   headers_seconds: float = 0.0) -> dict[str, Any]:
    """What a bundle keeps of the session that wrote it, for :meth:`SessionReport.compared_with_build`."""
    ran = sorted(set(tests))
    return {"seconds": round(seconds, 3), "tests": len(ran), "processes": processes,
            "compile_seconds": round(compile_seconds, 3), "headers_seconds": round(headers_seconds, 3),
            "digest": hashlib.sha256("\n".join(ran).encode()).hexdigest()[:16]}


@dataclass
class SessionReport:
    """Everything the summary and the JSON report show, for one pytest session."""

    bundle_path: str | None = None
    bundle_at_start: str = ""
    #: Whether PATH existed when the session began (its save then updates it).
    bundle_existed: bool = False
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)
    totals: CacheStats | None = None
    compile_seconds: float = 0.0
    processes: list[ProcessReport] = field(default_factory=list)
    saved: SaveResult = field(default_factory=SaveResult)
    problems: list[Problem] = field(default_factory=list)
    remote_problem: str = ""
    #: Bytes strict mode's check at session start downloaded from a bundle URL.
    checked_downloaded: int = 0
    #: Where the JSON report went (written after the report's own content is final).
    written: ReportWritten | None = None
    #: When the session began (the plugin's load, for a process's first session), as ``time.time()``.
    started: float = 0.0
    #: Wall seconds from ``started`` to the end of saving the bundle (or of the last test).
    session_seconds: float = 0.0
    #: Every test that ran (reported its teardown), counted or not, by node id.
    ran: set[str] = field(default_factory=set)
    #: Errors the reporting process caught and went on past (a worker's ride in its process report).
    caught: dict[str, int] = field(default_factory=dict)

    def add_test(self, nodeid: str, stats: dict[str, Any]) -> None:
        """Record one test's counts (from this process or from a worker's report)."""
        self.tests[nodeid] = stats
        self.compile_seconds += float(stats.get("compile_seconds", 0.0))
        current = CacheStats.from_dict(stats)
        self.totals = current if self.totals is None else self.totals + current

    def misses_not_saved(self) -> dict[str, int]:
        """``{layer: misses}`` inside ``not_saved()`` blocks: compiles left out of the bundle on purpose."""
        out: Counter[str] = Counter()
        for stats in itertools.filterfalse(_starts_empty, self.tests.values()):
            out.update({layer: int(n) for layer, n in (stats.get("misses_not_saved") or {}).items()})
        return dict(out)

    def misses_in_cold_caches(self) -> dict[str, int]:
        """``{layer: misses}`` in tests whose cache starts empty by design (``cold_cache``, per-test isolation)."""
        out: Counter[str] = Counter()
        for stats in filter(_starts_empty, self.tests.values()):
            out.update({layer.layer: layer.misses for layer in CacheStats.from_dict(stats)
                        if layer.observable and layer.misses})
        return dict(out)

    def every_problem(self) -> list[Problem]:
        """Every problem seen in any process, once each; a damaged entry's names the tests that missed it."""
        first: dict[str, Problem] = {}
        for problem in [*self.problems, *(p for r in self.processes for p in r.problems)]:
            first.setdefault(problem.text, problem)
        ran = [(test, key) for test, stats in self.tests.items() for key in stats.get("ran_without_damaged", {})]
        return [dataclasses.replace(p, text=f"{p.text}; tests that ran without it: {', '.join(tests)}")
                if (tests := sorted({test for test, key in ran if key in p.text})) else p for p in first.values()]

    def caught_everywhere(self) -> dict[str, int]:
        """Errors caught and gone past in every process, summed by place and error type."""
        total = Counter(self.caught)
        for process in self.processes:
            total.update(process.caught)
        return dict(sorted(total.items()))

    def binary_problems(self) -> list[Problem]:
        """Carried binaries that were not used (checksum, fit, load), once each; problems in strict mode."""
        return [p for p in self.every_problem() if p.concern is Concern.BINARY]

    def all_problems(self) -> list[Problem]:
        """Every other problem seen in any process, once each."""
        return [p for p in self.every_problem() if p.concern is not Concern.BINARY]

    def problems_beside_the_failure(self) -> list[Problem]:
        """:meth:`all_problems` less the warmup failures that the failure's own block already says."""
        restated = {p.text for r in self.processes if r.status is Status.WARMUP_FAILED for p in r.problems
                    if p.concern is Concern.WARMUP}
        return [p for p in self.all_problems() if p.text not in restated]

    @property
    def warmup_seconds(self) -> float:
        """Seconds spent in the warmup hook, over all processes."""
        return sum(r.warmup_seconds or 0.0 for r in self.processes)

    def hits_came_from(self) -> str:
        """Where ``from_bundle`` hits came from: ``bundle``, or ``warmup`` where processes loaded only its own."""
        loaded = [p for p in self.processes if p.status is Status.LOADED]
        return "warmup" if all(p.own_warmup for p in loaded) and (loaded or not self.bundle_path) else "bundle"

    def written_words(self) -> tuple[str, str]:
        """What a save that wrote PATH did, as the summaries say it: ``written`` or ``updated``, and what."""
        saved = self.saved
        held = {k: v["count"] for k, v in saved.artifacts.items()}
        if saved.added:
            added = saved.added_artifacts and saved.added_artifacts != held
            what = f"added {artifact_counts(saved.added_artifacts)}; it holds " if added else ""
        elif any(p.wrote_bundle for p in self.processes):
            what = ("what the warmup compiled, when it ran; the tests added only their compile times and which "
                    "entries they used; it holds ")
        else:
            return "updated", ("the tests compiled nothing it lacked; recorded their compile times and which of its "
                               f"entries this run used; it holds {artifact_counts(held)}")
        return "written", what + artifact_counts(held)

    def processes_in_order(self) -> list[ProcessReport]:
        """The processes as a reader expects them: ``main``, then workers by number (gw2 before gw10)."""
        def key(process: ProcessReport) -> tuple[str, int]:
            name = process.process.rstrip("0123456789")
            number = process.process[len(name):]
            return name, int(number) if number else -1

        return sorted(self.processes, key=key)

    @property
    def headers_seconds(self) -> float:
        """Wall seconds this session lost building C++ headers and CPU probes: the longest of any process."""
        return max((r.headers_seconds for r in self.processes), default=0.0)

    @property
    def warmup_failed(self) -> str | None:
        """The warmup's failure, if it failed anywhere."""
        return next((r.warmup_error for r in self.processes if r.warmup_error), None)

    def built_tests(self) -> dict[str, float]:
        """``{test: compile seconds}`` in the run that first saved each test's figure into the loaded bundle."""
        for process in self.processes:
            tests = process.history.get("tests")
            if isinstance(tests, dict) and tests:
                return {str(k): float(v) for k, v in tests.items() if isinstance(v, (int, float))}
        return {}

    def session_record(self, seconds: float) -> dict[str, Any]:
        """This session after ``seconds``, as a bundle it writes keeps it (see :func:`session_record`)."""
        return session_record(seconds, self.ran, max(1, len(self.processes)),
                              self.compile_seconds + self.warmup_seconds, self.headers_seconds)

    def compared_with_build(self) -> "Comparison | None":
        """This session against the run that built the loaded bundle, where the bundle recorded it."""
        history = next((p.history for p in self.processes if p.status is Status.LOADED
                        and isinstance(p.history.get("session"), dict)), {})
        then = history.get("session")
        if not then or not self.ran:
            return None
        now = self.session_record(self.session_seconds)
        why = ""
        if now["digest"] != then.get("digest"):
            why = (f"this run ran {_counted(now['tests'], 'test', 'tests')}, the building run "
                   f"{_counted(int(then.get('tests', 0)), 'test', 'tests')}"
                   + (" (other ones)" if now["tests"] == then.get("tests") else ""))
        elif now["processes"] != then.get("processes"):
            workers = "processes (xdist workers)"
            why = (f"this run had {_counted(now['processes'], 'process', workers)}, the building run "
                   f"{_counted(int(then.get('processes', 0)), 'process', workers)}: "
                   "each process pays torch's start-up once")
        headers_then = then.get("headers_seconds", history.get("headers_seconds", 0.0))
        return Comparison(now["tests"], now["processes"], self.session_seconds, float(then.get("seconds", 0.0)),
                          now["compile_seconds"], float(then.get("compile_seconds", 0.0)), why,
                          self.headers_seconds, float(headers_then or 0.0))

    def to_json(self) -> dict[str, Any]:
        """The ``--compile-cache-report`` document."""
        built, compared = self.built_tests(), self.compared_with_build()
        totals = {**(self.totals or CacheStats()).to_dict(), "compile_seconds": round(self.compile_seconds, 3),
                  **({"compared_with_build": compared.to_json()} if compared is not None else {})}
        tests = {nodeid: {**stats, "built_compile_seconds": built[nodeid]}
                 if nodeid in built and not _starts_empty(stats) else stats for nodeid, stats in self.tests.items()}
        bundle = {"path": self.bundle_path, "at_start": self.bundle_at_start,
                  "processes": [r.to_json() for r in self.processes if r.status is not Status.UNUSED],
                  "saved": self.saved.to_json(), "problems": [p.text for p in self.all_problems()],
                  "problem_details": [p.to_json() for p in self.every_problem()],
                  **({"checked_downloaded_bytes": self.checked_downloaded} if self.checked_downloaded else {})}
        return {"format": REPORT_FORMAT, "totals": totals, "tests": tests, "bundle": bundle,
                "caught": self.caught_everywhere()}


def _starts_empty(stats: dict[str, Any]) -> bool:
    """Whether a test's cache started empty by design (``cold_cache``, per-test isolation)."""
    return stats.get("cache") in ("cold", "isolated")


def _counted(n: int, one: str, many: str) -> str:
    return f"1 {one}" if n == 1 else f"{n} {many}"
