"""The session's report: what each process did with the bundle, per-test counts, what was saved.

The model is filled by the plugin's roles and rendered by :func:`summary_lines` (terminal) and
:meth:`SessionReport.to_json` (``--compile-cache-report``); neither renderer computes anything.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field, fields
from typing import Any

from .stats import CacheStats

REPORT_FORMAT = 1


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
    DELTA = "delta"
    KEPT = "kept"
    LEFT_ALONE = "left alone"
    NOTHING = "nothing to save"
    FAILED = "failed"


@dataclass
class ProcessReport:
    """What happened to the bundle in one process; workers send it to the controller as JSON."""

    process: str = "main"
    status: Status = Status.UNUSED
    reason: str = ""
    loaded: dict[str, int] = field(default_factory=dict)
    loaded_bytes: int = 0
    load_seconds: float = 0.0
    #: Bytes this process downloaded from a bundle URL (``None``: the bundle is a local path).
    downloaded_bytes: int | None = None
    warmup_seconds: float | None = None
    warmup_stats: dict[str, Any] | None = None
    warmup_error: str | None = None
    artifacts_file: str | None = None
    index_file: str | None = None
    env: dict[str, str] | None = None
    history: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    binaries: dict[str, int] = field(default_factory=dict)
    binary_problems: list[str] = field(default_factory=list)
    #: Why the bundle could not be read here (a damaged file, not a bundle); "" when it could.
    bundle_unreadable: str = ""
    #: Whether this process's warmup wrote the session's bundle (PATH itself, not a bundle of the session's own).
    wrote_bundle: bool = False

    def to_json(self) -> dict[str, Any]:
        """A plain dict (for ``workeroutput`` and the JSON report)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["status"] = self.status.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ProcessReport":
        """The inverse of :meth:`to_json`."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["status"] = Status(values.get("status", Status.UNUSED.value))
        return cls(**values)


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
    #: For a bundle at a URL: ``{"downloaded": bytes, "uploaded": bytes, "conflicts": n}`` while saving.
    transfer: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON form; empty when nothing was asked."""
        if self.status is SaveStatus.NOT_ASKED:
            return {}
        data: dict[str, Any] = {"status": self.status.value}
        if self.status in (SaveStatus.SAVED, SaveStatus.UNCHANGED, SaveStatus.DELTA):
            data.update(path=self.path, artifacts=self.artifacts, bytes=self.bytes, seconds=self.seconds,
                        dropped_unused=self.dropped_unused)
        else:
            data["reason"] = self.reason
        if self.transfer:
            data["transfer"] = self.transfer
        return data


@dataclass(frozen=True)
class Comparison:
    """Compile seconds of the tests a run shares with the run that built its bundle, and both warmups."""

    tests: int
    now: float
    then: float
    warmup_now: float
    warmup_then: float

    @property
    def saved(self) -> float:
        """What this run's compiling took less than the building run's, warmups included (negative: more)."""
        return (self.then + self.warmup_then) - (self.now + self.warmup_now)


