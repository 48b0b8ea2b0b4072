"""GPU, the user's baseline: the model suite warm from a bundle (the plugin) against the same compiles
run by plain pytest without the plugin on a kept TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR.

On a GPU machine with timm and transformers (see benchmarks/gpu_models/):

1. Build: the plugin's suite (``gpu_models/``) with ``--compile-cache-bundle`` (the warmup compiles
   the three models once), and the plain suite (``gpu_models_plain/``, ``-p no:compilecache``, only
   ``torch._dynamo.reset()`` between tests) once on a new kept folder.
2. REPEATS rounds, the order alternating each round: a warm plugin run (a new process loading the
   bundle) and a warm plain run on the kept folder. Each run's wall time (the subprocess, as a user
   times it) and each model test's compile-and-first-call seconds; for the plugin's warm tests, the
   autotune counts and how often Triton's autotuner and Inductor's GEMM autotuning benchmarked.
3. The floor: the plain suite with Dynamo off (eager), twice.
   Each warm run also sums pytest's phases (``probe/phases.py``): start-up to the end of collection,
   the loop's start to the first test, tests' set-up, bodies and tear-down, the session's end, and
   the process's exit (the wall time after the last phase); medians per side are printed.
4. With ``--cold-mlp``: the plugin's suite built again with one more cold_cache test (the
   max-autotune MLP compiled cold before the warm tests), then warm runs: does a warm test benchmark?

5. With ``--against NAME=DIR``: a third side in the same rounds, the plugin's suite with the package
   found first in DIR (another checkout of the plugin), warm from the same bundle. ``--no-eager``
   leaves out step 3. With ``--select EXPR``, the warm rounds run only the tests ``-k EXPR`` picks (one
   test re-run from the whole suite's bundle, issue 45).

    python3 benchmarks/gpu_vs_kept.py [--repeats 5] [--cold-mlp 3] [--steps] [--against NAME=DIR] [--no-eager]
                                      [--select EXPR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
from pathlib import Path

from probe.installed import as_installed
from probe.phase_log import print_table, read_phases
from probe.runner import pytest_run, spread

HERE = Path(__file__).parent
QUIET = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-W", "ignore::DeprecationWarning",
         "-W", "ignore::UserWarning"]


FAILED: list[str] = []


PHASES = HERE / "probe"


def phases(log: Path, wall: float) -> dict[str, float]:
    """The phases the probe summed in the run just ended (plain and warm tests' together), and the
    wall time outside them."""
    found: dict[str, float] = {}
    for key, value in read_phases(log).items():
        kind, _, phase = key.partition(".")
        if kind in ("plain", "warm"):
            name = f"tests' {phase}"
        elif kind == "all" or not phase:
            name = phase or kind
        else:
            name = f"{kind}: {phase}"
        found[name] = found.get(name, 0.0) + value
    if "total" in found:
        found["interpreter start and exit (outside the probe)"] = wall - found["total"]
    return found


def run(args: list[str], env: dict[str, str], must_pass: bool = False) -> tuple[float, str]:
    """Run a pytest; its wall time and output. A failed warm run (a warm test that missed, measured or
    wrote) is printed and counted, and the benchmark goes on; a failed building run ends it."""
    ran = pytest_run(args, HERE, env, timeout=900, must_pass=must_pass)
    if ran.returncode != 0:
        FAILED.append(args[0])
    return ran.seconds, ran.output


def lines(log: Path) -> list[dict]:
    found = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    log.unlink(missing_ok=True)
    return found


def measured(counts: dict | None) -> bool:
    """Whether a warm test timed a kernel, compared configs, benchmarked a GEMM choice, ran coordinate
    descent or wrote an autotune result (lists hold the saves and kernels handed to coordinate descent)."""
    counts = counts or {}
    return any(counts.get(k, 0) for k in ("kernel_timings", "triton_configs", "gemm_choices")) \
        or bool(counts.get("saves"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cold-mlp", type=int, default=0, help="warm runs after a build with a cold MLP test")
    parser.add_argument("--steps", action="store_true", help="time the plugin's own steps too (probe/steps.py)")
    parser.add_argument("--against", default="", help="NAME=DIR: the plugin from another checkout, as a third side")
    parser.add_argument("--no-eager", action="store_true", help="leave out the eager floor")
    parser.add_argument("--select", default="", help="-k EXPR for the warm rounds (the builds run every test)")
    args = parser.parse_args()
    select = ["-k", args.select] if args.select else []
    other, _, other_dir = args.against.partition("=")
    print(f"plugin byte-compiled as pip installs it: {as_installed()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-vs-kept-"))
    log = work / "tests.jsonl"
    bundle = work / "models.bundle"
    kept = work / "kept"
    plugin = ["gpu_models", *QUIET, f"--compile-cache-bundle={bundle}"]
    plain = ["gpu_models_plain", *QUIET, "-p", "no:compilecache"]
    kept_env = {"TORCHINDUCTOR_CACHE_DIR": str(kept), "TRITON_CACHE_DIR": str(kept / "triton"),
                "GPU_MODELS_LOG": str(log)}
    built_plugin, built_out = run(plugin, {"GPU_MODELS_LOG": str(log)}, must_pass=True)
    lines(log)
    print(f"built the bundle in {built_plugin:.1f} s", flush=True)
    built_plain = run(plain, kept_env, must_pass=True)[0] if args.repeats else 0.0
    lines(log)
    walls: dict[str, list[float]] = {"plugin": [], "kept": [], "eager": []}
    sides = ["plugin", "kept"]
    if other:
        import compileall

        compileall.compile_dir(os.path.join(other_dir, "pytest_compilecache"), quiet=1)
        sides.append(other)
        walls[other] = []
    phase_log = work / "phases.log"
    probe = {"PYTHONPATH": os.pathsep.join(filter(None, [str(PHASES), os.environ.get("PYTHONPATH", "")])),
             "PHASES_OUT": str(phase_log)}
    phase_sums: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    durations: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    tests: dict[str, dict[str, list[float]]] = {}
    warm_counts: list[dict] = []
    steps_log = work / "steps.jsonl"
    step_times: dict[str, list[float]] = {}
    for round_ in range(args.repeats):
        order = sides if round_ % 2 == 0 else sides[::-1]
        for who in order:
            if who == other:
                found_first = os.pathsep.join([str(Path(other_dir).resolve()), probe["PYTHONPATH"]])
                took, out = run([*plugin, *select, "-p", "phases", "--durations=0"],
                                {"GPU_MODELS_LOG": str(log), **probe, "PYTHONPATH": found_first})
            elif who == "plugin":
                steps = ["-p", "steps"] if args.steps else []
                took, out = run([*plugin, *select, "-p", "phases", *steps, "--durations=0"],
                                {"GPU_MODELS_LOG": str(log), **probe, "STEPS_OUT": str(steps_log)})
                for line in lines(steps_log):
                    for name, value in line["seconds"].items():
                        step_times.setdefault(name, []).append(value)
            else:
                took, out = run([*plain, *select, "-p", "phases", "--durations=0"], {**kept_env, **probe})
            for seconds, phase, test in re.findall(r"^([0-9.]+)s (setup|call|teardown) +\S+::(\S+)$", out, re.M):
                durations[who].setdefault(f"{test.replace('_is_warm', '')} {phase}", []).append(float(seconds))
            walls[who].append(took)
            for phase, seconds in phases(phase_log, took).items():
                phase_sums[who].setdefault(phase, []).append(seconds)
            print(f"round {round_ + 1} {who}: {took:.2f} s", flush=True)
            for item in lines(log):
                print(f"  {item['model']}: {item['seconds']:.3f} s", flush=True)
                tests.setdefault(item["model"], {}).setdefault(who, []).append(item["seconds"])
                if who != "kept" and "benchmarks" in item:
                    warm_counts.append({k: item.get(k) for k in ("model", "benchmarks", "autotune")})
    for _ in range(2 if args.repeats and not args.no_eager else 0):
        took, _ = run(plain, {"TORCHDYNAMO_DISABLE": "1", "GPU_MODELS_LOG": str(log)})
        walls["eager"].append(took)
        for item in lines(log):
            tests.setdefault(item["model"], {}).setdefault("eager", []).append(item["seconds"])

    import torch

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}; {args.repeats} alternating rounds; "
          f"bundle {bundle.stat().st_size / 1e6:.1f} MB; building runs: plugin {built_plugin:.1f} s, "
          f"kept folder {built_plain:.1f} s")
    if not args.repeats:
        tests = {}
    print("\n| | plugin, warm from the bundle | kept folder, plain pytest | median ratio (pairwise) | eager |")
    print("|---|---|---|---|---|")
    for side in [s for s in sides if s != "kept"]:
        if side != "plugin":
            print(f"\n| | plugin @ {side}, warm from the bundle | kept folder, plain pytest | median ratio (pairwise) | eager |")
            print("|---|---|---|---|---|")
        for name, row in tests.items():
            ratios = [a / b for a, b in zip(row.get(side, []), row["kept"])] or [float("nan")]
            print(f"| {name} test body, s | {spread(row.get(side, []))} | {spread(row['kept'])} | "
                  f"{statistics.median(ratios):.2f}x | {spread(row.get('eager', []))} |")
        ratios = [a / b for a, b in zip(walls[side], walls["kept"])] or [float("nan")]
        print(f"| whole run (wall), s | {spread(walls[side])} | {spread(walls['kept'])} | "
              f"{statistics.median(ratios):.2f}x (each pair {min(ratios):.2f}-{max(ratios):.2f}) | {spread(walls['eager'])} |")
    print("\neach run, in order:")
    for who, values in walls.items():
        print(f"  {who}: {' '.join(f'{v:.2f}' for v in values)}")
    print_table("where each warm run's wall time went (medians, seconds; probe/phases.py):", phase_sums)
    print_table("each test's phases as pytest timed them (medians, seconds; 0 where under 5 ms):", durations, "0")
    if step_times:
        print("\nthe plugin's own steps (probe/steps.py), median seconds a run (range):")
        for name, values in sorted(step_times.items(), key=lambda kv: -statistics.median(kv[1])):
            print(f"  {spread(values, 3, width=7)}  {name}")
    benchmarked = [c for c in warm_counts if measured(c["benchmarks"]) or (c["autotune"] or {}).get("saved", 0)]
    print(f"failed runs: {len(FAILED)}; the building run logged "
          f"{built_out.count('Runtime error during autotuning')} autotuning errors")
    print(f"warm tests that benchmarked or saved an autotune result: {len(benchmarked)} of {len(warm_counts)}"
          + "".join(f"\n  {c}" for c in benchmarked))

    if args.cold_mlp:
        bundle.unlink()
        env = {"GPU_MODELS_LOG": str(log), "GPU_MODELS_COLD_MLP": "1"}
        _, out = run(plugin, env, must_pass=True)
        lines(log)
        errors = out.count("Runtime error during autotuning")
        print(f"\nwith a cold max-autotune MLP test before the warm ones: building run logged {errors} autotuning errors")
        for i in range(args.cold_mlp):
            took, out = run(plugin, env)
            for item in lines(log):
                if "benchmarks" not in item:
                    continue
                counts = {k: v for k, v in (item["benchmarks"] or {}).items() if k != "lookups"}
                print(f"  warm run {i + 1}: {item['model']}: {item['seconds']:.2f} s, measured {measured(counts)}, {counts}, "
                      f"autotune {item['autotune']}")


if __name__ == "__main__":
    main()
