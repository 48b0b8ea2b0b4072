"""GPU, real models (timm resnet18, a 2-layer BERT, a max-autotune MLP): warm from a bundle vs a warm local folder.

One run of this script, on a GPU machine with timm and transformers installed:

1. The suite in ``gpu_models/`` builds the bundle (cold run: the warmup compiles the models).
2. The same suite, REPEATS times, each a new pytest process loading the bundle from disk: each
   ``warm_cache`` test's compile-and-first-call seconds and its autotune, FX and Triton counts.
3. The baseline, REPEATS times, each run right after a warm run of step 2: a new plain process (no plugin) on a kept ``TORCHINDUCTOR_CACHE_DIR``
   filled beforehand by compiling the same models; after the same throwaway compile, each model's
   compile-and-first-call seconds, with in-memory state reset before each (``reset_in_memory()``,
   what ``warm_cache`` does before a test), so no model reuses kernels another one loaded.
4. torch's own ``save_cache_artifacts`` / ``load_cache_artifacts`` across two processes (resnet18),
   for autotune hits and misses without the plugin.

    python3 benchmarks/gpu_models.py [REPEATS]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from probe.runner import pytest_run

HERE = Path(__file__).parent
SUITE = HERE / "gpu_models"

BASELINE = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
import models
if sys.argv[2] == "fill":
    for name in models.MODELS:
        models.compile_and_run(name)
else:
    from pytest_compilecache._torchapi import reset_in_memory
    models.warm_up_process()
    times = {}
    for name in models.MODELS:
        reset_in_memory()
        times[name] = models.compile_and_run(name)
    print(json.dumps(times))
'''

TORCH_API = r'''
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import models
from torch._inductor.remote_cache import cache_stats
if sys.argv[2] == "save":
    models.compile_and_run("resnet18")
    data, _ = torch.compiler.save_cache_artifacts()
    open(sys.argv[3], "wb").write(data)
else:
    torch.compiler.load_cache_artifacts(open(sys.argv[3], "rb").read())
    models.compile_and_run("resnet18")
    stats = {k: {"hit": v.hit, "miss": v.miss} for k, v in cache_stats._stats.items() if "Autotune" in k}
    print(json.dumps(stats))
'''


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, env={**os.environ, **env}, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
        raise SystemExit(f"failed: {' '.join(args)}")
    return done


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    work = Path(tempfile.mkdtemp(prefix="gpu-models-"))
    bundle = work / "models.bundle"
    pytest_args = [str(SUITE), "-q", "-p", "no:cacheprovider", "-p", "no:randomly", f"--compile-cache-bundle={bundle}",
                   "-W", "ignore::DeprecationWarning", "-W", "ignore::UserWarning"]
    rows: dict[str, dict[str, list[float]]] = {}
    kept = work / "kept-dir"
    run([sys.executable, "-c", BASELINE, str(SUITE), "fill"], {"TORCHINDUCTOR_CACHE_DIR": str(kept)})
    misses: dict[str, list[int]] = {}
    loads: list[float] = []
    for phase in ["built"] + [f"warm{i}" for i in range(repeats)]:
        log = work / f"{phase}.jsonl"
        report = work / f"{phase}.json"
        done = pytest_run([*pytest_args, f"--compile-cache-report={report}"], Path.cwd(), {"GPU_MODELS_LOG": str(log)},
                          timeout=900)
        if phase == "built":
            print("\n".join(line for line in done.output.splitlines() if "compile time" in line or "saved" in line))
        for line in log.read_text().splitlines():
            item = json.loads(line)
            rows.setdefault(item["model"], {}).setdefault("built" if phase == "built" else "warm", []).append(item["seconds"])
            if phase != "built":
                misses.setdefault(item["model"], []).append(item["autotune"].get("misses", -1))
        if phase != "built":
            processes = json.loads(report.read_text())["bundle"]["processes"]
            loads.extend(p["load_seconds"] for p in processes if p.get("status") == "loaded")
            out = run([sys.executable, "-c", BASELINE, str(SUITE), "warm"], {"TORCHINDUCTOR_CACHE_DIR": str(kept)})
            for name, seconds in json.loads(out.stdout.strip().splitlines()[-1]).items():
                rows[name].setdefault("local", []).append(seconds)
    blob = work / "torch-api.bin"
    run([sys.executable, "-c", TORCH_API, str(SUITE), "save", str(blob)], {"TORCHINDUCTOR_CACHE_DIR": str(work / "api1")})
    api = run([sys.executable, "-c", TORCH_API, str(SUITE), "load", str(blob)], {"TORCHINDUCTOR_CACHE_DIR": str(work / "api2")})

    import torch

    print(f"\ntorch {torch.__version__}, {torch.cuda.get_device_name(0)}; medians of {repeats} runs; seconds of "
          "compile plus first call, after a throwaway compile in the same process")
    print(f"bundle: {bundle.stat().st_size / 1e6:.1f} MB, loaded in {statistics.median(loads):.2f} s (median)")
    print(f"{'model':18} {'built run':>10} {'warm bundle':>12} {'warm local':>11} {'ratio':>6}  autotune misses")
    for name, row in rows.items():
        warm, local = statistics.median(row["warm"]), statistics.median(row["local"])
        print(f"{name:18} {statistics.median(row['built']):10.2f} {warm:12.2f} {local:11.2f} {warm / local:6.2f}  "
              f"{misses[name]}")
    print("each run, in order (warm bundle and warm local runs alternate):")
    for name, row in rows.items():
        print(f"  {name:18} warm bundle {' '.join(f'{x:.2f}' for x in row['warm'])}; "
              f"warm local {' '.join(f'{x:.2f}' for x in row['local'])}")
    print(f"torch's own API across two processes (resnet18), autotune: {api.stdout.strip().splitlines()[-1]}")


if __name__ == "__main__":
    main()
