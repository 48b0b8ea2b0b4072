"""CPU, issue 12: four CI shards sharing one bundle on S3, against the same shards sharing nothing.

The suite and shards of ``shards_redis.py``. The S3 server is moto's server mode on loopback,
reached by s3fs over TCP; every shard runs ``--compile-cache-bundle=s3://.../suite.bundle
--compile-cache-update`` (as a CI job would on every run) as one pytest session (no xdist), one
after the other. Three CI runs: the first (no bundle yet), the second (nothing changed), the third
(shard 1's model changed). Modes:

- "S3, fresh runner": each session has a new, empty ``compile_cache_home``, so no local copy of
  the bundle (a CI runner that keeps nothing);
- "S3, kept copy": each shard keeps its ``compile_cache_home`` from run to run (a runner that
  caches ``~/.cache/pytest-compilecache/bundle-copies``, e.g. with actions/cache);
- "S3, kept home": the same, and the precompiled C++ headers kept too (a runner that caches all
  of ``~/.cache/pytest-compilecache``);
- "nothing shared": the same sessions without a bundle (a fresh runner);
- "torch folder kept": without a bundle, each shard keeps torch's own cache folder and temporary
  folder from run to run (a runner that caches ``/tmp/torchinductor_<user>`` with actions/cache).

Every session gets a new temporary folder (torch's precompiled C++ headers go there when the plugin
does not place them), and except in the two "kept" modes a new ``compile_cache_headers_dir``, so
"S3, fresh runner" and "nothing shared" differ only in the bundle.

Per shard: wall time, bytes moved (downloaded at load, downloaded and uploaded at save, from
``--compile-cache-report``), FX graph hits and misses. Then, once: the four shards of a cold run
started at the same moment, and whether the bundle ends up holding every shard's artifacts.

    python benchmarks/shards_s3.py [REPEATS]
    python benchmarks/shards_s3.py --at-once     # only the four cold shards started together
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from probe.runner import pytest_run  # noqa: E402
from shards_redis import SHARD_TEST, free_port  # noqa: E402

ENDPOINT_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")


def shard_args(number: int, url: str | None, home: Path, report: Path, keep_headers: bool = False) -> list[str]:
    headers = home / "precompiled-headers" if keep_headers else Path(tempfile.mkdtemp(prefix="headers-",
                                                                                         dir=report.parent))
    args = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", f"--compile-cache-report={report}",
            "-o", f"compile_cache_home={home}", "-o", f"compile_cache_headers_dir={headers}",
            *[f"test_shard{number}_{n}.py" for n in (1, 2)]]
    if url:
        args += [f"--compile-cache-bundle={url}", "--compile-cache-update"]
    return args


def environment(endpoint: str, work: Path, changed: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TORCHINDUCTOR_", "TRITON_"))}
    env.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
               AWS_ENDPOINT_URL=endpoint, TMPDIR=str(work), CHANGED=changed)
    return env


def shard(project: Path, number: int, url: str | None, home: Path, env: dict[str, str],
          keep_headers: bool = False, kept_torch: Path | None = None) -> dict[str, float]:
    """One shard's session. Its temporary folder (where torch keeps its precompiled C++ headers when
    the plugin does not) is new, or ``kept_torch``, which also holds its kept torch cache folder."""
    local = Path(tempfile.mkdtemp(prefix="shard-local-", dir=env["TMPDIR"]))
    report = local / "report.json"
    tmp = kept_torch / "tmp" if kept_torch is not None else local / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    inductor = kept_torch / "inductor" if kept_torch is not None else local / "inductor"
    env = {**env, "TORCHINDUCTOR_CACHE_DIR": str(inductor), "TMPDIR": str(tmp)}
    wall = pytest_run(shard_args(number, url, home, report, keep_headers), project, env, timeout=900,
                      unset=[name for name in os.environ if name not in env]).seconds
    data = json.loads(report.read_text())
    totals, bundle = data["totals"], data.get("bundle", {})
    down = sum(p.get("downloaded_bytes") or 0 for p in bundle.get("processes", []))
    transfer = bundle.get("saved", {}).get("transfer", {})
    shutil.rmtree(local, ignore_errors=True)
    return {"wall": wall, "down": down + transfer.get("downloaded", 0), "up": transfer.get("uploaded", 0),
            "fx_hits": totals["fx_graph"]["hits"], "fx_misses": totals["fx_graph"]["misses"]}


def make_bucket(endpoint: str) -> str:
    import s3fs

    name = f"bench-{uuid.uuid4().hex[:10]}"
    s3fs.S3FileSystem(key="bench", secret="bench", endpoint_url=endpoint,
                      skip_instance_cache=True).call_s3("create_bucket", Bucket=name)
    return f"s3://{name}/ci/suite.bundle"


def at_once(project: Path, endpoint: str, work: Path) -> str:
    """Four cold shards started together: does the bundle end up with every shard's models?"""
    url = make_bucket(endpoint)
    env = environment(endpoint, work, "")
    procs, reports = [], []
    for s in range(1, 5):
        home = Path(tempfile.mkdtemp(prefix="home-", dir=work))
        report = home / "r.json"
        reports.append(report)
        procs.append(subprocess.Popen([sys.executable, "-m", "pytest", *shard_args(s, url, home, report)], cwd=project,
                                      env={**env, "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor")},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    start = time.perf_counter()
    walls = []
    for p in procs:
        p.communicate(timeout=900)
        walls.append(time.perf_counter() - start)
    conflicts = sum(json.loads(r.read_text())["bundle"]["saved"].get("transfer", {}).get("conflicts", 0)
                    for r in reports)
    statuses = [json.loads(r.read_text())["bundle"]["saved"]["status"] for r in reports]
    from pytest_compilecache.storage.objects import UrlStore

    os.environ.update({k: env[k] for k in ENDPOINT_ENV})
    store = UrlStore(url, work / "check", 60)
    with store.locked():
        _, whole = store.read_whole()
    assert whole is not None
    inductor = whole.entries[0].artifacts["inductor"]["count"]
    from pytest_compilecache import _torchapi

    keys = {key for kind, key, _ in _torchapi.artifact_identities(whole.payload(whole.entries[0])) if kind == "inductor"}
    moved = [json.loads(r.read_text())["bundle"]["saved"].get("transfer", {}) for r in reports]
    return (f"4 cold shards at once (all 4 done after {max(walls):.1f} s on 2 cores; "
            f"{sum(m.get('downloaded', 0) for m in moved) / 1e6:.2f} MB down, "
            f"{sum(m.get('uploaded', 0) for m in moved) / 1e6:.2f} MB up at save): "
            f"saves {statuses}, {conflicts} conditional write(s) retried after a conflict, "
            f"bundle holds {inductor} FX graph artifacts under {len(keys)} keys (9 graphs: every shard's own 2 models "
            f"and the common one; a graph compiled by several shards at once is kept once per distinct content), "
            f"{len(store.list_deltas())} delta(s) left")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="shards-s3-"))
    project = work / "suite"
    project.mkdir()
    for s in range(1, 5):
        for n in (1, 2):
            (project / f"test_shard{s}_{n}.py").write_text(SHARD_TEST.format(shard=s, n=n))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    time.sleep(3)
    if sys.argv[1:] == ["--at-once"]:
        try:
            print(at_once(project, endpoint, work))
        finally:
            server.terminate()
            server.wait(timeout=20)
            shutil.rmtree(work, ignore_errors=True)
        return
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    runs = (("1st (no bundle)", ""), ("2nd (no change)", ""), ("3rd (shard 1 changed)", "1"))
    modes = ("S3, fresh runner", "S3, kept copy", "S3, kept home", "nothing shared", "torch folder kept")
    try:
        found: dict[tuple[str, str, int], list[dict[str, float]]] = {}
        for rep in range(repeats):
            urls = {"S3, fresh runner": make_bucket(endpoint), "S3, kept copy": make_bucket(endpoint),
                    "S3, kept home": make_bucket(endpoint), "nothing shared": None, "torch folder kept": None}
            kept = {(m, s): Path(tempfile.mkdtemp(prefix="kept-", dir=work)) for m in modes for s in range(1, 5)}
            for run, changed in runs:
                env = environment(endpoint, work, changed)
                for mode in modes:
                    for s in range(1, 5):
                        home = kept[(mode, s)] if "kept" in mode else Path(tempfile.mkdtemp(prefix="home-", dir=work))
                        r = shard(project, s, urls[mode], home, env, keep_headers=mode == "S3, kept home",
                                  kept_torch=kept[(mode, s)] if mode == "torch folder kept" else None)
                        found.setdefault((run, mode, s), []).append(r)
                        print(f"repeat {rep} {run} {mode} shard {s}: {r}", flush=True)
        med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in found.items()}
        print(f"\nmedians over {repeats} repeats")
        print("run | mode | shard | wall s | MB down | MB up | fx hits/misses")
        for (run, mode, s), r in med.items():
            print(f"{run} | {mode} | {s} | {r['wall']:.1f} | {r['down'] / 1e6:.2f} | {r['up'] / 1e6:.2f} | "
                  f"{r['fx_hits']:.0f}/{r['fx_misses']:.0f}")
        print("\nper run, summed over the 4 shards (medians of wall s):")
        for run, _ in runs:
            alone = sum(med[(run, "nothing shared", s)]["wall"] for s in range(1, 5))
            line = [f"{run}: nothing shared {alone:.1f} s"]
            for mode in modes[:3] + modes[4:]:
                total = sum(med[(run, mode, s)]["wall"] for s in range(1, 5))
                down = sum(med[(run, mode, s)]["down"] for s in range(1, 5))
                up = sum(med[(run, mode, s)]["up"] for s in range(1, 5))
                line.append(f"{mode} {total:.1f} s (ratio {total / alone:.2f}; {down / 1e6:.2f} MB down, "
                            f"{up / 1e6:.2f} MB up)")
            print("; ".join(line))
        print("\n" + at_once(project, endpoint, work))
    finally:
        server.terminate()
        server.wait(timeout=20)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
