"""GPU: the plugin's own steps in a warm run, timed one by one, and the first test's body profiled on
both sides (the plugin from a bundle, plain pytest on a kept folder; see gpu_vs_kept.py for the setup).

Builds both sides, then REPEATS alternating rounds of warm runs with ``probe/steps.py``: the median
seconds of each wrapped step of the plugin (bundle preparation and its parts, folder filling, on-demand
placing, what made a folder whole), the phases of ``probe/phases.py``, and, summed over the rounds,
where the first test's body (the start-up test) differs between the sides, function by function.

    python3 benchmarks/gpu_steps.py [--repeats 3] [OUTDIR]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import statistics
import tempfile
from pathlib import Path

from gpu_profile import difference
from gpu_vs_kept import PHASES, QUIET, phases, run
from probe.installed import as_installed
from probe.phase_log import print_table
from probe.runner import spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("out", nargs="?", default="")
    args = parser.parse_args()
    print(f"plugin byte-compiled as pip installs it: {as_installed()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-steps-"))
    out = Path(args.out) if args.out else work / "out"
    out.mkdir(parents=True, exist_ok=True)
    bundle, kept = work / "models.bundle", work / "kept"
    plugin = ["gpu_models", *QUIET, f"--compile-cache-bundle={bundle}"]
    plain = ["gpu_models_plain", *QUIET, "-p", "no:compilecache"]
    kept_env = {"TORCHINDUCTOR_CACHE_DIR": str(kept), "TRITON_CACHE_DIR": str(kept / "triton")}
    print(f"build: plugin {run(plugin, {}, must_pass=True)[0]:.1f} s, "
          f"kept {run(plain, kept_env, must_pass=True)[0]:.1f} s", flush=True)
    steps_log, phase_log = work / "steps.jsonl", work / "phases.log"
    probe = {"PYTHONPATH": os.pathsep.join(filter(None, [str(PHASES), os.environ.get("PYTHONPATH", "")])),
             "PHASES_OUT": str(phase_log), "STEPS_OUT": str(steps_log)}
    walls: dict[str, list[float]] = {"plugin": [], "kept": []}
    phase_sums: dict[str, dict[str, list[float]]] = {"plugin": {}, "kept": {}}
    steps: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    triggers: dict[str, int] = {}
    for round_ in range(args.repeats):
        for who in (["plugin", "kept"] if round_ % 2 == 0 else ["kept", "plugin"]):
            profile = out / f"first-{who}-{round_}.prof"
            side, env = (plugin, {}) if who == "plugin" else (plain, kept_env)
            took, _ = run([*side, "-p", "phases", "-p", "steps"], {**env, **probe, "STEPS_PROFILE": str(profile)})
            walls[who].append(took)
            for phase, value in phases(phase_log, took).items():
                phase_sums[who].setdefault(phase, []).append(value)
            phase_log.unlink(missing_ok=True)
            line = json.loads(steps_log.read_text().splitlines()[-1])
            steps_log.unlink()
            if who == "plugin":
                for name, value in line["seconds"].items():
                    steps.setdefault(name, []).append(value)
                    counts.setdefault(name, []).append(line["calls"][name])
                for where, n in line["triggers"].items():
                    triggers[where] = triggers.get(where, 0) + n
            print(f"round {round_ + 1} {who}: {took:.2f} s", flush=True)
    print("\nwhole runs (wall, s):", {k: [round(v, 2) for v in vs] for k, vs in walls.items()})
    print("\nthe plugin's steps, median seconds a run (calls a run):")
    for name, values in sorted(steps.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"  {spread(values, 3, width=7)}  x{statistics.median(counts[name]):g}  {name}")
    print("\nwhat made a folder whole (torch frames of the caller), over all runs:")
    for where, n in sorted(triggers.items(), key=lambda kv: -kv[1]):
        print(f"  {n}  {where}")
    print_table("\nphases (medians, seconds):", phase_sums)
    for who in ("plugin", "kept"):
        stats = pstats.Stats(*[str(p) for p in sorted(out.glob(f"first-{who}-*.prof"))])
        stats.dump_stats(str(out / f"first-{who}.prof"))
    difference(out / "first-plugin.prof", out / "first-kept.prof",
               f"the start-up test's body, summed over {args.repeats} runs a side", count=45)


if __name__ == "__main__":
    main()
