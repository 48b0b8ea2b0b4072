"""Inner pytest runs forked from a process that has already imported torch and its compiler.

A fresh ``python -m pytest`` spends 6-8 s importing torch, Dynamo and Inductor before its first
compile; the suite starts hundreds of them. The zygote pays that once per test worker, then forks a
child per inner run. The child sets the run's working folder, environment, arguments and output
files, and runs ``pytest`` as ``python -m pytest`` would. Until then nothing has compiled, so the
child's torch state is a fresh process's. What differs: torch is imported before the plugin, as in
a project whose conftest imports it; it already knows the CPU's vector instructions
(``_learn_cpu_features``), so a forked run builds no probe binaries of its own, and what else depends
on the installed torch alone (``_learn_what_never_changes``); the zygote's objects are out of the
garbage collector's reach (``_freeze_what_is_loaded``); and paths torch works out under the temporary
folder at import lie under the zygote's own. Where a run's
environment differs from the zygote's in a variable read at import (``TORCH*``, ``TRITON*``,
``PYTHON*``, ...), ``Zygote.run`` says so and the caller starts a fresh process instead. Tests
about import order use fresh processes. Two zygotes take turns (``Zygotes``), so that two runs in a
row, a building run and its warm run, have different hash seeds and memory layouts, as two fresh
processes would.

An inner run with ``-n 2`` forks its xdist workers the same way: before anything else, the child
forks a worker zygote of its own, and execnet starts each worker through a launcher
(``zygote.py --worker ADDRESS -u -c CODE``) that hands the zygote its stdin, stdout and stderr over
a Unix socket; the zygote forks a child that runs CODE on them as ``python -u -c CODE`` would, and
the launcher exits as that worker does. A ``--tx`` with ``python=`` or with ``env:`` variables read
at import, and a launch environment that differs from the run's in one, start a fresh worker instead.

Run as a script, this module is the zygote: one JSON request per line on stdin, answered with the
child's pid, then its exit status; with ``--worker``, it is the launcher.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Mapping

# Environment variables a library may read when it is imported: a run whose values differ from the
# zygote's cannot be forked from it.
# (``XDG_*`` is not among them: torch reads it when a path is asked for, in ``torch.hub`` and
# ``torch._appdirs``, and the zygote imports nothing else that looks.)
_READ_AT_IMPORT = ("TORCH", "PYTORCH", "TRITON", "CUDA", "PYTHON", "OMP_", "MKL", "KMP_", "LD_", "CXX", "CC",
                   "NUMEXPR", "OPENBLAS")
# ... except these, which torch reads each time it needs them.
_READ_WHEN_USED = {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTHONPATH"}


def _at_import(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_READ_AT_IMPORT) and k not in _READ_WHEN_USED}


class Zygote:
    """The client: one zygote process per test worker."""

    def __init__(self, process: subprocess.Popen[bytes], env: Mapping[str, str], folder: str) -> None:
        self._process = process
        self._at_import = _at_import(env)
        self._broken = False
        self._folder = folder
        self._ready = False

    @classmethod
    def start(cls, env: Mapping[str, str]) -> Zygote:
        import tempfile

        folder = tempfile.mkdtemp(prefix="zygote-")  # its temporary folder, and its CPU probes'
        # Unbuffered: a status line that arrived with the pid line must not wait in a buffer select cannot see.
        process = subprocess.Popen([sys.executable, __file__, folder], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, env=dict(env), bufsize=0)
        return cls(process, env, folder)

    @property
    def temporary_folder(self) -> Path:
        """The zygote's ``TMPDIR`` when it imported torch (where the paths torch works out at import lie)."""
        return Path(self._folder)

    def wait_until_ready(self) -> None:
        """Return once the zygote has imported torch and done its one-off work (it starts in the
        background): only then does its temporary folder hold what torch makes at import."""
        assert self._process.stdout is not None
        if not self._ready:
            line = self._process.stdout.readline()
            if line != b"ready\n":
                self._broken = True
                raise RuntimeError(f"the zygote did not start: {line!r}")
            self._ready = True

    def can_run(self, env: Mapping[str, str]) -> bool:
        """Whether a run in ``env`` sees what a fresh process would."""
        return not self._broken and self._process.poll() is None and _at_import(env) == self._at_import

    def run(self, args: list[str], cwd: Path, env: Mapping[str, str], out: Path, err: Path,
            timeout: float | None) -> int:
        """Run ``python -m pytest *args`` in a forked child; its exit status."""
        assert self._process.stdin is not None and self._process.stdout is not None
        request = {"args": args, "cwd": str(cwd), "env": dict(env), "out": str(out), "err": str(err)}
        try:
            self.wait_until_ready()
            self._process.stdin.write(json.dumps(request).encode() + b"\n")
            self._process.stdin.flush()
            pid = int(self._process.stdout.readline())
            deadline = None if timeout is None else time.monotonic() + timeout
            status = _read_line(self._process.stdout, deadline)
            if status is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(["pytest", *args], timeout or 0)
            return int(status)
        except BaseException:  # out of step with the zygote: later runs start fresh processes
            self._broken = True
            self.stop()
            raise

    def stop(self) -> None:
        import shutil

        self._process.kill()
        self._process.wait()
        shutil.rmtree(self._folder, ignore_errors=True)


