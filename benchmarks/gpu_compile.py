"""GPU compile times: cold, warm from a local folder, and warm from a bundle, in default and max-autotune.

For each model (a 6-layer MLP and a transformer block) and mode, one fresh process: a throwaway
compile first (CUDA and Triton start-up), then the model compiled in a new empty folder (cold); the
same compile again after ``reset_in_memory()`` (warm local folder); then a new folder filled from
the bundle saved by the cold compile (bundle load time), and the compile there (warm from bundle,
as ``warm_cache`` runs it). All figures of a row come from that one process, side by side.

    python3 benchmarks/gpu_compile.py [REPEATS]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r'''
import json, sys, time, tempfile
from pathlib import Path
from pytest_compilecache import _torchapi
from pytest_compilecache.cache import CompileCache

model_name, mode = sys.argv[1], sys.argv[2]
root = Path(tempfile.mkdtemp())
_torchapi.bootstrap(str(root / "process"))
import torch

def mlp():
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)

class Block(torch.nn.Module):
    def __init__(self, d=512, h=8):
        super().__init__()
        self.n1, self.n2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, h, batch_first=True)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
    def forward(self, x):
        y = self.n1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.ff(self.n2(x))

torch.manual_seed(0)
model = (mlp() if model_name == "mlp6" else Block()).cuda()
inp = torch.randn(64, 1024, device="cuda") if model_name == "mlp6" else torch.randn(8, 128, 512, device="cuda")
kwargs = {} if mode == "default" else {"mode": mode}

def compile_once():
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        torch.compile(model, **kwargs)(inp)
    torch.cuda.synchronize()
    return time.perf_counter() - start

def headers():
    return root / "headers"

with CompileCache(root / "throwaway", root / "process", headers()):
    torch.compile(lambda x: x * 2)(torch.randn(8, device="cuda"))

out = {"model": model_name, "mode": mode}
with _torchapi.fresh_recording():
    with CompileCache(root / "cold", root / "process", headers()) as cache:
        out["cold_s"] = compile_once()
        out["cold_stats"] = {k: v for k, v in cache.stats.to_dict().items() if k in ("fx_graph", "autotune", "triton")}
        cache.reset_in_memory()
        cache.restart_counting()
        out["warm_local_s"] = compile_once()
    data = _torchapi.save_artifacts().data
assert data is not None, "the compiles recorded nothing"
out["bundle_bytes"] = len(data)
start = time.perf_counter()
_torchapi.load_artifacts(data, str(root / "from-bundle"))
out["load_s"] = time.perf_counter() - start
with CompileCache(root / "from-bundle", root / "process", headers()) as cache:
    out["warm_bundle_s"] = compile_once()
    out["warm_bundle_stats"] = {k: v for k, v in cache.stats.to_dict().items() if k in ("fx_graph", "autotune", "triton")}
print("RESULT " + json.dumps(out))
'''


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        child = Path(tmp) / "child.py"
        child.write_text(CHILD)
        for model in ("mlp6", "block"):
            for mode in ("default", "max-autotune-no-cudagraphs"):
                for _ in range(repeats):
                    proc = subprocess.run([sys.executable, str(child), model, mode], capture_output=True, text=True)
                    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
                    if line is None:
                        print(proc.stdout[-3000:], proc.stderr[-3000:])
                        raise SystemExit(f"{model} {mode} failed")
                    results.append(json.loads(line[7:]))
                    print(line, flush=True)
    print()
    print("| model | mode | cold s | warm local s | warm from bundle s | cold/local | cold/bundle | bundle/local | bundle MB | load s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(r["model"], r["mode"]) for r in results}, key=lambda k: (k[0] != "mlp6", k[1] != "default"))
    for model, mode in keys:
        rows = [r for r in results if (r["model"], r["mode"]) == (model, mode)]
        med = {k: statistics.median(r[k] for r in rows) for k in ("cold_s", "warm_local_s", "warm_bundle_s", "load_s", "bundle_bytes")}
        print(f"| {model} | {mode} | {med['cold_s']:.2f} | {med['warm_local_s']:.2f} | {med['warm_bundle_s']:.2f} | "
              f"{med['cold_s'] / med['warm_local_s']:.1f}x | {med['cold_s'] / med['warm_bundle_s']:.1f}x | "
              f"{med['warm_bundle_s'] / med['warm_local_s']:.2f} | {med['bundle_bytes'] / 1e6:.1f} | {med['load_s']:.2f} |")


if __name__ == "__main__":
    main()
