"""Full fault variants of issue 10 (the fast ones are tests/test_faults.py), with real sessions and torch.compile.

- crash: two concurrent sessions with ``-n 4`` and ``--compile-cache-update`` on an existing PATH
  (and, in another round, on a missing one); the worker running the warmup under the bundle's lock is
  killed with SIGKILL. Checks: it held the lock; PATH was byte-identical to the last good bundle at
  the kill; the lock was taken again at once; both sessions finish far below the lock timeout;
  PATH verifies and holds the union; the killed session names the dead worker.
- concurrency: 8 sessions with ``--compile-cache-update`` (each compiling a graph of its own), a
  9th writing a bundle that ``merge`` then adds to PATH, ``prune`` dropping a foreign entry, and a
  reader looping over ``verify`` and ``inspect --json`` throughout. Checks: the union (FX
  graph count and artifact identities), every read exit 0, this machine's entry never shrank.
- disk: the disk-full, file-size-limit, read-only-mount and no-permission cases of the test suite.

    python scripts/stress_bundle.py [--repeats N] [--workers 4] [--sessions 8]

Prints what it checked with timings; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_faults import (  # noqa: E402
    CHAIN_TEST, LOCK_TIMEOUT, READER, WARMUP_CONFTEST, WARMUP_TESTS, clean_env, identities, inductor_counts,
    leftovers, make_project, parent_of, pytest_args, run_cli, wait_for_pid,
)

from pytest_compilecache import files  # noqa: E402
from pytest_compilecache.storage.local import lock_file  # noqa: E402
from pytest_compilecache.bundle.format import Bundle, make_entry, read_manifest  # noqa: E402
from pytest_compilecache.bundle.writing import write_bundle  # noqa: E402

violations: list[str] = []


def check(ok: bool, what: str, detail: str = "") -> None:
    print(f"  [{'ok' if ok else 'VIOLATION'}] {what}" + (f": {detail}" if detail and not ok else ""), flush=True)
    if not ok:
        violations.append(f"{what}: {detail}")


def session(project: Path, tmp: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    """A session in ``project`` with a plugin home of its round's own (never the user's cache folder)."""
    home = ("-o", f"compile_cache_home={project.parent / 'plugin-home'}")
    return subprocess.Popen(pytest_args(*home, *args), cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=clean_env(tmp, **env))


def crash_round(work: Path, headers: Path, workers: int, existing: bool) -> None:
    kind = "existing PATH, --compile-cache-update" if existing else "missing PATH"
    print(f"crash: 2 sessions x -n {workers}, {kind}", flush=True)
    project = make_project(work / "project", headers, conftest=WARMUP_CONFTEST, test_x=WARMUP_TESTS)
    bundle = work / "cache" / "x.bundle"
    log, hold, own = work / "warmups.log", work / "holder.pid", work / "own.log"
    extra: tuple[str, ...] = ()
    old: bytes | None = None
    env = {"WARMUP_LOG": str(log), "WARMUP_HOLD": str(hold), "OWN_LOG": str(own)}
    if existing:
        t = time.monotonic()
        first = session(project, work / "tmp-old", f"--compile-cache-bundle={bundle}",
                        **{**env, "CHAIN": "7", "WARMUP_HOLD": ""})
        out = first.communicate(timeout=600)[0]
        check(first.returncode == 0, "the setup session built the last good bundle", out[-2000:])
        print(f"  setup session: {time.monotonic() - t:.1f} s", flush=True)
        old = bundle.read_bytes()
        log.unlink()
        extra = ("--compile-cache-update",)
    start = time.monotonic()
    procs = [session(project, work / f"tmp{i}", "-n", str(workers), f"--compile-cache-bundle={bundle}",
                     f"--compile-cache-lock-timeout={LOCK_TIMEOUT}", *extra, **env, CHAIN=str(i + 1))
             for i in range(2)]
    try:
        pid = wait_for_pid(hold, procs, limit=600)
        announced = time.monotonic()
        holders = files.lock_holders(lock_file(bundle))
        check(any(h.split()[:2] == ["pid", str(pid)] for h in holders), f"pid {pid} holds {lock_file(bundle).name}",
              str(holders))
        on_disk = bundle.read_bytes() if bundle.exists() else None
        check(on_disk == old, "PATH at the kill is the last good bundle, byte for byte"
              if existing else "PATH at the kill does not exist yet (nothing published)")
        killed = next(i for i, p in enumerate(procs) if p.pid == parent_of(pid))
        time.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
        killed_at, killed_mono = time.time(), time.monotonic()
        ends: dict[int, float] = {}
        while len(ends) < 2:
            for i, p in enumerate(procs):
                if i not in ends and p.poll() is not None:
                    ends[i] = time.monotonic()
            time.sleep(0.05)
        outputs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    total = time.monotonic() - start
    starts = [line.split() for line in log.read_text().splitlines() if line.startswith("start")]
    done = [line.split() for line in log.read_text().splitlines() if line.startswith("done")]
    later = [float(s[2]) - killed_at for s in starts if int(s[1]) != pid]
    expected_starts = 3 if existing else 2
    print(f"  holder pid {pid} announced at {announced - start:.1f} s, killed at {killed_mono - start:.1f} s; "
          f"warmup restarted {min(later, default=float('nan')):.2f} s after the kill; sessions ended "
          f"{ends[killed] - killed_mono:.1f} s (killed one) and {ends[1 - killed] - killed_mono:.1f} s after the kill; "
          f"total {total:.1f} s (lock timeout {LOCK_TIMEOUT} s)", flush=True)
    check(total < LOCK_TIMEOUT / 4, "nobody waited for the lock timeout", f"{total:.0f} s")
    check(bool(later) and min(later) < 30, "the lock was taken again within 30 s of the kill", str(later))
    check(len(starts) == expected_starts and len(done) == expected_starts - 1,
          f"{expected_starts - 1} warmup(s) ran to their end after the kill, none twice in a session",
          f"starts {len(starts)}, done {len(done)}")
    survivor, victim = outputs[1 - killed], outputs[killed]
    check(procs[1 - killed].returncode == 0 and "3 passed" in survivor, "the other session passed",
          survivor[-3000:])
    check("INTERNALERROR" not in victim and "Traceback" not in victim, "the killed session shows no traceback",
          victim[-3000:])
    check(f"(pid {pid}) died while running the warmup hook" in victim and str(lock_file(bundle)) in victim,
          "the killed session's summary names the dead worker and the lock", victim[-3000:])
    lines = [line for line in victim.splitlines() if "crashed while running" in line or "died while" in line
             or line.startswith(("FAILED", "PROBLEM")) or " passed" in line]
    for line in lines:
        print(f"    | {line[:230]}")
    verify = run_cli("verify", str(bundle))
    check(verify.returncode == 0, "PATH verifies after both sessions", verify.stderr.strip())
    counts = inductor_counts(bundle)
    chains = set(own.read_text().split()) | ({"7"} if existing else set())
    check(counts == {"": 1 + len(chains)}, f"PATH holds the warmup's graph and the {len(chains)} test graph(s) that ran",
          str(counts))
    check(not leftovers(bundle.parent, bundle), "no temporary file beside PATH")
    check(sorted(p.name for p in bundle.parent.glob(f"*{bundle.name}*")) == [f".{bundle.name}.lock", bundle.name], "nothing beside PATH but its hidden lock file")


def concurrency_round(work: Path, headers: Path, sessions: int) -> None:
    print(f"concurrency: {sessions} sessions + a 9th for merge + merge + prune + a reader on one PATH", flush=True)
    project = make_project(work / "project", headers, test_chain=CHAIN_TEST)
    base, bundle, extra = work / "base.bundle", work / "x.bundle", work / "extra.bundle"
    t = time.monotonic()
    first = session(project, work / "tmp-base", f"--compile-cache-bundle={base}", CHAIN="0")
    out = first.communicate(timeout=600)[0]
    check(first.returncode == 0, "the setup session built the first bundle", out[-2000:])
    print(f"  setup session: {time.monotonic() - t:.1f} s", flush=True)
    with read_manifest(base) as b:
        b.read_all()
        here = b.entries[0]
        foreign = make_entry({**here.env, "cache_key_tag": "another machine"}, b.payload(here), here.artifacts)
    write_bundle(Bundle(bundle, [here, foreign]))
    stop, reads_log = work / "stop", work / "reads.json"
    start = time.monotonic()
    reader = subprocess.Popen([sys.executable, "-c", READER, str(bundle), str(stop), str(reads_log)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    runs = [session(project, work / "tmp-extra", f"--compile-cache-bundle={extra}", CHAIN=str(sessions + 1))]
    runs += [session(project, work / f"tmp{n}", f"--compile-cache-bundle={bundle}", "--compile-cache-update",
                     CHAIN=str(n)) for n in range(1, sessions + 1)]
    outputs = [runs[0].communicate(timeout=600)[0]]
    t = time.monotonic()
    merge = run_cli("merge", str(bundle), str(extra), "-o", str(bundle))
    t_merge = time.monotonic() - t
    t = time.monotonic()
    prune = run_cli("prune", str(bundle), "--drop", "cache_key_tag=another machine")
    t_prune = time.monotonic() - t
    ends = []
    for p in runs[1:]:
        outputs.append(p.communicate(timeout=600)[0])
        ends.append(time.monotonic() - start)
    stop.touch()
    reader_out = reader.communicate(timeout=300)[0]
    total = time.monotonic() - start
    print(f"  merge took {t_merge:.1f} s, prune {t_prune:.1f} s; sessions ended at "
          f"{', '.join(f'{e:.0f}' for e in ends)} s; total {total:.1f} s", flush=True)
    check(reader.returncode == 0, "the reader ran to its end", reader_out[-2000:])
    check(merge.returncode == 0, "merge into PATH succeeded", merge.stderr.strip())
    check(prune.returncode == 0 and "kept 1 of 2" in prune.stdout, "prune dropped the foreign entry",
          prune.stdout + prune.stderr)
    failed = [i for i, p in enumerate(runs) if p.returncode != 0 or not ("bundle saved:" in outputs[i] or "bundle updated:" in outputs[i])]
    check(not failed, f"all {len(runs)} sessions passed and saved", "\n".join(outputs[i][-2000:] for i in failed))
    counts = inductor_counts(bundle)
    check(counts == {"": sessions + 2}, f"PATH holds {sessions + 2} FX graphs: the first, the merged one, "
          f"one per session", str(counts))
    first_ids, merged_ids, final = identities(base, extra, bundle)
    check(first_ids | merged_ids < final, "the union holds every artifact identity of the first and merged "
          f"bundles ({len(first_ids | merged_ids)}) and more ({len(final)} in all)")
    print(f"  final union: {counts[''] if '' in counts else '?'} FX graphs, {len(final)} artifact identities "
          f"({', '.join(f'{k} {v}' for k, v in sorted(_by_type(final).items()))})", flush=True)
    reads = json.loads(reads_log.read_text())
    outcomes: dict[str, int] = {}
    for r in reads:
        key = f"{r['cmd']} exit {r['rc']}" + (f" ({r['err'][:80]})" if r["rc"] != 0 else "")
        outcomes[key] = outcomes.get(key, 0) + 1
    print(f"  reader: {len(reads)} reads: {', '.join(f'{v} x {k}' for k, v in sorted(outcomes.items()))}",
          flush=True)
    words = ("checksum", "truncated", "corrupt")
    check(all(r["rc"] == 0 for r in reads), "every verify and inspect read exit 0",
          str([r for r in reads if r["rc"] != 0][:3]))
    check(not any(w in r["err"] for r in reads for w in words), "no read saw a checksum failure, truncation or "
          "corruption")
    seen = [r["inductor"][0] for r in reads if r["inductor"]]
    check(seen == sorted(seen), "this machine's entry never shrank between reads",
          str(sorted(set(seen))))
    print(f"  FX graph counts seen by the reader: {sorted(set(seen))}", flush=True)
    check(not leftovers(work, bundle), "no temporary file beside PATH")
    check(sorted(p.name for p in bundle.parent.glob(f"*{bundle.name}*")) == [f".{bundle.name}.lock", bundle.name], "nothing beside PATH but its hidden lock file")


def _by_type(ids: set[tuple[str, str, str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for kind, _, _ in ids:
        out[kind] = out.get(kind, 0) + 1
    return out


def disk_round() -> None:
    print("disk: full file system, file size limit, read-only mount, folder without write permission", flush=True)
    t = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "-rs",
                             "-v", str(ROOT / "tests" / "test_faults.py"), "-k",
                             "size_limit or full_disk or read_only or cannot_write"],
                            capture_output=True, text=True, cwd=ROOT, timeout=1200)
    for line in result.stdout.splitlines():
        if "::" in line and ("PASSED" in line or "FAILED" in line or "SKIPPED" in line) or line.startswith("SKIPPED"):
            print(f"    | {line[:200]}")
    check(result.returncode == 0 and "skipped" not in result.stdout.splitlines()[-1],
          f"the disk fault tests passed, none skipped ({time.monotonic() - t:.0f} s)", result.stdout[-3000:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="crash rounds per PATH state (default 2)")
    parser.add_argument("--workers", type=int, default=4, help="xdist workers per crash session (default 4)")
    parser.add_argument("--sessions", type=int, default=8, help="concurrent updating sessions (default 8)")
    parser.add_argument("--only", choices=["crash", "concurrency", "disk"], action="append")
    args = parser.parse_args()
    only = set(args.only or ["crash", "concurrency", "disk"])
    import torch

    print(f"stress_bundle: torch {torch.__version__}, python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="stress-bundle-"))
    headers = work / "headers"
    try:
        if "crash" in only:
            for r in range(args.repeats):
                for existing in (True, False):
                    crash_round(work / f"crash-{r}-{existing}", headers, args.workers, existing)
        if "concurrency" in only:
            concurrency_round(work / "concurrency", headers, args.sessions)
        if "disk" in only:
            disk_round()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"stress_bundle: {len(violations)} violation(s) in {time.monotonic() - started:.0f} s", flush=True)
    for v in violations:
        print(f"  VIOLATION: {v[:500]}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
