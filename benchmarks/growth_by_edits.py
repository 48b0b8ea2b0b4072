"""CPU, issue 45: a bundle updated by every CI run, one edit a run: its size run after run, kept against pruned.

A suite of SIZE ``warm_cache`` tests, each compiling a function of its own (the generator of
``small_tests_vs_kept.py``), builds one bundle; two copies of it are then updated by EDITS runs of the
whole suite with ``--compile-cache-update``, each run after a new edit (function ``i`` of run ``i`` gets
another constant, so its old entry is unused from then on): one copy with
``compile_cache_max_unused_runs = 0`` (keep everything), the other with the default (10). Per run: the two
bundles' sizes and the counts of FX graph entries they hold, and each run's wall seconds and the
bundle's save seconds (from the report). Then one updating run with ``-k`` (part of the suite), which
must drop nothing.

    python benchmarks/growth_by_edits.py [SIZE] [EDITS]
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from probe.installed import as_installed
from probe.runner import pytest_run
from small_tests_vs_kept import QUIET, suite

SIDES = {"kept everything (N = 0)": ["-o", "compile_cache_max_unused_runs=0"], "default (N = 10)": []}


def edited(source: str, i: int) -> str:
    """``small.py`` with function ``i``'s first constant changed."""
    head = f"def f_{i}(x):\n    y = torch.sin(x * "
    assert head in source, i
    return source.replace(head, f"def f_{i}(x):\n    y = torch.sin(x * 1.5 * ")


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    edits = int(sys.argv[2]) if len(sys.argv) > 2 else 14
    print(f"plugin byte-compiled as pip installs it: {as_installed()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix=f"growth-{size}-")).resolve()
    try:
        folder = suite(work / "suite", 0, size, plugin=True)
        env = {"XDG_CACHE_HOME": str(work / "xdg")}
        built = pytest_run([*QUIET, f"--compile-cache-bundle={work / 'built.bundle'}"], folder, env)
        print(f"{size} tests built in {built.seconds:.1f} s: {(work / 'built.bundle').stat().st_size / 1e6:.2f} MB",
              flush=True)
        bundles = {side: work / f"side-{n}.bundle" for n, side in enumerate(SIDES)}
        for bundle in bundles.values():
            shutil.copyfile(work / "built.bundle", bundle)
        print(f"{'run':>4} | " + " | ".join(f"{side}: MB, fx_graph, run s, save s" for side in SIDES))
        for run in range(1, edits + 2):
            partial = run == edits + 1
            if not partial:
                source = folder / "small.py"
                source.write_text(edited(source.read_text(), run - 1))
            cells = []
            for side, extra in SIDES.items():
                report = work / "r.json"
                args = [*QUIET, f"--compile-cache-bundle={bundles[side]}", "--compile-cache-update",
                        f"--compile-cache-report={report}", *extra, *(["-k", "test_warm_000"] if partial else [])]
                ran = pytest_run(args, folder, env)
                saved = json.loads(report.read_text())["bundle"]["saved"]
                fx = saved["artifacts"].get("inductor", {}).get("count", 0)
                dropped = sum(saved.get("dropped_unused", {}).values())
                cells.append(f"{bundles[side].stat().st_size / 1e6:6.2f} MB {fx:4d} {ran.seconds:6.2f} s "
                             f"{saved['seconds']:5.2f} s" + (f" (dropped {dropped})" if dropped else "")
                             + (f" [not counted: {saved['not_counted']}]" if saved.get("not_counted") else ""))
            print(f"{'-k' if partial else run:>4} | " + " | ".join(cells), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
