"""The compilecache section of the terminal summary, rendered from a :class:`~.model.SessionReport`."""

from __future__ import annotations

import dataclasses
import os

from .._torchapi import patches
from ..stats import DYNAMO_REASONS, CacheStats
from ..words import artifact_counts, placed_counts
from .model import Concern, SaveStatus, SessionReport, Status


#: Reasons of each kind the summary prints; the JSON report has them all, per test.
SUMMARY_REASONS = 5


def _dynamo_lines(totals: CacheStats, workers: bool) -> list[str]:
    """Dynamo's counts over all tests, with the first few reasons (first lines only)."""
    dynamo = totals.dynamo
    shown = dataclasses.replace(dynamo, **{k: getattr(dynamo, k)[:SUMMARY_REASONS] for k in DYNAMO_REASONS})
    lines = [f"Dynamo over all tests{' (summed over workers)' if workers else ''}:", shown.table(brief=True)]
    hidden = sum(len(getattr(dynamo, k)) - len(getattr(shown, k)) for k in DYNAMO_REASONS)
    if hidden:
        lines.append(f"  ... and {hidden} more reasons, per test in --compile-cache-report")
    return lines


def explained_lines(totals: CacheStats) -> list[str]:
    """Explained misses per layer, by kind, and the first few explanations (all in the JSON report)."""
    layers = [s for s in totals if s.observable and s.explained]
    lines = ["misses explained:"] if layers else []
    for layer in layers:
        lines.append(f"  {layer.explained_summary()}")
        lines.extend(f"    {text}" for text in layer.explanations[:SUMMARY_REASONS])
        if len(layer.explanations) > SUMMARY_REASONS:
            lines.append(f"    ... and {len(layer.explanations) - SUMMARY_REASONS} more, per test in --compile-cache-report")
    return lines


def patch_lines(report: SessionReport, verbose: bool) -> list[str]:
    """The features the register of patches leaves off (in any process: a wrapper's fault stops it where it
    happened), and a torch newer than the register knows; with ``verbose``, first how many took and which did not."""
    statuses = [p.patches for p in report.processes_in_order() if p.patches]
    if not statuses:
        return []
    status, torch = statuses[0], statuses[0]["torch"]
    took, missed = status["took"], status["missed"]
    off = {feature: why for s in statuses for feature, why in s["features_off"].items()}
    lines = [f"torch patches (torch {torch}): {len(took)} took, {len(missed)} did not"] if verbose else []
    if status.get("newer"):
        lines.append(f"torch {torch} is newer than any release the register of patches was checked on "
                     f"({patches.NEWEST_SEEN}): a feature it cannot take is said below, if any")
    lines += [f"off on torch {torch}: {feature} ({why})" for feature, why in off.items()]
    if verbose:
        lines += [f"  not taken: {name}: {why}" for name, why in missed.items()
                  if not any(f"{name}:" in reasons for reasons in off.values())]
    return lines


def _short(path: str) -> str:
    """``path`` relative to the current folder where it lies inside it."""
    if "://" in path or not os.path.isabs(path):
        return path
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") or os.path.isabs(relative) else relative


def _compiles(report: SessionReport) -> str:
    """The FX graphs' outcomes, and Dynamo's breaks and recompiles where there were any."""
    totals = report.totals
    if totals is None:
        return ""  # no test was counted (none used a fixture, no session-wide option)
    if totals.nothing_happened:
        return "no counted test compiled anything"
    fx, dynamo = totals.layer("fx_graph"), totals.dynamo
    if not fx.observable:
        return f"FX graphs not observable: {fx.reason}"
    source = report.hits_came_from()
    came = f" ({fx.from_bundle} from the {source})" if fx.from_bundle else ""
    cold = report.misses_in_cold_caches().get("fx_graph", 0)
    empty = (" (all in cold_cache or isolated tests)" if cold == fx.misses else f" ({cold} in cold_cache or isolated "
             "tests)") if cold else ""
    words = f"FX graphs: {fx.hits} hit{came}, {fx.misses} missed{empty}"
    for kind in ("graph_breaks", "recompiles"):
        if kind not in dynamo.unobservable and dynamo.count(kind):
            words += f", {dynamo.count(kind)} {kind.replace('_', ' ')}"
    return words