@dataclass
class SessionReport:
    """Everything the summary and the JSON report show, for one pytest session."""

    bundle_path: str | None = None
    bundle_at_start: str = ""
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)
    totals: CacheStats | None = None
    compile_seconds: float = 0.0
    processes: list[ProcessReport] = field(default_factory=list)
    saved: SaveResult = field(default_factory=SaveResult)
    problems: list[str] = field(default_factory=list)
    remote_problem: str = ""
    #: Bytes strict mode's check at session start downloaded from a bundle URL.
    checked_downloaded: int = 0

    def add_test(self, nodeid: str, stats: dict[str, Any]) -> None:
        """Record one test's counts (from this process or from a worker's report)."""
        self.tests[nodeid] = stats
        self.compile_seconds += float(stats.get("compile_seconds", 0.0))
        current = CacheStats.from_dict(stats)
        self.totals = current if self.totals is None else self.totals + current

    def misses_in_cold_caches(self) -> dict[str, int]:
        """``{layer: misses}`` in tests whose cache starts empty by design (``cold_cache``, per-test isolation)."""
        out: dict[str, int] = {}
        for stats in self.tests.values():
            if stats.get("cache") not in ("cold", "isolated"):
                continue
            for layer in CacheStats.from_dict(stats):
                if layer.observable and layer.cell("misses") != "0":
                    out[layer.layer] = out.get(layer.layer, 0) + layer.misses
        return out

    def binary_problems(self) -> list[str]:
        """Carried binaries that were not used (checksum, fit, load), once each; problems in strict mode."""
        return list(dict.fromkeys(p for r in self.processes for p in r.binary_problems))

    def all_problems(self) -> list[str]:
        """Every problem seen in any process, once each."""
        return list(dict.fromkeys(self.problems + [p for r in self.processes for p in r.problems]))

    @property
    def warmup_seconds(self) -> float:
        """Seconds spent in the warmup hook, over all processes."""
        return sum(r.warmup_seconds or 0.0 for r in self.processes)

    @property
    def warmup_failed(self) -> str | None:
        """The warmup's failure, if it failed anywhere."""
        return next((r.warmup_error for r in self.processes if r.warmup_error), None)

    def built_tests(self) -> dict[str, float]:
        """``{test: compile seconds}`` in the run that built the loaded bundle, where recorded."""
        for process in self.processes:
            tests = process.history.get("tests")
            if isinstance(tests, dict) and tests:
                return {str(k): float(v) for k, v in tests.items() if isinstance(v, (int, float))}
        return {}

    def compared_with_build(self) -> "Comparison | None":
        """This run's compile time against the run that built the loaded bundle, over the tests both had."""
        built = self.built_tests()
        common = [n for n in self.tests if n in built]
        if not common:
            return None
        now = sum(float(self.tests[n].get("compile_seconds", 0.0)) for n in common)
        warmup_then = next((float(p.history["warmup_seconds"]) for p in self.processes if p.status is Status.LOADED
                            and isinstance(p.history.get("warmup_seconds"), (int, float))), 0.0)
        return Comparison(len(common), now, sum(built[n] for n in common), self.warmup_seconds, warmup_then)

    def _tests_json(self) -> dict[str, dict[str, Any]]:
        built = self.built_tests()
        out = {}
        for nodeid, stats in self.tests.items():
            if nodeid in built:
                now = float(stats.get("compile_seconds", 0.0))
                stats = {**stats, "built_compile_seconds": built[nodeid],
                         "compile_seconds_saved": round(built[nodeid] - now, 4)}
            out[nodeid] = stats
        return out

    def _totals_json(self) -> dict[str, Any]:
        totals: dict[str, Any] = {**(self.totals or CacheStats()).to_dict(),
                                  "compile_seconds": round(self.compile_seconds, 3)}
        compared = self.compared_with_build()
        if compared is not None:
            totals["compared_with_build"] = {
                "tests": compared.tests, "compile_seconds": round(compared.now, 3),
                "built_compile_seconds": round(compared.then, 3), "warmup_seconds": round(compared.warmup_now, 3),
                "built_warmup_seconds": round(compared.warmup_then, 3),
                "compile_seconds_saved": round(compared.saved, 3)}
        return totals

    def to_json(self) -> dict[str, Any]:
        """The ``--compile-cache-report`` document (format 1)."""
        return {
            "format": REPORT_FORMAT,
            "totals": self._totals_json(),
            "tests": self._tests_json(),
            "bundle": {
                "path": self.bundle_path,
                "at_start": self.bundle_at_start,
                "processes": [r.to_json() for r in self.processes if r.status is not Status.UNUSED],
                "saved": self.saved.to_json(),
                "problems": self.all_problems(),
                **({"checked_downloaded_bytes": self.checked_downloaded} if self.checked_downloaded else {}),
            },
        }


