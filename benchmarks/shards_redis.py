"""CPU, issue 12: four CI shards sharing torch's Redis remote cache, against the same shards sharing nothing.

A generated suite of 4 shards (2 test files each): every test compiles a model of its shard's own
and one model all shards use. Each shard runs as a fresh runner would: a new, empty local cache
folder, one pytest session (no xdist), one after the other (on CI they are separate machines). Three
CI runs: the first (Redis empty), the second (nothing changed), the third (shard 1's model changed).
"shared": ``--compile-cache-remote`` against one real ``redis-server`` on loopback, started here and
kept for all three runs; "nothing shared": the same sessions without it. Per shard: wall time,
bytes moved to and from Redis (its ``INFO stats`` counters before and after), and hits and misses
of the local FX graph layer and the remote one (from ``--compile-cache-report``).

    python benchmarks/shards_redis.py [REPEATS]
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from probe.runner import pytest_run

SHARD_TEST = '''
import os
import torch

def model(width, extra):
    torch.manual_seed(width)
    layers = [torch.nn.Linear(64, width), torch.nn.GELU(), torch.nn.Linear(width, 64), torch.nn.LayerNorm(64)]
    if extra:
        layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)

def run(width, extra=False):
    with torch.no_grad():
        torch.compile(model(width, extra), dynamic=False)(torch.randn(8, 64))

def test_own_{shard}_{n}():
    run(64 * {shard} + 16 * {n}, extra=os.environ.get("CHANGED") == "{shard}")

def test_common_{shard}_{n}():
    run(48)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_bytes(url: str) -> int:
    import redis

    info = redis.Redis.from_url(url).info("stats")
    return int(info["total_net_input_bytes"]) + int(info["total_net_output_bytes"])


def shard(project: Path, number: int, url: str | None, changed: str, work: Path) -> dict[str, float]:
    local = Path(tempfile.mkdtemp(prefix="shard-local-", dir=work))
    report = local / "report.json"
    args = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", f"--compile-cache-report={report}",
            *[f"test_shard{number}_{n}.py" for n in (1, 2)]]
    if url:
        args.append(f"--compile-cache-remote={url}")
    before = redis_bytes(url) if url else 0
    env = {"TORCHINDUCTOR_CACHE_DIR": str(local / "inductor"), "CHANGED": changed}
    wall = pytest_run(args, project, env, timeout=900,
                      unset=[k for k in os.environ if k.startswith(("PYTEST_", "TORCHINDUCTOR_", "TRITON_"))]).seconds
    totals = json.loads(report.read_text())["totals"]
    remote = totals["remote_fx_graph"]
    shutil.rmtree(local, ignore_errors=True)
    return {"wall": wall, "bytes": (redis_bytes(url) - before) if url else 0,
            "fx_hits": totals["fx_graph"]["hits"], "fx_misses": totals["fx_graph"]["misses"],
            "remote_hits": remote.get("hits", 0), "remote_misses": remote.get("misses", 0)}


def main() -> None:
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    work = Path(tempfile.mkdtemp(prefix="shards-"))
    project = work / "suite"
    project.mkdir()
    for s in range(1, 5):
        for n in (1, 2):
            (project / f"test_shard{s}_{n}.py").write_text(SHARD_TEST.format(shard=s, n=n))
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(work)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    time.sleep(1)
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    runs = (("1st (cold)", ""), ("2nd (no change)", ""), ("3rd (shard 1 changed)", "1"))
    try:
        import redis

        found: dict[tuple[str, str, int], list[dict[str, float]]] = {}
        for rep in range(repeats):
            redis.Redis.from_url(url).flushall()
            for run, changed in runs:
                for mode, target in (("shared", url), ("nothing shared", None)):
                    for s in range(1, 5):
                        r = shard(project, s, target, changed, work)
                        found.setdefault((run, mode, s), []).append(r)
                        print(f"repeat {rep} {run} {mode} shard {s}: {r}", flush=True)
        med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in found.items()}
        print(f"\nmedians over {repeats} repeats")
        print("run | mode | shard | wall s | bytes to/from Redis | fx hits/misses | remote fx hits/misses")
        for (run, mode, s), r in med.items():
            remote = f"{r['bytes']:,.0f} | {r['fx_hits']:.0f}/{r['fx_misses']:.0f} | {r['remote_hits']:.0f}/{r['remote_misses']:.0f}" \
                if mode == "shared" else f"- | {r['fx_hits']:.0f}/{r['fx_misses']:.0f} | -"
            print(f"{run} | {mode} | {s} | {r['wall']:.1f} | {remote}")
        print("\nper run, summed over the 4 shards (medians of wall s):")
        for run, _ in runs:
            shared = sum(med[(run, "shared", s)]["wall"] for s in range(1, 5))
            alone = sum(med[(run, "nothing shared", s)]["wall"] for s in range(1, 5))
            moved = sum(med[(run, "shared", s)]["bytes"] for s in range(1, 5))
            print(f"{run}: shared {shared:.1f} s, nothing shared {alone:.1f} s, ratio {shared / alone:.2f}, "
                  f"{moved / 1e6:.2f} MB moved")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