def _bundle(report: SessionReport) -> str:
    """What became of the bundle, in a clause; ``""`` where there is none and no warmup ran."""
    if not report.bundle_path:
        ran = report.warmup_seconds
        return f"warmup {ran:.1f} s, for this session only (--compile-cache-bundle=PATH keeps it)" if ran else ""
    path, saved = _short(report.bundle_path), report.saved
    ours = [p for p in report.processes if p.status is not Status.UNUSED and not p.own_warmup]
    if saved.status is SaveStatus.SAVED or any(p.wrote_bundle for p in ours):
        held = {kind: counts["count"] for kind, counts in saved.artifacts.items()}
        verb = "rebuilt" if saved.repaired else "updated" if report.bundle_existed else "written"
        added = saved.added_artifacts if verb == "updated" and saved.added else {}
        details = "; ".join(part for part in (f"added {artifact_counts(added)}" if added else "",
                                              f"holds {artifact_counts(held)}" if held else "",
                                              f"{saved.bytes / 1e6:.2f} MB" if saved.bytes else "") if part)
        return f"bundle {path} {verb}" + (f" ({details})" if details else "")
    if any(p.status is Status.LOADED for p in ours):
        kept = saved.status in (SaveStatus.KEPT, SaveStatus.UNCHANGED, SaveStatus.NOTHING)
        return f"bundle {path} loaded" + (", unchanged" if kept else "")
    if any(p.concern in (Concern.BUNDLE, Concern.WARMUP, Concern.SAVING) for p in report.all_problems()):
        return f"bundle {path} not used (see PROBLEM below)"
    told = next((p for p in ours if p.status is not Status.LOADED), None)
    return f"bundle {path} {told.status.value}: {told.reason}" if told else f"bundle {path} not used"


def headline(report: SessionReport) -> str:
    """The one line of a run where all is well: the bundle, what the graphs did, and the time against its building."""
    compared = report.compared_with_build()
    clock = compared.brief() if compared is not None else ""
    if not clock and report.warmup_seconds and report.bundle_path:
        clock = f"warmup {report.warmup_seconds:.1f} s"
    return "; ".join(part for part in (_bundle(report), _compiles(report), clock) if part)


def attention_lines(report: SessionReport) -> list[str]:
    """What the user must see even when asked for quiet: failures, problems, explained misses,
    and the bundle's save where it did not go as asked."""
    saved = report.saved
    lines = []
    if saved.status is SaveStatus.KEPT and "--compile-cache-update" in saved.reason:
        lines.append(f"bundle kept: {saved.reason}")
    elif saved.status is SaveStatus.LEFT_ALONE:
        lines.append(f"bundle {saved.status.value}: {saved.reason or saved.path}")
    if report.totals is not None:
        lines.extend(explained_lines(report.totals))
    lines.extend(f"not saved: {why}" for why in dict.fromkeys(w for p in report.processes for w in p.not_saved))
    lines.extend(_trouble_lines(report))
    return lines


def _trouble_lines(report: SessionReport) -> list[str]:
    """The warmup's failure, the problems, and the carried binaries not used."""
    lines = []
    if failure := report.warmup_failed:
        lines.append("WARMUP FAILED (this run's warm_cache tests skip):")
        lines.extend("  " + line for line in failure.rstrip().splitlines())
    lines.extend(f"PROBLEM: {problem}" for problem in report.problems_beside_the_failure())
    return lines + [f"C++ binary not used: {problem}" for problem in report.binary_problems()]


def summary_lines(report: SessionReport, verbosity: int = 1) -> list[str]:
    """The terminal summary at ``verbosity`` (pytest's ``-v`` count, or ``verbosity_compilecache``): with ``-v``,
    everything; by default, the :func:`headline` and the :func:`attention_lines`; with ``-q``, those alone."""
    if verbosity > 0:
        return detailed_lines(report)
    attention = attention_lines(report)
    if verbosity < 0:
        return attention
    line = headline(report)
    return [line, *attention] if line else attention


