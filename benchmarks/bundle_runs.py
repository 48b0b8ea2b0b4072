"""Cold run (builds the bundle) against warm run (loads it), plain and with -n 2, on a suite of models.

Writes a small suite (MLP, transformer block in inference and training, a convolution net) whose
conftest compiles every model in ``pytest_compilecache_warmup``, then for each mode runs pytest
twice on a new bundle path: first cold, then warm. Prints wall time and per-layer totals of each
run, the warmup count, ``warm_cache`` setup times, and for one model the compile time of a warm
test (folder filled from the bundle) against the same compile from a warm local folder, measured
side by side inside one test.

    python benchmarks/bundle_runs.py [REPEATS]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from probe.runner import pytest_run

CONFTEST = '''
import os, time, torch
import pytest

class Block(torch.nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(d, 4, batch_first=True)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        self.n1, self.n2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
    def forward(self, x):
        x = x + self.attn(self.n1(x), self.n1(x), self.n1(x), need_weights=False)[0]
        return x + self.ff(self.n2(x))

def mlp():
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(128, 128), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)

def convnet():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3), torch.nn.Flatten())

def block():
    torch.manual_seed(0)
    return Block()

def run_all():
    with torch.no_grad():
        torch.compile(mlp())(torch.randn(32, 128))
        torch.compile(convnet())(torch.randn(2, 3, 16, 16))
        torch.compile(block().eval())(torch.randn(2, 8, 64))
    torch.compile(block())(torch.randn(2, 8, 64)).sum().backward()

def pytest_compilecache_warmup(cache):
    with open(os.environ["WARMUP_LOG"], "a") as f:
        f.write("warmup\\n")
    run_all()

@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        if fixturedef.argname == "warm_cache":
            with open(os.environ["SETUP_LOG"], "a") as f:
                f.write(f"{time.perf_counter() - start}\\n")
'''

TESTS = '''
import time, torch
from conftest import mlp, convnet, block, run_all

def test_models_plain():
    run_all()

def test_models_warm(warm_cache):
    run_all()

def test_warm_bundle_vs_warm_local(warm_cache):
    model = block().eval()
    with torch.no_grad():
        start = time.perf_counter(); torch.compile(model)(torch.randn(2, 8, 64)); from_bundle = time.perf_counter() - start
        warm_cache.reset_in_memory()
        start = time.perf_counter(); torch.compile(model)(torch.randn(2, 8, 64)); local = time.perf_counter() - start
    print(f"\\nBUNDLE_VS_LOCAL {from_bundle:.3f} {local:.3f}")
'''


def run(cwd: Path, args: list[str], env: dict[str, str]) -> tuple[float, dict, str]:
    report = cwd / "report.json"
    ran = pytest_run(["-q", "-s", "-p", "no:logging", "-W", "ignore::DeprecationWarning",
                      f"--compile-cache-report={report}", *args], cwd, env)
    return ran.seconds, json.loads(report.read_text()), ran.output


def totals(report: dict) -> str:
    t = report["totals"]
    return ", ".join(f"{k} {t[k]['hits']}h/{t[k]['misses']}m" for k in ("fx_graph", "aot_autograd"))


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        (cwd / "conftest.py").write_text(CONFTEST)
        (cwd / "test_models.py").write_text(TESTS)
        rows: dict[str, list[float]] = {}
        for i in range(repeats):
            for mode in (["-p", "no:xdist"], ["-n", "2"]):
                name = "plain" if mode[0] == "-p" else "-n 2"
                env = {"WARMUP_LOG": str(cwd / f"w{i}{name}"), "SETUP_LOG": str(cwd / "setup.log")}
                bundle = cwd / f"b{i}{name}.bundle"
                cold, rep_cold, _ = run(cwd, [*mode, f"--compile-cache-bundle={bundle}"], env)
                warm, rep_warm, out = run(cwd, [*mode, f"--compile-cache-bundle={bundle}"], env)
                warmups = len(Path(env["WARMUP_LOG"]).read_text().split())
                rows.setdefault(f"{name} cold", []).append(cold)
                rows.setdefault(f"{name} warm", []).append(warm)
                rows.setdefault(f"{name} ratio", []).append(cold / warm)
                for line in out.splitlines():
                    if line.startswith("BUNDLE_VS_LOCAL"):
                        b, loc = map(float, line.split()[1:])
                        rows.setdefault("warm test from bundle (s)", []).append(b)
                        rows.setdefault("same compile, warm local dir (s)", []).append(loc)
                        rows.setdefault("bundle/local ratio", []).append(b / loc)
                print(f"run {i} {name}: cold {cold:.1f} s [{totals(rep_cold)}], warm {warm:.1f} s "
                      f"[{totals(rep_warm)}], warmups {warmups}, bundle {bundle.stat().st_size / 1e6:.2f} MB")
        setups = [float(x) for x in (cwd / "setup.log").read_text().split()]
        print()
        for key, values in rows.items():
            print(f"median {key}: {statistics.median(values):.2f}  (runs: {', '.join(f'{v:.2f}' for v in values)})")
        print(f"warm_cache setup: median {statistics.median(setups) * 1e3:.1f} ms over {len(setups)} tests "
              f"(max {max(setups) * 1e3:.0f} ms, includes the once-per-process bundle load)")


if __name__ == "__main__":
    main()