def _compile_time_line(report: SessionReport) -> list[str]:
    """Compile time as wall time, and the same tests in the run that built the bundle, when recorded."""
    line = (f"compile time in tests: {report.compile_seconds:.1f} s of wall time (Dynamo, Inductor, C++ builds, "
            "Triton, autotuning, loading compiled code; summed over workers)")
    warmup = report.warmup_seconds
    if warmup:
        line += f", plus {warmup:.1f} s in the warmup"
    lines = [line]
    compared = report.compared_with_build()
    if compared is not None:
        c = compared
        ratio = f" ({c.then / c.now:.1f}x this run's)" if c.now > 0.05 and c.then >= 1.1 * c.now else ""
        plus = f", plus {c.warmup_then:.1f} s in its warmup" if c.warmup_then else ""
        lines.append(f"  the same {c.tests} tests in the run that built the bundle: {c.then:.1f} s{ratio}{plus}")
        total_then, total_now = c.then + c.warmup_then, c.now + c.warmup_now
        verdict = f"{c.saved:.1f} s saved" if c.saved >= 0 else f"{-c.saved:.1f} s MORE this run"
        lines.append(f"  compiling, warmups included: {total_then:.1f} s then, {total_now:.1f} s now: {verdict}")
    return lines


#: Reasons of each kind the summary prints; the JSON report has them all, per test.
SUMMARY_REASONS = 5


def _dynamo_lines(totals: CacheStats) -> list[str]:
    """Dynamo's counts over all tests, with the first few reasons (first lines only)."""
    dynamo = totals.dynamo
    shown = dataclasses.replace(dynamo, recompile_reasons=dynamo.recompile_reasons[:SUMMARY_REASONS],
                                graph_break_reasons=dynamo.graph_break_reasons[:SUMMARY_REASONS])
    lines = ["Dynamo over all tests (summed over workers):", shown.table(brief=True)]
    hidden = (len(dynamo.recompile_reasons) + len(dynamo.graph_break_reasons)
              - len(shown.recompile_reasons) - len(shown.graph_break_reasons))
    if hidden:
        lines.append(f"  ... and {hidden} more reasons, per test in --compile-cache-report")
    return lines


def _explained_lines(totals: CacheStats | None) -> list[str]:
    """Explained misses per layer, by kind, and the first few explanations (all in the JSON report)."""
    if totals is None:
        return []
    layers = [s for s in totals if s.observable and s.explained]
    if not layers:
        return []
    lines = ["misses explained (the nearest known entry for the same code, and what differs):"]
    for layer in layers:
        lines.append(f"  {layer.explained_summary()}")
        lines.extend(f"    {text}" for text in layer.explanations[:SUMMARY_REASONS])
        if len(layer.explanations) > SUMMARY_REASONS:
            lines.append(f"    ... and {len(layer.explanations) - SUMMARY_REASONS} more, per test in --compile-cache-report")
    return lines


def _cold_lines(report: SessionReport) -> list[str]:
    """Which misses happened in caches that start empty by design, so that a reader looks at the rest."""
    assert report.totals is not None
    cold = report.misses_in_cold_caches()
    parts = [f"{layer} {n} of {report.totals.layer(layer).misses}" for layer, n in cold.items()]
    if not parts:
        return []
    return [f"  misses in tests whose cache starts empty by design (cold_cache, --compile-cache-isolate): "
            f"{', '.join(parts)}"]