def detailed_lines(report: SessionReport) -> list[str]:
    """The summary under ``-v``: per-layer totals, compile time, and what was loaded, warmed up and saved."""
    totals, workers = report.totals, len(report.processes) > 1
    if totals is None or totals.nothing_happened:
        lines = ["no counted test compiled anything (a test is counted when it uses cold_cache or warm_cache, or "
                 "with --compile-cache-isolate)"]
    else:
        def of_all(misses: dict[str, int]) -> str:
            return ", ".join(f"{layer} {n} of {totals.layer(layer).misses}" for layer, n in misses.items())

        lines = [f"per-layer totals over all tests{' (summed over workers)' if workers else ''}:",
                 totals.table(source=report.hits_came_from())]
        if cold := of_all(report.misses_in_cold_caches()):
            lines.append("  misses in tests whose cache starts empty by design (cold_cache, --compile-cache-isolate), "
                         f"of all misses: {cold}")
        if left_out := of_all(report.misses_not_saved()):
            lines.append("  misses in not_saved() blocks (left out of the bundle on purpose), of all misses: "
                         + left_out)
        lines += [*_dynamo_lines(totals, workers), *explained_lines(totals)]
    compared = report.compared_with_build()
    if report.compile_seconds or report.warmup_seconds or compared is not None:
        line = (f"compile time in tests: {report.compile_seconds:.1f} s of wall time (Dynamo, Inductor, C++ builds, "
                f"Triton, autotuning, loading compiled code{'; summed over workers' if workers else ''})")
        if report.warmup_seconds:
            line += f", plus {report.warmup_seconds:.1f} s in the warmup"
        first = [float(s.get("compile_seconds", 0.0)) for s in report.tests.values() if s.get("first_in_process")]
        if first:
            line += (f"; of the tests' time, {sum(first):.1f} s in the first compiling test of each process, which "
                     "pays torch's one-off start-up (a warmup pays it where one runs)")
        lines += [line] + (["  " + compared.sentence()] if compared is not None else [])
    lines.extend(bundle_lines(report))
    lines.extend(_trouble_lines(report))
    if caught := report.caught_everywhere():
        lines.append("caught and went on past: " + "; ".join(f"{n} x {where}" for where, n in caught.items()))
    if report.written is not None:
        made, folders = report.written.made, report.written.folders_made
        made = (f" (made {folders} folders for it, from {made})" if folders > 1 else
                f" (made the folder {made} for it)" if made else "")
        lines.append(f"report written: {report.written.path}{made}")
    return lines


