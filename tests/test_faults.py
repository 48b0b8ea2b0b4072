"""Hostile input and faults (issue 10), fast variants: a lock holder killed while it warms up,
sessions and the CLI writing one PATH at once under a reader, a full disk and a read-only folder.

Every case drives real pytest sessions (and the CLI) in subprocesses with real ``torch.compile``;
``scripts/stress_bundle.py`` runs the full variants (8 sessions, ``-n 4``, repeats).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from helpers import run_pytest
from zygote import Zygote, Zygotes

from pytest_compilecache import files
from pytest_compilecache.bundle.format import Bundle, make_entry, read_manifest
from pytest_compilecache.bundle.writing import write_bundle
from pytest_compilecache.storage.local import lock_file as lock_of

#: Real sessions against real servers and suites: left out of the fast tier (-m "not slow").
pytestmark = pytest.mark.slow

LOCK_TIMEOUT = 600

WARMUP_CONFTEST = '''
import os, time
import pytest

def model(x):
    import torch
    return torch.nn.functional.silu(x @ x.T) * 3 + x.sum()

@pytest.hookimpl(optionalhook=True)
def pytest_compilecache_warmup(cache):
    """The first process to get here says so (its pid and CHAIN in WARMUP_HOLD), compiles, and waits to be killed."""
    import torch
    with open(os.environ["WARMUP_LOG"], "a") as f:
        f.write(f"start {os.getpid()} {time.time()}\\n")
    first = False
    try:
        fd = os.open(os.environ.get("WARMUP_HOLD") or os.devnull, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        pass
    else:
        os.write(fd, f"{os.getpid()} {os.environ['CHAIN']}\\n".encode())
        os.close(fd)
        first = True
    torch.compile(model)(torch.randn(16, 16))
    if first:
        time.sleep(3600)
    with open(os.environ["WARMUP_LOG"], "a") as f:
        f.write(f"done {os.getpid()} {time.time()}\\n")
'''

WARMUP_TESTS = '''
import os
import torch
from conftest import model

def test_warm(warm_cache):
    torch.compile(model)(torch.randn(16, 16))
    warm_cache.assert_misses(fx_graph=0)

def test_own():
    n = int(os.environ["CHAIN"])
    with open(os.environ["OWN_LOG"], "a") as f:
        f.write(f"{n}\\n")
    def chain(x):
        y = x.cos()
        for _ in range(n):
            y = y.sin() * 1.5
        return y
    torch.compile(chain)(torch.randn(8))

def test_plain():
    pass
'''

#: One graph per value of CHAIN: the number of ``sin`` steps shapes the graph, so each session's is its own.
CHAIN_TEST = '''
import os
import torch

def test_chain():
    n = int(os.environ["CHAIN"])
    def chain(x):
        y = x.cos()
        for _ in range(n):
            y = y.sin() * 1.5
        return y
    torch.compile(chain)(torch.randn(8))
'''

#: Lowers the file size limit when the tests are done, before the plugin saves: building C++
#: kernels writes files of several MB, which a limit from the start would stop.
LIMIT_AT_SAVE_CONFTEST = '''
import os, resource, signal
import pytest

@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session):
    limit = int(os.environ["FSIZE_LIMIT"])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return (yield)
'''

READER = '''
import contextlib, io, json, os, sys, time
from pytest_compilecache import cli

path, stop, log = sys.argv[1:4]
reads = []
while True:
    last = os.path.exists(stop)
    for args in (["verify", path], ["inspect", "--json", path]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(args)
            except BaseException as exc:
                rc = f"{type(exc).__name__}: {exc}"
        counts = None
        if args[0] == "inspect" and rc == 0:
            data = json.loads(out.getvalue())
            counts = [e["artifacts"].get("inductor", {}).get("count", 0) for e in data["entries"] if e["matches_here"]]
        reads.append({"cmd": args[0], "rc": rc, "err": err.getvalue().strip(), "inductor": counts})
    if len(reads) == 2:
        print("reading", flush=True)
    if last:
        break
    time.sleep(0.02)
with open(log, "w") as f:
    json.dump(reads, f)
'''


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of an inner run: its own TMPDIR, none of the outer run's cache or xdist variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "TORCHINDUCTOR_", "TRITON_")) and k != "TORCH_COMPILE_CACHE_KEY_TAG"}
    tmp.mkdir(parents=True, exist_ok=True)
    return {**env, "TMPDIR": str(tmp), **extra}


def session_options(*args: str) -> list[str]:
    """pytest's arguments for a session of this module."""
    return ["-p", "no:randomly", "-p", "no:cacheprovider", "-p", "no:logging", "-q", "-rf", *args]


