"""The compilecache section of a GitHub Actions job summary (Markdown), rendered from a :class:`~.model.SessionReport`;
appended to ``GITHUB_STEP_SUMMARY``'s file, never written over (earlier steps may have written to it)."""

from __future__ import annotations

import os
from pathlib import Path

from .model import SessionReport
from .terminal import bundle_lines, cold_lines, compile_time_lines, explained_lines

#: The environment variable GitHub Actions names the job summary's file in.
SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
#: Rows of the table of the tests that spent the most time compiling.
TOP_TESTS = 10


def _cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell, as code."""
    return "`" + text.replace("`", "'").replace("|", "\\|").replace("\n", " ") + "`"


def _bundle_lines(report: SessionReport) -> list[str]:
    """What each process did with the bundle, and what was written, in the terminal's words (details nested)."""
    lines = [f"**Bundle** {_cell(report.bundle_path)} at the start: {report.bundle_at_start or 'not looked at'}",
             ""] if report.bundle_path else []
    lines += [f"  - {line.strip()}" if line.startswith("  ") else f"- {line}" for line in bundle_lines(report)]
    return lines + [""] if lines else []


def _time_lines(report: SessionReport) -> list[str]:
    """Compile time in tests and the warmup; against the same tests when the bundle first recorded them."""
    if not (report.compile_seconds or report.warmup_seconds):
        return []
    return [f"- {line.strip()}" for line in compile_time_lines(report)] + [""]


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
    return rows + ["", line, *(f"- {cold.strip()}" for cold in cold_lines(report, report.totals)), ""]


def _explained(report: SessionReport) -> list[str]:
    """Explained misses per layer, by kind, with the first few explanations, as the terminal says them."""
    lines = explained_lines(report.totals) if report.totals is not None else []
    return ["```text", *lines, "```", ""] if lines else []


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