def summary_lines(report: SessionReport) -> list[str]:
    """The terminal summary: per-layer totals, and what was loaded, warmed up and saved."""
    if report.totals is None or report.totals.nothing_happened:
        lines = ["no test compiled anything (or torch's compiler was never imported in a test)"]
    else:
        lines = ["per-layer totals over all tests (summed over workers):", report.totals.table()]
        lines.extend(_cold_lines(report))
        lines.extend(_dynamo_lines(report.totals))
        lines.extend(_explained_lines(report.totals))
    if report.compile_seconds or report.warmup_seconds or report.compared_with_build() is not None:
        lines.extend(_compile_time_line(report))
    if report.checked_downloaded:
        lines.append(f"bundle checked at session start (--compile-cache-strict): downloaded "
                     f"{report.checked_downloaded / 1e6:.2f} MB from {report.bundle_path}")
    for process in report.processes:
        if process.status in (Status.UNUSED,):
            continue
        if process.status is Status.WARMUP_FAILED:
            lines.append(f"bundle ({process.process}): warmup failed, see WARMUP FAILED below")
        else:
            lines.append(f"bundle ({process.process}): {process.status.value}: {process.reason}")
        if process.loaded:
            loaded = ", ".join(f"{n} {k}" for k, n in process.loaded.items())
            lines.append(
                f"  loaded {loaded} ({process.loaded_bytes / 1e6:.2f} MB in {process.load_seconds:.2f} s)"
            )
        if process.downloaded_bytes:
            lines.append(f"  downloaded {process.downloaded_bytes / 1e6:.2f} MB from {report.bundle_path}")
        elif process.downloaded_bytes == 0 and process.status is Status.LOADED and report.bundle_path \
                and process.reason.startswith(f"{report.bundle_path}: "):
            lines.append("  this machine's copy of this version was used: nothing downloaded")
        if process.binaries:
            kernels = process.binaries.get("triton_kernels", 0)
            lines.append(f"  C++ binaries: {process.binaries.get('carried', 0)} carried, "
                         f"{process.binaries.get('fit', 0)} fit this machine"
                         + (f"; {kernels} Triton kernels from Triton's own cache" if kernels else ""))
        if process.warmup_seconds is not None and not process.warmup_error:
            wrote = f" and wrote {report.bundle_path}" if process.wrote_bundle else ""
            lines.append(f"  warmup ran here{wrote}: {process.warmup_seconds:.1f} s")
    saved = report.saved
    moved = (f"; moved {saved.transfer.get('downloaded', 0) / 1e6:.2f} MB down, "
             f"{saved.transfer.get('uploaded', 0) / 1e6:.2f} MB up" if saved.transfer else "")
    if saved.transfer.get("conflicts"):
        moved += f"; {saved.transfer['conflicts']} write(s) found it changed by another writer and were retried"
    if saved.status is SaveStatus.SAVED:
        arts = ", ".join(f"{v['count']} {k}" for k, v in saved.artifacts.items())
        lines.append(f"bundle saved: {saved.path}: {arts} ({saved.bytes / 1e6:.2f} MB in {saved.seconds:.2f} s{moved})")
        if saved.dropped_unused:
            gone = ", ".join(f"{n} {kind}" for kind, n in saved.dropped_unused.items())
            lines.append(f"  dropped as unused in the last updating runs (compile_cache_max_unused_runs): {gone}")
    elif saved.status is SaveStatus.UNCHANGED:
        lines.append(f"bundle unchanged: {report.bundle_path} already holds everything this run compiled "
                     f"({saved.seconds:.2f} s{moved})")
    elif saved.status is SaveStatus.DELTA:
        lines.append(f"bundle saved as a delta only: {saved.path} ({saved.bytes / 1e6:.2f} MB in "
                     f"{saved.seconds:.2f} s{moved}): {saved.reason}")
    elif saved.status is not SaveStatus.NOT_ASKED:
        lines.append(f"bundle {saved.status.value}: {saved.reason}" + moved)
    failure = report.warmup_failed
    if failure:
        lines.append("WARMUP FAILED (warm_cache tests were skipped):")
        lines.extend("  " + line for line in failure.rstrip().splitlines())
    for problem in report.all_problems():
        if failure and problem.startswith("the warmup hook failed"):
            continue
        lines.append(f"PROBLEM: {problem}")
    lines.extend(f"C++ binary not used: {problem}" for problem in report.binary_problems())
    return lines
