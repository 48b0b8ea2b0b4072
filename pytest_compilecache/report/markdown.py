"""The compilecache section of a GitHub Actions job summary (Markdown), rendered from a :class:`~.model.SessionReport`;
appended to ``GITHUB_STEP_SUMMARY``'s file, never written over (earlier steps may have written to it)."""

from __future__ import annotations

import os
from pathlib import Path

from ..words import artifact_counts, placed_counts
from .model import SaveStatus, SessionReport, Status

#: The environment variable GitHub Actions names the job summary's file in.
SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
#: Rows of the table of the tests that spent the most time compiling.
TOP_TESTS = 10
#: Explanations of misses listed per layer.
EXPLANATIONS = 5


def _cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell, as code."""
    return "`" + text.replace("`", "'").replace("|", "\\|").replace("\n", " ") + "`"


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def _bundle_lines(report: SessionReport) -> list[str]:
    """What each process did with the bundle, and what was written."""
    lines = [f"**Bundle** {_cell(report.bundle_path)} at the start: {report.bundle_at_start or 'not looked at'}",
             ""] if report.bundle_path else []
    for process in (p for p in report.processes_in_order() if p.status is not Status.UNUSED):
        if not report.bundle_path and process.status is Status.LOADED:
            what = "this session's warmup, for this session's `warm_cache` tests only (no bundle named)"
        elif process.status is Status.WARMUP_FAILED:
            what = "warmup failed"
        else:
            reason = process.reason.removeprefix(f"{report.bundle_path}: ") if report.bundle_path else process.reason
            what = f"{process.status.value}: {reason}"
        who = "" if len(report.processes) == 1 else f" (xdist worker {process.process})"
        line = f"- **Bundle{who}** {what}"
        if process.loaded:
            line += (f"; loaded {artifact_counts(process.loaded)} ({_mb(process.loaded_bytes)} of compiled artifacts "
                     f"in {process.load_seconds:.2f} s)")
        if process.on_demand:
            line += (f"; on demand: {placed_counts(process.placed, process.on_demand)} read when needed"
                     + (f" ({_mb(process.placed_bytes)} unpacked into the cache folder)" if process.placed_bytes else ""))
        if process.downloaded_bytes:
            line += f"; downloaded {_mb(process.downloaded_bytes)}"
        if process.warmup_seconds is not None and not process.warmup_error:
            line += f"; the warmup ran here{' and wrote the bundle' if process.wrote_bundle else ''}: " \
                    f"{process.warmup_seconds:.1f} s"
            if process.warmup_found_all:
                line += " (the bundle already held everything it compiled)"
        lines.append(line)
    saved = report.saved
    if saved.status is SaveStatus.SAVED:
        imported = (f", after {saved.import_seconds:.2f} s importing torch's compiler"
                    if saved.import_seconds >= 0.1 else "")
        verb, what = report.written_words()
        lines.append(f"- **{verb}**: {what} ({_mb(saved.bytes)} in {saved.seconds:.2f} s{imported})")
    elif saved.status is SaveStatus.UNCHANGED:
        lines.append(f"- **unchanged**: the bundle already held everything this run compiled ({saved.seconds:.2f} s)")
    elif saved.status is not SaveStatus.NOT_ASKED:
        lines.append(f"- **{saved.status.value}**: {saved.reason}")
    if saved.transfer:
        lines.append(f"- moved {_mb(saved.transfer.get('downloaded', 0))} down, "
                     f"{_mb(saved.transfer.get('uploaded', 0))} up while saving")
    return lines + [""] if lines else []


def _time_lines(report: SessionReport) -> list[str]:
    """Compile time in tests and the warmup; against the same tests when the bundle first recorded them."""
    if not (report.compile_seconds or report.warmup_seconds):
        return []
    summed = " (summed over workers)" if len(report.processes) > 1 else ""
    line = f"**Compile time in tests:** {report.compile_seconds:.1f} s{summed}"
    if report.warmup_seconds:
        line += f", plus {report.warmup_seconds:.1f} s in the warmup"
    c = report.compared_with_build()
    if c is not None:
        text = c.sentence()
        line += ". " + text[0].upper() + text[1:]
    return [line + ".", ""]


def _layer_table(report: SessionReport) -> list[str]:
    """Per-layer totals, observable layers that counted anything."""
    if report.totals is None or report.totals.nothing_happened:
        return ["No test compiled anything.", ""]
    rows = ["| layer | hits | misses | bypasses | from bundle |", "|---|--:|--:|--:|--:|"]
    for layer in report.totals:
        if layer.observable and (layer.hits or layer.misses or layer.bypasses):
            rows.append(f"| {layer.layer} | {layer.hits} | {layer.misses} | {layer.bypasses} | {layer.from_bundle} |")
    d = report.totals.dynamo
    line = f"Dynamo: {d.cell('graphs')} graphs, {d.cell('recompiles')} recompiles, {d.cell('graph_breaks')} graph breaks."
    for where, misses in ((" Misses in tests whose cache starts empty by design (`cold_cache`, per-test isolation): ",
                           report.misses_in_cold_caches()),
                          (" Misses in `not_saved()` blocks (left out of the bundle on purpose): ",
                           report.misses_not_saved())):
        if misses:
            line += where + ", ".join(f"{layer} {n}" for layer, n in misses.items()) + "."
    return rows + ["", line, ""]


def _explained(report: SessionReport) -> list[str]:
    """Explained misses per layer, in a folded block."""
    layers = [s for s in report.totals or () if s.observable and s.explained]
    if not layers:
        return []
    lines = ["**Misses explained** (the nearest known entry for the same code, and what differs):", "",
             *(f"- {layer.explained_summary()}" for layer in layers),
             "", "<details><summary>explanations</summary>", ""]
    for layer in layers:
        lines.extend(f"- {layer.layer}: {_cell(text)}" for text in layer.explanations[:EXPLANATIONS])
    return lines + ["", "</details>", ""]


def _top_tests(report: SessionReport) -> list[str]:
    """The tests that spent the most time compiling, with their FX graph counts and Dynamo's."""
    ranked = sorted(report.tests.items(), key=lambda kv: -float(kv[1].get("compile_seconds", 0.0)))
    ranked = [(n, s) for n, s in ranked if float(s.get("compile_seconds", 0.0)) > 0][:TOP_TESTS]
    if not ranked:
        return []
    built = report.built_tests()
    then = any(n in built for n, _ in ranked)
    head = "| test | compile s |" + (" in the building run |" if then else "") + \
        " FX hits | FX misses | graphs | recompiles | graph breaks |"
    rule = "|---|--:|" + ("--:|" if then else "") + "--:|--:|--:|--:|--:|"
    title = f"**The {len(ranked)} tests that spent the most time compiling**"
    lines = [title + (f" (of {len(report.tests)} counted)" if len(report.tests) > len(ranked) else ""), "", head, rule]
    for nodeid, stats in ranked:
        fx, dyn = stats.get("fx_graph", {}), stats.get("dynamo", {})
        first = " (first in its process: torch's one-off start-up included)" if stats.get("first_in_process") else ""
        cells = [_cell(nodeid), f"{float(stats.get('compile_seconds', 0.0)):.2f}{first}"]
        if then:
            cells.append(f"{built[nodeid]:.2f}" if nodeid in built else "")
        cells += [str(fx.get("hits", "-")), str(fx.get("misses", "-"))]
        cells += ["-" if dyn.get(k) is None else str(dyn[k]) for k in ("graphs", "recompiles", "graph_breaks")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _problems(report: SessionReport) -> list[str]:
    problems = [p.text for p in report.problems_beside_the_failure()]
    problems += [f"C++ binary not used: {p}" for p in report.binary_problems()]
    failure = report.warmup_failed
    if failure:
        first = (failure.strip().splitlines() or [""])[0]
        problems.insert(0, "the warmup failed; this run's `warm_cache` tests skip (see the log)"
                        + (f": {first}" if first else ""))
    return ["> [!WARNING]", *(f"> {p.splitlines()[0] if p else p}" for p in problems), ""] if problems else []


def job_summary(report: SessionReport) -> str:
    """The Markdown section: the bundle's story, compile time, per-layer counts, misses explained, the top tests."""
    lines = ["## compilecache", "", *_problems(report), *_bundle_lines(report), *_time_lines(report),
             *_layer_table(report), *_explained(report), *_top_tests(report)]
    return "\n".join(lines).rstrip() + "\n\n"


def append_job_summary(report: SessionReport, environ: dict[str, str] | None = None) -> Path | None:
    """Append :func:`job_summary` to the file ``GITHUB_STEP_SUMMARY`` names; nothing (``None``) without it."""
    target = (os.environ if environ is None else environ).get(SUMMARY_ENV)
    if not target:
        return None
    path = Path(target)
    with path.open("a+b") as out:
        end = out.seek(0, os.SEEK_END)
        out.seek(max(end - 1, 0))
        out.write((b"\n" if end and out.read(1) != b"\n" else b"") + job_summary(report).encode("utf-8"))
    return path