class Zygotes:
    """Two zygotes taking turns: consecutive runs come from processes started apart."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._all = [Zygote.start(env), Zygote.start(env)]
        self._turn = 0

    def next(self, env: Mapping[str, str]) -> Zygote | None:
        """The zygote whose turn it is, if a run in ``env`` can be forked from it."""
        zygote = self._all[self._turn % len(self._all)]
        self._turn += 1
        return zygote if zygote.can_run(env) else None

    def stop(self) -> None:
        for zygote in self._all:
            zygote.stop()


def _read_line(stream: IO[bytes], deadline: float | None) -> bytes | None:
    import select

    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([stream], [], [], wait)
        if ready:
            return stream.readline()
        if deadline is not None and time.monotonic() >= deadline:
            return None


def _preload() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pytest  # noqa: F401
        import torch  # noqa: F401
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
        import torch._inductor.select_algorithm  # noqa: F401


def _learn_what_never_changes() -> None:
    """Do, once for all forked runs, what torch does at every process's first compile and then keeps,
    and what depends on the installed torch alone: the hash of its own source files (``torch_key``)
    and the pattern matcher's patterns (traced on the first compile; the joint-graph ones for CPU
    inputs, as the suite's compiles are). Anything that fails or is missing here is left for each
    run to do, as before."""
    import inspect

    import torch
    from torch._inductor import codecache
    from torch._inductor.fx_passes import joint_graph, post_grad, pre_grad

    learn: list[Any] = [getattr(codecache, "torch_key", None), getattr(pre_grad, "lazy_init", None),
                        getattr(post_grad, "lazy_init", None)]
    joint = getattr(joint_graph, "lazy_init", None)
    if joint is not None:
        takes_device = "input_device" in inspect.signature(joint).parameters
        learn.append((lambda: joint(torch.device("cpu"))) if takes_device else joint)
    for step in learn:
        if step is not None:
            with contextlib.suppress(Exception):
                step()


def _learn_cpu_features(folder: str) -> None:
    """Ask torch which vector instructions this CPU runs (``valid_vec_isa_list``), building its probe
    binaries in ``folder``. torch asks once a process, before its first C++ compile: six probes
    built, each loaded in a child Python (1.2 s where they are built already, 7 s where not); the answer
    depends on the machine alone, so the zygote asks once for all the runs it forks. The tests about
    probes carried in a bundle (``test_binaries.py``) run fresh processes, which ask for themselves."""
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    try:
        from torch._inductor import cpu_vec_isa

        cpu_vec_isa.valid_vec_isa_list()
    finally:
        if previous is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def _freeze_what_is_loaded() -> None:
    """Move every object the zygote holds (torch's modules, mostly) out of the garbage collector's
    reach (``gc.freeze``), as servers that fork workers do. A forked run's full collections (pytest
    asks for several at its end) then walk the run's own objects, not torch's million: an inner run
    took about a third less CPU time (test_explain.py's five runs: 31-35 s to 23 s). These objects live
    as long as the zygote anyway; the run's own garbage is collected as in a fresh process."""
    import gc

    gc.collect()
    gc.freeze()


def _take_on(cwd: str, env: Mapping[str, str], first: str) -> None:
    """Take on a new process's working folder, environment, SIGINT handler and ``sys.path``
    (``first``, then PYTHONPATH's entries, then the interpreter's), as Python sets them at start."""
    import tempfile

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *[p for p in sys.path[1:] if p not in extra]]
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _become(request: dict[str, Any]) -> None:
    """In the child: turn into ``python -m pytest`` as the request describes, and never return."""
    os.setsid()
    _take_on(request["cwd"], request["env"], request["cwd"])
    written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOCTTY  # a terminal, too, as a fresh process's output
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["out"], written), (2, request["err"], written)):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    _fork_xdist_workers(_start_worker_zygote())
    import pytest

    sys.argv = [os.path.join(os.path.dirname(pytest.__file__), "__main__.py"), *request["args"]]
    code = pytest.main()
    sys.stdout.flush()
    raise SystemExit(int(code))