def make_project(folder: Path, headers: Path, **test_files: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pytest.ini").write_text(f"[pytest]\ncompile_cache_headers_dir = {headers}\nverbosity_compilecache = 1\n")
    for name, text in test_files.items():
        (folder / f"{name}.py").write_text(text)
    return folder


def run_cli(*args: str, env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_compilecache", *args], capture_output=True, text=True,
                          timeout=300, env=env, **kwargs)


def inductor_counts(path: Path) -> dict[str, int]:
    """Per entry (by cache_key_tag, "" for this machine's), the number of FX graph artifacts."""
    with read_manifest(path) as bundle:
        return {e.env["cache_key_tag"]: e.artifacts.get("inductor", {}).get("count", 0) for e in bundle.entries}


def identities(*paths: Path) -> list[set[tuple[str, str, str]]]:
    """(type, key, content hash) of every artifact in each bundle's entry for this machine."""
    code = (
        "import json, sys; from pytest_compilecache.bundle.format import read_manifest; "
        "from pytest_compilecache import _torchapi; here = _torchapi.environment_fingerprint(); "
        "bs = [read_manifest(p) for p in sys.argv[1:]]; "
        "print(json.dumps([sorted(_torchapi.artifact_identities(b.payload(b.find(here)))) for b in bs]))"
    )
    out = subprocess.run([sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    return [{tuple(i) for i in found} for found in json.loads(out.splitlines()[-1])]


def leftovers(folder: Path, path: Path) -> list[str]:
    """Temporary files a write to ``path`` would leave in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{path.name}.") and p.name.endswith(".tmp"))


class _Chosen:
    """One zygote picked beforehand (or none: a fresh process), for a session run in a thread of its own."""

    def __init__(self, zygote: Zygote | None) -> None:
        self._zygote = zygote

    def next(self, env: dict[str, str]) -> Zygote | None:
        return self._zygote if self._zygote is not None and self._zygote.can_run(env) else None


def sessions_at_once(zygotes: Zygotes | None, *sessions: tuple[list[str], Path, dict[str, str]],
                     after: dict[int, tuple[list[str], Path, dict[str, str]]] | None = None,
                     ) -> list[Future[subprocess.CompletedProcess[str]]]:
    """Start pytest sessions (arguments, folder, environment) at once, each in a thread of its own, the first
    two forked from this worker's two zygotes, the rest fresh processes; ``after[i]`` runs once session ``i``
    has ended, on its zygote. Their results (stdout and stderr) to come, in order, ``after``'s last."""
    picks = [zygotes.next(env) if zygotes is not None and i < 2 else None for i, (_, _, env) in enumerate(sessions)]
    after = after or {}

    def run(i: int, args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return run_pytest(_Chosen(picks[i]), args, cwd, env, timeout=400)  # type: ignore[arg-type]

    def run_after(i: int, session: tuple[list[str], Path, dict[str, str]]) -> subprocess.CompletedProcess[str]:
        futures[i].exception()
        return run(i, *session)

    pool = ThreadPoolExecutor(len(sessions))
    futures = [pool.submit(run, i, *session) for i, session in enumerate(sessions)]
    futures += [pool.submit(run_after, i, session) for i, session in after.items()]
    pool.shutdown(wait=False)
    return futures


def output(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout + done.stderr


def wait_for_holder(file: Path, runs: list[Future[subprocess.CompletedProcess[str]]], limit: float) -> list[int]:
    """The pid and CHAIN the warmup lock's first holder wrote to ``file``."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if file.exists() and file.read_text().endswith("\n"):
            return [int(word) for word in file.read_text().split()]
        if all(run.done() for run in runs):
            break
        time.sleep(0.05)
    outputs = "\n".join(output(run.result())[-3000:] for run in runs if run.done())
    raise AssertionError(f"no process announced it holds the warmup lock within {limit} s:\n{outputs}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the lock holder through /proc (Linux)")
def test_killing_the_warmup_lock_holder_lets_the_others_go_on(
    tmp_path: Path, shared_headers_dir: Path, zygote: Zygotes | None
) -> None:
    """``kill -9`` of the worker running the warmup under the bundle's lock, two sessions with ``-n 2`` each:
    the lock goes at once, exactly one process redoes the warmup, both sessions finish long before
    the lock timeout, PATH ends intact and holds what ran, and the killed session says what happened."""
    project = make_project(tmp_path / "project", shared_headers_dir, conftest=WARMUP_CONFTEST,
                           test_x=WARMUP_TESTS)
    bundle = tmp_path / "cache" / "x.bundle"
    log, hold, own = tmp_path / "warmups.log", tmp_path / "holder.pid", tmp_path / "own.log"
    args = session_options("-n", "2", f"--compile-cache-bundle={bundle}", f"--compile-cache-lock-timeout={LOCK_TIMEOUT}")
    runs = sessions_at_once(zygote, *(
        (args, project, clean_env(tmp_path / f"tmp{i}", WARMUP_LOG=str(log), WARMUP_HOLD=str(hold), OWN_LOG=str(own),
                                  CHAIN=str(i + 1)))
        for i in range(2)))
    pid = 0
    try:
        pid, chain = wait_for_holder(hold, runs, limit=240)
        held = time.monotonic()
        holders = files.lock_holders(lock_of(bundle))
        assert any(h.startswith(f"pid {pid} ") or h == f"pid {pid}" for h in holders), holders
        assert not bundle.exists(), "nothing was published before the warmup finished"
        killed = chain - 1
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    ended = [run.result(timeout=400) for run in runs]
    outputs = [output(d) for d in ended]
    total = time.monotonic() - held
    assert total < LOCK_TIMEOUT / 4, f"{total:.0f} s after the warmup took the lock: someone waited for the lock timeout"
    starts = [line.split() for line in log.read_text().splitlines() if line.startswith("start")]
    done = [line.split() for line in log.read_text().splitlines() if line.startswith("done")]
    assert [int(s[1]) for s in starts][0] == pid and len(starts) == 2, starts
    assert len(done) == 1 and int(done[0][1]) != pid, "exactly one process redid the warmup, to its end"
    redo_after = float(starts[1][2]) - killed_at
    assert redo_after < 30, f"the warmup was redone {redo_after:.1f} s after the kill"

    survivor, victim = outputs[1 - killed], outputs[killed]
    assert ended[1 - killed].returncode == 0, survivor
    assert "3 passed" in survivor, survivor
    # What a user of the killed session sees: xdist's crash report on the test it had handed the
    # worker (which never started), a replacement worker, and the plugin's explanation.
    assert "INTERNALERROR" not in victim and "Traceback" not in victim, victim
    expected = ["node down: Not properly terminated"]
    if "crashed while running" in victim:
        assert ended[killed].returncode == 1 and "1 failed, 2 passed" in victim, victim
        expected += ["crashed while running 'test_x.py::", "this test had not started"]
    else:
        assert "3 passed" in victim, victim
    for line in (*expected, f"PROBLEM: gw* (pid {pid}) died while running the warmup hook (or publishing its result), "
                 f"holding {lock_of(bundle)}; the OS released the lock"):
        head, _, tail = line.partition("*")
        assert head in victim and tail in victim, f"{line!r} not in:\n{victim}"

    verify = run_cli("verify", str(bundle))
    assert verify.returncode == 0, verify.stderr
    chains = set(own.read_text().split())
    assert inductor_counts(bundle) == {"": 1 + len(chains)}, "the warmup's graph and each test_own that ran"
    assert not leftovers(bundle.parent, bundle)


def test_sessions_and_the_cli_updating_one_path_at_once_keep_the_union(
    tmp_path: Path, shared_headers_dir: Path, old_bundle: Path, zygote: Zygotes | None
) -> None:
    """2 sessions with ``--compile-cache-update`` (each compiling its own graph), ``merge`` (of a
    bundle a 3rd session writes meanwhile) and ``prune`` on the same PATH at once (the second
    session, ``merge`` and ``prune`` start as the 3rd session ends, while the first still runs), and a
    reader looping over ``verify`` and ``inspect --json``: PATH ends with the union, and no read saw
    a partial or inconsistent file."""
    project = make_project(tmp_path / "project", shared_headers_dir, test_chain=CHAIN_TEST)
    bundle, extra = tmp_path / "x.bundle", tmp_path / "extra.bundle"
    with read_manifest(old_bundle) as b:
        b.read_all()
        here = b.entries[0]
        foreign = make_entry({**here.env, "cache_key_tag": "another machine"}, b.payload(here), here.artifacts)
    write_bundle(Bundle(bundle, [here, foreign]))
    assert inductor_counts(bundle) == {"": 1, "another machine": 1}

    stop, reads_log = tmp_path / "stop", tmp_path / "reads.json"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(bundle), str(stop), str(reads_log)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert reader.stdout is not None
    first_read = reader.stdout.readline()
    assert first_read == "reading\n", first_read + reader.stdout.read()
    sessions = [(session_options(f"--compile-cache-bundle={path}", *update), project,
                 clean_env(tmp_path / f"tmp{n}", CHAIN=str(n)))
                for n, path, update in ((9, extra, ()), *((n, bundle, ("--compile-cache-update",)) for n in (1, 2)))]
    runs = sessions_at_once(zygote, *sessions[:2], after={0: sessions[2]})
    first = runs[0].result(timeout=400)
    assert first.returncode == 0, output(first)
    merge = run_cli("merge", str(bundle), str(extra), "-o", str(bundle))
    prune = run_cli("prune", str(bundle), "--drop", "cache_key_tag=another machine")
    done = [run.result(timeout=400) for run in runs]
    stop.touch()
    reader_out = reader.communicate(timeout=120)[0]
    assert reader.returncode == 0, reader_out
    assert merge.returncode == 0, merge.stderr
    assert prune.returncode == 0 and "kept 1 of 2 environments" in prune.stdout, prune.stdout + prune.stderr
    for d in done:
        assert d.returncode == 0, output(d)
        assert "bundle written:" in d.stdout, output(d)

    assert inductor_counts(bundle) == {"": 4}, "the first graph, the merged one and each session's own"
    base, merged_in, final = identities(old_bundle, extra, bundle)
    assert base | merged_in < final
    reads = json.loads(reads_log.read_text())
    bad = [r for r in reads if r["rc"] != 0]
    assert not bad, bad[:5]
    counts = [r["inductor"][0] for r in reads if r["inductor"]]
    assert counts == sorted(counts) and counts[-1] == 4, "this machine's entry only ever grew"
    assert len(reads) >= 20, len(reads)
    assert not leftovers(tmp_path, bundle)


@pytest.fixture(scope="module")
def old_bundle(tmp_path_factory: pytest.TempPathFactory, shared_headers_dir: Path,
               run_session: Callable[..., subprocess.CompletedProcess[str]]) -> Path:
    """A good bundle from a real session (CHAIN=0), and beside it ``extra.bundle``: the same payload
    filed under another machine, something a merge would add."""
    folder = tmp_path_factory.mktemp("old")
    project = make_project(folder / "project", shared_headers_dir, test_chain=CHAIN_TEST)
    bundle = folder / "old.bundle"
    out = run_session(session_options(f"--compile-cache-bundle={bundle}"), project,
                      clean_env(folder / "tmp", CHAIN="0"), 300)
    assert out.returncode == 0, out.stdout + out.stderr
    with read_manifest(bundle) as b:
        entry = b.entries[0]
        other = make_entry({**entry.env, "cache_key_tag": "another machine"}, b.payload(entry), entry.artifacts)
        write_bundle(Bundle(folder / "extra.bundle", [other]))
    return bundle


def save_with_fault(project: Path, bundle: Path, old: Path, env: dict[str, str],
                    run_session: Callable[..., subprocess.CompletedProcess[str]], *session_args: str,
                    preexec: Callable[[], None] | None = None) -> tuple[subprocess.CompletedProcess[str], ...]:
    """A session that uses the bundle's graph (a warm hit, so it saves the same union again) into
    ``bundle`` (``--compile-cache-update``), then ``merge`` of ``extra.bundle`` into it (``preexec``
    run in its process before it starts), both under the fault; returns their results."""
    session = run_session(session_options(f"--compile-cache-bundle={bundle}", "--compile-cache-update", *session_args),
                          project, {**env, "CHAIN": "0"}, 300)
    merge = run_cli("merge", str(bundle), str(old.parent / "extra.bundle"), "-o", str(bundle), env=env,
                    preexec_fn=preexec)
    return session, merge


def check_refused(bundle: Path, old_bytes: bytes, session: subprocess.CompletedProcess[str],
                  merge: subprocess.CompletedProcess[str], reason: str) -> None:
    """The session ran its tests and said why PATH was not written; merge failed on one line;
    PATH is byte for byte the old bundle; no temporary file is left."""
    out = session.stdout
    assert session.returncode == 0, out + session.stderr
    assert "1 passed" in out and "Traceback" not in out and "INTERNALERROR" not in out, out
    lines = [line for line in out.splitlines() if line.startswith(("bundle failed:", "PROBLEM:"))]
    assert len(lines) == 2 and all(str(bundle) in line and reason in line for line in lines), out
    assert merge.returncode == 2, merge.stdout + merge.stderr
    assert merge.stderr.count("\n") == 1 and "Traceback" not in merge.stderr, merge.stderr
    assert merge.stderr.startswith("pytest-compilecache merge: error: ") and str(bundle) in merge.stderr, merge.stderr
    assert reason in merge.stderr, merge.stderr
    assert bundle.read_bytes() == old_bytes, "the old bundle must stay as it was"
    assert not leftovers(bundle.parent, bundle), leftovers(bundle.parent, bundle)


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_file_size_limit_while_saving_leaves_the_old_bundle(
    tmp_path: Path, old_bundle: Path, shared_headers_dir: Path,
    run_session: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """RLIMIT_FSIZE below the bundle's size, set once the tests are done (SIGXFSZ ignored, so
    the write fails with EFBIG), for the session's save and for ``merge``."""
    import resource

    project = make_project(tmp_path / "project", shared_headers_dir, test_chain=CHAIN_TEST,
                           conftest=LIMIT_AT_SAVE_CONFTEST)
    bundle = tmp_path / "cache" / "x.bundle"
    bundle.parent.mkdir()
    shutil.copy(old_bundle, bundle)
    old_bytes = bundle.read_bytes()
    limit = len(old_bytes) - 1

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = clean_env(tmp_path / "tmp", FSIZE_LIMIT=str(limit))
    session = run_session(session_options(f"--compile-cache-bundle={bundle}", "--compile-cache-update"), project,
                          {**env, "CHAIN": "0"}, 300)
    merge = run_cli("merge", str(bundle), str(old_bundle.parent / "extra.bundle"), "-o", str(bundle), env=env,
                    preexec_fn=limited)
    check_refused(bundle, old_bytes, session, merge, "File too large")


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "full"
    folder.mkdir()
    try:
        mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder))
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a small tmpfs here ({getattr(exc, 'stderr', '') or exc}); "
                    "test_a_file_size_limit_while_saving_leaves_the_old_bundle covers a failing write")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


def test_a_full_disk_while_saving_leaves_the_old_bundle(
    tmp_path: Path, old_bundle: Path, shared_headers_dir: Path, small_tmpfs: Path,
    run_session: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """PATH on a file system with no space left (a 2 MB tmpfs, filled up): ENOSPC."""
    project = make_project(tmp_path / "project", shared_headers_dir, test_chain=CHAIN_TEST)
    bundle = small_tmpfs / "x.bundle"
    shutil.copy(old_bundle, bundle)
    old_bytes = bundle.read_bytes()
    with open(small_tmpfs / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    session, merge = save_with_fault(project, bundle, old_bundle, clean_env(tmp_path / "tmp"), run_session)
    check_refused(bundle, old_bytes, session, merge, "No space left on device")


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "ro"
    folder.mkdir()
    try:
        mount("--bind", str(folder), str(folder))
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot bind-mount here ({getattr(exc, 'stderr', '') or exc}); "
                    "test_a_folder_the_user_cannot_write_leaves_the_old_bundle covers a read-only folder")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


def test_a_read_only_mount_leaves_the_old_bundle(
    tmp_path: Path, old_bundle: Path, shared_headers_dir: Path, read_only_folder: Path,
    run_session: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """PATH's folder is a read-only mount (EROFS, also for root)."""
    project = make_project(tmp_path / "project", shared_headers_dir, test_chain=CHAIN_TEST)
    bundle = read_only_folder / "x.bundle"
    shutil.copy(old_bundle, bundle)
    lock_of(bundle).touch()
    old_bytes = bundle.read_bytes()
    mount("-o", "remount,bind,ro", str(read_only_folder))
    session, merge = save_with_fault(project, bundle, old_bundle, clean_env(tmp_path / "tmp"), run_session)
    check_refused(bundle, old_bytes, session, merge, "Read-only file system")


def without_override() -> None:
    """In the child, before exec: drop root's power to write and search where modes forbid it
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER), so file modes apply as for any user."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2, 3):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            os._exit(97)


#: A plugin the session imports first (``-p``), as its own process or forked: what :func:`without_override` does
#: before exec, and root's override capabilities also dropped from this process's own sets (no exec follows here).
DROP_OVERRIDE = """
import ctypes

OVERRIDE = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
libc = ctypes.CDLL(None, use_errno=True)
for capability in OVERRIDE:
    assert libc.prctl(24, capability, 0, 0, 0) == 0, ctypes.get_errno()  # PR_CAPBSET_DROP


class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class Sets(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


header, sets = Header(0x20080522, 0), (Sets * 2)()  # _LINUX_CAPABILITY_VERSION_3
assert libc.capget(ctypes.byref(header), sets) == 0, ctypes.get_errno()
for name in ("effective", "permitted", "inheritable"):
    setattr(sets[0], name, getattr(sets[0], name) & ~sum(1 << c for c in OVERRIDE))
assert libc.capset(ctypes.byref(header), sets) == 0, ctypes.get_errno()
"""


@pytest.mark.parametrize("lock_file", ["missing", "writable"])
def test_a_folder_the_user_cannot_write_leaves_the_old_bundle(
    tmp_path: Path, old_bundle: Path, shared_headers_dir: Path, lock_file: str,
    run_session: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """PATH's folder has mode 0555. As root, modes stop no write, so the session (from its first plugin
    on, ``DROP_OVERRIDE``) and ``merge`` run without root's override capabilities (the user nobody cannot
    reach this venv). With no lock
    file the lock cannot be made; with a lock file anyone may write, the bundle's write is refused."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("needs root on Linux, to run the session without its override capabilities")
    probe = subprocess.run([sys.executable, "-c", "open('/proc/self/status')"], preexec_fn=without_override,
                           timeout=60)
    if probe.returncode != 0:
        pytest.skip("cannot drop the override capabilities here (prctl PR_CAPBSET_DROP refused)")
    project = make_project(tmp_path / "project", shared_headers_dir, test_chain=CHAIN_TEST, drop_override=DROP_OVERRIDE)
    folder = tmp_path / "cache"
    folder.mkdir()
    bundle = folder / "x.bundle"
    shutil.copy(old_bundle, bundle)
    if lock_file == "writable":
        lock_of(bundle).touch()
        os.chmod(lock_of(bundle), 0o666)
    old_bytes = bundle.read_bytes()
    folder.chmod(0o555)
    try:
        session, merge = save_with_fault(project, bundle, old_bundle, clean_env(tmp_path / "tmp"), run_session,
                                         "-p", "drop_override", preexec=without_override)
    finally:
        folder.chmod(0o755)
    check_refused(bundle, old_bytes, session, merge, "Permission denied")


SIMPLE_WARMUP_CONFTEST = '''
import pytest

@pytest.hookimpl(optionalhook=True)
def pytest_compilecache_warmup(cache):
    import torch
    torch.compile(lambda x: x.tanh() * 2)(torch.randn(8))
'''


def test_a_bundle_that_loaded_stays_loaded_when_the_warmup_cannot_take_the_lock(
    tmp_path: Path, old_bundle: Path, shared_headers_dir: Path,
    run_session: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """An updating session loads PATH, then finds its lock held by another process for longer than
    its lock timeout: its tests still run warm, the summary says the bundle loaded, and the lock
    problem is reported as what it is, naming the lock and its holder."""
    import filelock

    project = make_project(tmp_path / "project", shared_headers_dir, test_chain=CHAIN_TEST,
                           conftest=SIMPLE_WARMUP_CONFTEST)
    bundle = tmp_path / "cache" / "x.bundle"
    bundle.parent.mkdir()
    shutil.copy(old_bundle, bundle)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, filelock; lock = filelock.FileLock(sys.argv[1]); lock.acquire(); "
        "print('held', flush=True); time.sleep(120)"), str(lock_of(bundle))], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        out = run_session(session_options(f"--compile-cache-bundle={bundle}", "--compile-cache-update",
                                          "--compile-cache-lock-timeout=1"), project,
                          clean_env(tmp_path / "tmp", CHAIN="0"), 300).stdout
    finally:
        holder.kill()
        holder.wait()
    assert "1 passed" in out, out
    assert f"bundle: loaded: {bundle}" in out, out
    assert "unusable" not in out, out
    assert any(line.startswith("PROBLEM: ") and "the warmup did not run" in line and str(lock_of(bundle)) in line
               and f"pid {holder.pid}" in line for line in out.splitlines()), out
    assert filelock.FileLock(str(lock_of(bundle))).acquire(timeout=1)


def test_the_warmup_marker_says_one_outcome_and_nothing_else_reads_as_one(tmp_path: Path) -> None:
    """The marker other processes read to learn how the session's warmup ended: one typed outcome
    (with its error or its bundle kept apart), never a set of loose keys to be told apart by hand."""
    from pytest_compilecache.session.protocol import Outcome, WarmupMarker

    path = tmp_path / "warmup-done"
    assert WarmupMarker.read(path) is None, "no warmup has ended yet"
    for outcome, detail in ((Outcome.FAILED, "RuntimeError: boom"), (Outcome.KEPT_APART, str(tmp_path / "b")),
                            (Outcome.PUBLISHED, ""), (Outcome.NOTHING, "")):
        WarmupMarker(outcome, "gw1", detail).write(path)
        assert WarmupMarker.read(path) == WarmupMarker(outcome, "gw1", detail)
    for junk in ("", "[]", '{"published": true}', '{"outcome": "done"}'):
        path.write_text(junk)
        assert WarmupMarker.read(path) is None, junk
