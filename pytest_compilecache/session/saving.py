"""The end of a session: merge every process's artifacts into the bundle once, write the JSON report, set the exit status."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from pathlib import Path

import pytest

from .. import _torchapi, files
from ..bundle.format import BundleError, NotABundle, Unreadable, make_entry
from ..bundle.keyindex import KeyIndex
from ..report.model import Concern, Problem, ReportWritten, SaveResult, SaveStatus, SessionReport
from ..storage.interface import REPLACED_UNREADABLE, BundleStore
from ..bundle.merge import env_id
from ..channel import BundleAtStart
from .options import Options
from .pool import pooled


def save(report: SessionReport, blobs: list[tuple[dict[str, str], bytes, KeyIndex | None]], store: BundleStore | None,
         options: Options, at_start: BundleAtStart, run: float, pools: Path, left_out: str = "") -> None:
    """Merge every process's artifacts and the pooled binaries into PATH once, under its lock; fill ``report.saved``.
    ``left_out``: why the session ran part of the suite ("" if it ran it whole): such a run records what it used but
    does not count toward ``compile_cache_max_unused_runs``."""
    if store is None:
        return
    path = store.name
    unreadable = at_start.problem or next((p.bundle_unreadable for p in report.processes if p.bundle_unreadable), "")
    if store.unreachable:
        report.saved = SaveResult(SaveStatus.LEFT_ALONE, f"{path} was neither read nor written: it gave no "
                                  "answer (see PROBLEM below); the next session that reaches it uses it as usual")
        return
    why = (next((p.bundle_unreadable_kind for p in report.processes if p.bundle_unreadable_kind), None)  # as found,
           or store.describe().unreadable or Unreadable.DAMAGED) if unreadable else None  # else as it looks now
    if unreadable and not (options.rebuild and why is Unreadable.DAMAGED):
        report.saved = SaveResult(SaveStatus.LEFT_ALONE, f"{path} was neither used nor written (see PROBLEM "
                                  f"below): {_LEFT_ALONE_ADVICE[why or Unreadable.DAMAGED]}")
        return
    if not (options.update or not at_start.existed):
        outside = "cold_cache tests and not_saved() blocks" if report.misses_not_saved() else "cold_cache tests"
        advice = ("add --compile-cache-update to merge this session's artifacts into it" if _missed(report)
                  else f"every compile outside {outside} hit: nothing to add to it" if _missed(report, looked_up=True)
                  else f"no test outside {outside} compiled anything: nothing to add to it")
        report.saved = SaveResult(SaveStatus.KEPT, f"{path} existed; {advice}")
        return
    if not blobs:
        report.saved = SaveResult(SaveStatus.NOTHING, (
            f"the warmup wrote {path} during the session, and the tests compiled nothing to add"
            if any(p.wrote_bundle for p in report.processes) else
            f"{path} already held everything the warmup compiled, and the tests compiled nothing to add"
            if any(p.warmup_found_all for p in report.processes) else
            "no test compiled anything to save (what cold_cache tests compile is never saved)"))
        return
    try:
        imported = _torchapi.ready_to_read()
    except _torchapi.TorchUnavailable as exc:
        _failed(report, f"{path}: {exc}", str(path))
        return
    start = time.perf_counter()
    history = {
        "built_compile_seconds": round(report.compile_seconds + report.warmup_seconds, 3),
        "headers_seconds": round(report.headers_seconds, 3),
        "tests": {nodeid: stats.get("compile_seconds", 0.0) for nodeid, stats in report.tests.items()},
        "session": report.session_record(time.time() - report.started) if report.started else {},
    }
    before, binaries = store.transfer, pooled(pools)
    merged = None
    try:
        additions = [make_entry(env, blob, _torchapi.describe_artifacts(blob), binaries=binaries, index=index)
                     for env, blob, index in blobs]
        saved = store.add(additions, history, run=run, max_unused_runs=options.max_unused_runs,
                          rebuild=options.rebuild, counted=not left_out)
        merged = saved.bundle
        repaired = [why for why in saved.dropped if at_start.repaired and why.startswith(REPLACED_UNREADABLE)]
        report.problems.extend(Problem(Concern.SAVING, f"{path}: {why}", str(path))
                               for why in saved.dropped if why not in repaired)
        artifacts: dict[str, dict[str, int]] = {}
        for entry in filter(None, (merged.find(env) for env in {env_id(env): env for env, _, _ in blobs}.values())):
            kinds = dict(entry.artifacts)
            with contextlib.suppress(BundleError):  # listed, none read
                listing = merged.carried_listing(entry)
                if listing.files:
                    kinds["cpp"] = listing.counts(_torchapi.cpu_probe_sources())
                if listing.triton_counts()["count"]:
                    kinds["triton_cache"] = listing.triton_counts()
            for kind, counts in kinds.items():
                total = artifacts.setdefault(kind, {"count": 0, "bytes": 0})
                total.update({key: total[key] + counts[key] for key in total})
    except NotABundle as exc:
        _failed(report, f"{exc}; it was left alone", str(path))
        return
    except (BundleError, _torchapi.MegaCacheError, _torchapi.TorchUnavailable) as exc:
        _failed(report, str(exc) if str(path) in str(exc) else f"{path}: {exc}", str(path))
        report.saved.transfer = store.transfer.since(before).to_json()
        return
    finally:
        if merged is not None:
            merged.release()
    report.saved = SaveResult(SaveStatus(saved.status.value), "", path=path, artifacts=artifacts,
                              bytes=saved.size, seconds=round(time.perf_counter() - start, 3), added=saved.added,
                              dropped_unused=dict(saved.unused), transfer=saved.transfer.to_json(),
                              added_artifacts=dict(saved.added_artifacts), import_seconds=round(imported, 3),
                              not_counted=left_out if options.max_unused_runs > 0 else "",
                              repaired=repaired)


def _failed(report: SessionReport, message: str, where: str) -> None:
    report.saved = SaveResult(SaveStatus.FAILED, message)
    report.problems.append(Problem(Concern.SAVING, message, where))


#: What a user can do about a bundle left alone, by its kind of problem.
_LEFT_ALONE_ADVICE = {
    Unreadable.DAMAGED: "move the file away or name another path; --compile-cache-rebuild writes a fresh bundle "
                        "over a damaged one",
    Unreadable.NOT_A_BUNDLE: "it is not a bundle, and nothing ever writes over it (not even --compile-cache-rebuild): "
                             "move the file away or name another path",
    Unreadable.NOT_A_FILE: "there is no file there to move: name another path, to a file inside a folder",
    Unreadable.UNWRITABLE: "let this user write in its folder, or name a path in a folder this user can write",
}


def exit_status(options: Options, report: SessionReport, session: pytest.Session) -> None:
    """A warmup failure, or a strict-mode problem, makes the exit status non-zero (never 0 or 5)."""
    bad = report.warmup_failed or (options.strict and (report.all_problems() or report.binary_problems()))
    if bad and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def write_json(path: Path | None, report: SessionReport) -> ReportWritten | None:
    """Write the ``--compile-cache-report`` file, making its folders; what was written, or ``None`` (see problems)."""
    if path is None:
        return None
    missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_atomic(path, json.dumps(report.to_json(), indent=1, sort_keys=True).encode(), fsync=False)
    except OSError as exc:
        blocked = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        why = f"{blocked} is a file, not a folder" if blocked is not None else (exc.strerror or str(exc))
        report.problems.append(Problem(Concern.REPORT, f"{path}: cannot write the report: {why}", str(path)))
        return None
    return ReportWritten(str(path.absolute()), str(missing[-1].absolute()) if missing else "", len(missing))


def _missed(report: SessionReport, looked_up: bool = False) -> bool:
    """Whether a cache that does not start empty by design missed (``looked_up``: or hit, or bypassed) in a test."""
    totals = report.totals
    if totals is None:
        return False
    by_design = Counter(report.misses_in_cold_caches()) + Counter(report.misses_not_saved())
    return any(c.misses + (c.hits + c.bypasses if looked_up else 0) > by_design[c.layer]
               for c in (totals.layer(layer) for layer in ("fx_graph", "aot_autograd")))
