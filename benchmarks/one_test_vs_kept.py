"""CPU, issue 45: what one test costs as the bundle grows, against a kept cache folder.

For each SIZE, a suite of SIZE ``warm_cache`` tests, each compiling a function of its own (the
generator of ``small_tests_vs_kept.py``), is built twice: once into a bundle (the warmup compiles every
function), once into a kept ``TORCHINDUCTOR_CACHE_DIR`` with ``-p no:compilecache`` (by two workers). Then, in ROUNDS
alternating pairs: one test picked with ``-k`` (what a developer re-running a failing test does), pytest's
wall seconds and the peak memory (largest resident set of the pytest process, and of each ``-n 2``
worker); then the whole suite once per side; then an update: one function edited and its test re-run
with ``--compile-cache-update``, timed, with the bundle's growth, beside the same edit's test run from
the kept folder (which compiles it too).

    python benchmarks/one_test_vs_kept.py [--keep=DIR] [--phases] [ROUNDS] SIZE [SIZE ...]

With ``--keep=DIR``, each size's suites, bundle and kept folder are built in ``DIR/SIZE`` and left
there; a later run with the same DIR measures them without building again (at 1,000 tests a build
takes about half an hour a side on two cores). The update's edit is undone afterwards there. With
``--phases``, the one-test runs also sum where their time goes (``probe/phases.py``), medians per side
and of each pair's difference; a round of ROUNDS 0 builds and measures nothing.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from probe.installed import as_installed
from probe.phase_log import read_phases
from probe.runner import pytest_run, spread
from small_tests_vs_kept import QUIET, suite

PEAK = Path(__file__).parent / "probe"


def _peaks(folder: Path) -> list[float]:
    """The peaks (MB) the probe wrote into ``folder``, one file per process, then emptied."""
    found = [int(p.read_text()) / 1024 for p in folder.glob("peak-*")]
    for p in folder.glob("peak-*"):
        p.unlink()
    return found


def measure(work: Path, size: int, rounds: int, with_phases: bool = False) -> None:
    """Build both sides for ``size`` tests in ``work`` (unless built there already) and print their figures."""
    bundle = work / "suite.bundle"
    reuse = bundle.exists() and (work / "kept-cache").exists() and (work / "built").exists()
    if not reuse:
        for made in ("plugin", "kept", "kept-cache", "xdg"):
            shutil.rmtree(work / made, ignore_errors=True)
        bundle.unlink(missing_ok=True)
    plugin = work / "plugin" if reuse else suite(work / "plugin", 0, size, plugin=True)
    kept = work / "kept" if reuse else suite(work / "kept", 0, size, plugin=False)
    peaks = work / "peaks"
    peaks.mkdir(exist_ok=True)
    phase_log = work / "phases.log"
    probe_env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(PEAK), os.environ.get("PYTHONPATH", "")])),
                 "PEAK_OUT": str(peaks), "PHASES_OUT": str(phase_log)}
    sides = {"plugin": (plugin, [f"--compile-cache-bundle={bundle}"], {"XDG_CACHE_HOME": str(work / "xdg")}),
             "kept": (kept, ["-p", "no:compilecache"], {"TORCHINDUCTOR_CACHE_DIR": str(work / "kept-cache")})}

    def run(side: str, *args: str) -> tuple[float, list[float]]:
        folder, own, env = sides[side]
        ran = pytest_run([*QUIET, *own, "-p", "peak", *args], folder, {**env, **probe_env})
        return ran.seconds, _peaks(peaks)

    if reuse:
        print(f"\n{size} tests: built before in {work}; bundle {bundle.stat().st_size / 1e6:.2f} MB", flush=True)
    else:
        built = {"plugin": run("plugin")[0], "kept": run("kept", "-n", "2")[0]}  # the same folder, sooner
        (work / "built").write_text(f"plugin {built['plugin']:.1f} s, kept (-n 2) {built['kept']:.1f} s\n")
        print(f"\n{size} tests: built plugin {built['plugin']:.1f} s, kept (-n 2) {built['kept']:.1f} s; "
              f"bundle {bundle.stat().st_size / 1e6:.2f} MB", flush=True)
    if rounds == 0:
        return
    one = f"test_warm_{size // 2:03d}"
    times: dict[str, list[float]] = {}
    memory: dict[str, list[float]] = {}
    phases: dict[str, list[dict[str, float]]] = {"plugin": [], "kept": []}
    for round_ in range(rounds):
        for side in (("plugin", "kept") if round_ % 2 == 0 else ("kept", "plugin")):
            seconds, peak = run(side, "-k", one, *(("-p", "phases") if with_phases else ()))
            times.setdefault(side, []).append(seconds)
            memory.setdefault(side, []).append(max(peak))
            if with_phases:
                summed = read_phases(phase_log)
                summed["outside the probe (interpreter's end)"] = seconds - summed.get("total", 0.0) - summed.get(
                    "all.process start to probe import", 0.0) - summed.get("all.unconfigure to atexit", 0.0)
                phases[side].append(summed)
    ratios = [p / k for p, k in zip(times["plugin"], times["kept"])]
    over = [p - k for p, k in zip(times["plugin"], times["kept"])]
    print(f"  one test (-k {one}), {rounds} pairs: plugin {spread(times['plugin'])} s, kept {spread(times['kept'])} s, "
          f"each pair's ratio {spread(ratios, 3)}x, plugin - kept {spread(over)} s")
    print(f"  peak memory of pytest, MB: plugin {spread(memory['plugin'], 0)}, kept {spread(memory['kept'], 0)}")
    if with_phases:
        print("\n  | phase (seconds, one test) | plugin | kept folder | plugin - kept, each pair |\n  |---|---|---|---|")
        for key in sorted({k for side in phases.values() for run_ in side for k in run_}):
            mine, theirs = ([p.get(key, 0.0) for p in phases[side]] for side in ("plugin", "kept"))
            print(f"  | {key} | {spread(mine)} | {spread(theirs)} | {spread([a - b for a, b in zip(mine, theirs)])} |")
        print(flush=True)
    for mode in ([], ["-n", "2"]):
        whole = {side: run(side, *mode) for side in ("plugin", "kept")}
        print(f"  whole suite{' -n 2' if mode else ''}: plugin {whole['plugin'][0]:.2f} s, kept {whole['kept'][0]:.2f} s "
              f"({whole['plugin'][0] / whole['kept'][0]:.3f}x); largest process MB: plugin {max(whole['plugin'][1]):.0f}, "
              f"kept {max(whole['kept'][1]):.0f}", flush=True)
    originals = {side: (sides[side][0] / "small.py").read_text() for side in sides}
    shutil.copyfile(bundle, work / "suite.bundle.before-update")
    for side, original in originals.items():
        (sides[side][0] / "small.py").write_text(original.replace(f"def f_{size // 2}(x):\n    y = torch.sin(x * ",
                                                                  f"def f_{size // 2}(x):\n    y = torch.sin(x * 2 * "))
    before = bundle.stat().st_size
    try:
        seconds, peak = run("plugin", "-k", one, "--compile-cache-update")
        # The same edit run from the kept folder: what compiling the edited function costs without a bundle.
        kept_seconds, kept_peak = run("kept", "-k", one)
        print(f"  update after one edit: {seconds:.2f} s, peak {max(peak):.0f} MB, bundle {before / 1e6:.2f} -> "
              f"{bundle.stat().st_size / 1e6:.2f} MB; the same edit from the kept folder: {kept_seconds:.2f} s, "
              f"peak {max(kept_peak):.0f} MB", flush=True)
    finally:
        for side, original in originals.items():
            (sides[side][0] / "small.py").write_text(original)
        os.replace(work / "suite.bundle.before-update", bundle)


def main() -> None:
    with_phases = "--phases" in sys.argv
    args = [a for a in sys.argv[1:] if not a.startswith("--keep=") and a != "--phases"]
    keep = next((Path(a.split("=", 1)[1]).resolve() for a in sys.argv[1:] if a.startswith("--keep=")), None)
    rounds = int(args[0]) if len(args) > 1 else 7
    sizes = [int(a) for a in args[1:]] or [20, 200]
    print(f"plugin byte-compiled as pip installs it: {as_installed()}", flush=True)
    for size in sizes:
        if keep is not None:
            (keep / str(size)).mkdir(parents=True, exist_ok=True)
            measure(keep / str(size), size, rounds, with_phases)
            continue
        work = Path(tempfile.mkdtemp(prefix=f"one-test-{size}-")).resolve()
        try:
            measure(work, size, rounds, with_phases)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