def bundle_lines(report: SessionReport) -> list[str]:
    """What each process did with the bundle, and what the end of the session wrote (details indented)."""
    lines = []
    if report.checked_downloaded:
        lines.append(f"bundle checked at session start (--compile-cache-strict): downloaded "
                     f"{report.checked_downloaded / 1e6:.2f} MB from {report.bundle_path}")
    for process in (p for p in report.processes_in_order() if p.status is not Status.UNUSED):
        own = process.own_warmup and process.status is Status.LOADED and not report.bundle_path
        instead = process.own_warmup and process.status is Status.LOADED and bool(report.bundle_path)
        who = f" ({process.process})" if len(report.processes) > 1 else ""
        if instead and process.warmup_seconds is not None:
            lines.append(f"warmup{who}: ran here: {process.warmup_seconds:.1f} s; {report.bundle_path} could not be "
                         "used (see PROBLEM below): what it compiled is for this session's warm_cache tests only")
        elif instead:
            lines.append(f"warmup{who}: loaded what this session's warmup compiled ({report.bundle_path} could not "
                         "be used)")
        elif own and process.warmup_seconds is not None and process.warmup_folder:
            fx = (process.warmup_stats or {}).get("fx_graph") or {}
            found = f"; this run it found {fx.get('hits', 0)} of {fx.get('hits', 0) + fx.get('misses', 0)} FX graphs there"
            lines.append(f"warmup{who}: ran here: {process.warmup_seconds:.1f} s, in its folder kept between runs, "
                         f"{process.warmup_folder} (--compile-cache-isolate-mode=worker){found}; "
                         "--compile-cache-bundle=PATH keeps them as a bundle")
        elif own and process.warmup_seconds is not None:
            lines.append(f"warmup{who}: ran here: {process.warmup_seconds:.1f} s; what it compiled is "
                         "for this session's warm_cache tests only; --compile-cache-bundle=PATH keeps it for later runs")
        elif own:
            lines.append(f"warmup{who}: loaded what this session's warmup compiled")
        elif process.status is Status.WARMUP_FAILED:
            lines.append(f"bundle{who}: warmup failed, see WARMUP FAILED below")
        elif process.status is Status.LOADED and process.warmup_seconds is not None:
            lines.append(f"bundle{who}: warmed up here, then loaded: {process.reason}")
        else:
            lines.append(f"bundle{who}: {process.status.value}: {process.reason}")
        if process.loaded:
            lines.append(f"  loaded {artifact_counts(process.loaded)} ({process.loaded_bytes / 1e6:.2f} MB of compiled "
                         f"artifacts in {process.load_seconds:.2f} s)")
        if process.on_demand:
            unpacked = f" ({process.placed_bytes / 1e6:.2f} MB unpacked into the cache folder)" if process.placed_bytes else ""
            lines.append(f"  on demand: {placed_counts(process.placed, process.on_demand)} read when needed{unpacked}")
        if process.downloaded_bytes:
            lines.append(f"  downloaded {process.downloaded_bytes / 1e6:.2f} MB from {report.bundle_path}")
        elif process.downloaded_bytes == 0 and process.status is Status.LOADED and report.bundle_path \
                and process.reason.startswith(f"{report.bundle_path}: "):
            lines.append("  nothing downloaded: every part of it the tests used was on this machine already")
        carried, probes, kernels = (process.binaries.get(k, 0) for k in ("carried", "probes", "triton_kernels"))
        if carried or kernels:
            lines.append(f"  C++ binaries: {carried} kernel{'s' if carried != 1 else ''} carried, "
                         f"{process.binaries.get('fit', 0)} fit this machine"
                         + (f"; and {probes} CPU probes (torch's checks of the CPU's vector instructions)" if probes
                            else "")
                         + (f"; {kernels} Triton kernels from Triton's own cache" if kernels else ""))
        if process.warmup_seconds is not None and not process.warmup_error and not own and not instead:
            wrote = f" and wrote {report.bundle_path}" if process.wrote_bundle else ""
            held = f"; {report.bundle_path} already held everything it compiled" if process.warmup_found_all else ""
            lines.append(f"  warmup ran here{wrote}: {process.warmup_seconds:.1f} s{held}")
    saved = report.saved
    moved = (f"; before that, {saved.import_seconds:.2f} s importing torch's compiler in this process"
             if saved.import_seconds >= 0.1 else "")
    if saved.transfer:
        moved += (f"; moved {saved.transfer.get('downloaded', 0) / 1e6:.2f} MB down, "
                  f"{saved.transfer.get('uploaded', 0) / 1e6:.2f} MB up")
    if saved.status is SaveStatus.SAVED:
        verb, what = report.written_words()
        size = f"({saved.bytes / 1e6:.2f} MB in {saved.seconds:.2f} s{moved})"
        lines.append(f"bundle {verb}: {saved.path}: {what} {size}")
        if saved.repaired:
            lines.append("  rebuilt (--compile-cache-rebuild): what it held could not be read (the header says why); "
                         "its entries were dropped and a fresh one written")
        if saved.dropped_unused:
            lines.append("  dropped as unused in the last updating runs (compile_cache_max_unused_runs): "
                         + artifact_counts(saved.dropped_unused))
    elif saved.status is SaveStatus.UNCHANGED:
        lines.append(f"bundle unchanged: {report.bundle_path} already holds everything this run compiled "
                     f"({saved.seconds:.2f} s{moved})")
    elif saved.status is SaveStatus.NOTHING:
        lines.append(f"bundle not written, nothing to save: {saved.reason}" + moved)
    elif saved.status is not SaveStatus.NOT_ASKED:
        lines.append(f"bundle {saved.status.value}: {saved.reason}" + moved)
    if saved.not_counted and saved.status is SaveStatus.SAVED:
        lines.append(f"  not counted toward compile_cache_max_unused_runs: {saved.not_counted}")
    lines.extend(f"  not saved: {why}" for why in dict.fromkeys(w for p in report.processes for w in p.not_saved))
    return lines