def _serve(folder: str) -> None:
    import tempfile

    # Whatever torch makes under the temporary folder at import (its default cache folder, for one)
    # lands in the zygote's own folder, removed when it stops, not in the user's.
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = None
    _preload()
    _learn_cpu_features(folder)
    _learn_what_never_changes()
    _freeze_what_is_loaded()
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    answers.write(b"ready\n")
    answers.flush()
    for line in requests:
        request = json.loads(line)
        answers.flush()
        pid = os.fork()
        if pid == 0:
            _become(request)
        answers.write(f"{pid}\n".encode())
        answers.flush()
        _, status = os.waitpid(pid, 0)
        answers.write(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        answers.flush()


def _start_worker_zygote() -> str | None:
    """Fork, from this still untouched run, the process that forks the run's xdist workers; the
    address of the (Linux abstract) socket it listens on, or None where there is none. It ends with
    the run."""
    import socket

    path = f"\0pytest-compilecache-zygote-{os.getpid()}-{time.monotonic_ns()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
    except OSError:
        listener.close()
        return None
    listener.listen(16)
    run = os.getpid()
    if os.fork() == 0:
        _serve_workers(listener, run)
    listener.close()
    return path


def _serve_workers(listener: Any, run: int) -> None:
    """The worker zygote: for each launcher (``--worker``), fork a child that becomes the xdist worker
    ``python -u -c CODE`` would have started, on the launcher's own stdin, stdout and stderr; answer
    its pid, then its exit status. A launcher that goes away takes its worker with it."""
    import select
    import socket

    at_import = _at_import(os.environ)
    workers: dict[int, Any] = {}
    ended, ending = os.pipe()
    os.set_blocking(ending, False)
    signal.set_wakeup_fd(ending)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    while os.getppid() == run:
        ready, _, _ = select.select([listener, ended, *workers.values()], [], [], 0.5)
        for conn in ready:
            if conn == ended:
                os.read(ended, 4096)
            elif conn is listener:
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                request = json.loads(message)
                if _at_import(request["env"]) != at_import or len(fds) != 3:
                    conn.sendall(b"fresh\n")
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for other in (listener, conn, *workers.values()):
                        other.close()
                    os.close(ended)
                    os.close(ending)
                    _become_worker(request, fds)
                for fd in fds:
                    os.close(fd)
                conn.sendall(f"{pid}\n".encode())
                workers[pid] = conn
            else:
                pid = next(p for p, c in workers.items() if c is conn)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        while workers:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in workers:
                conn = workers.pop(pid)
                with contextlib.suppress(OSError):
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os._exit(0)


def _become_worker(request: dict[str, Any], fds: list[int]) -> None:
    """In the child: turn into ``python -u -c CODE`` on the launcher's streams, and never return."""
    import builtins
    import io

    for fd, received in enumerate(fds):
        os.dup2(received, fd)
        os.close(received)
    _take_on(request["cwd"], request["env"], "")
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    sys.argv = ["-c"]
    exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    raise SystemExit(0)


def _fork_xdist_workers(path: str | None) -> None:
    """Have execnet start this run's xdist workers through the launcher, which forks them from the
    worker zygote at ``path`` instead of starting ``python`` from nothing."""
    if path is None:
        return
    import execnet.gateway_io

    popen_args = execnet.gateway_io.popen_args

    def forked(spec: Any) -> list[str]:
        args = popen_args(spec)
        if spec.python or _at_import(spec.env):  # the worker sets spec.env itself, after its imports
            return args
        return [sys.executable, __file__, "--worker", path.replace("\0", "@", 1), *args[1:]]

    execnet.gateway_io.popen_args = forked


def _launch(path: str, args: list[str]) -> None:
    """The launcher: ask the worker zygote for a worker with this process's streams, then wait for it
    and exit as it did; start ``python *args`` instead where the zygote cannot fork one."""
    import socket

    request = {"code": args[args.index("-c") + 1], "cwd": os.getcwd(), "env": dict(os.environ)}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path.replace("@", "\0", 1))
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        answers = conn.makefile("rb")
        first = answers.readline().strip()
    except OSError:
        first = b"fresh"
    if not first.isdigit():
        os.execv(sys.executable, [sys.executable, *args])
    worker = int(first)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, _frame: os.kill(worker, signum))
    status = answers.readline().strip()
    raise SystemExit(int(status) if status else 1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _launch(sys.argv[2], sys.argv[3:])
    else:
        _serve(sys.argv[1])
