"""Inner pytest runs forked from a process that has already imported torch and its compiler.

A fresh ``python -m pytest`` spends 6-8 s importing torch, Dynamo and Inductor before its first
compile; the suite starts hundreds of them. The zygote pays that once per test worker, then forks a
child per inner run. The child sets the run's working folder, environment, arguments and output
files, and runs ``pytest`` as ``python -m pytest`` would. Until then nothing has compiled, so the
child's torch state is a fresh process's. What differs: torch is imported before the plugin, as in
a project whose conftest imports it; where a run's environment differs from the zygote's in a
variable read at import (``TORCH*``, ``TRITON*``, ``PYTHON*``, ...), ``Zygote.run`` says so and
the caller starts a fresh process instead. Tests about import order use fresh processes. Two
zygotes take turns (``Zygotes``), so that two runs in a row, a building run and its warm run, have
different hash seeds and memory layouts, as two fresh processes would.

Run as a script, this module is the zygote: one JSON request per line on stdin, answered with the
child's pid, then its exit status.
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
_READ_AT_IMPORT = ("TORCH", "PYTORCH", "TRITON", "CUDA", "PYTHON", "OMP_", "MKL", "KMP_", "LD_", "CXX", "CC",
                   "XDG_", "NUMEXPR", "OPENBLAS")
# ... except these, which torch reads each time it needs them.
_READ_WHEN_USED = {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTHONPATH"}


def _at_import(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_READ_AT_IMPORT) and k not in _READ_WHEN_USED}


class Zygote:
    """The client: one zygote process per test worker."""

    def __init__(self, process: subprocess.Popen[bytes], env: Mapping[str, str]) -> None:
        self._process = process
        self._at_import = _at_import(env)
        self._broken = False

    @classmethod
    def start(cls, env: Mapping[str, str]) -> Zygote:
        process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, env=dict(env))
        return cls(process, env)

    def can_run(self, env: Mapping[str, str]) -> bool:
        """Whether a run in ``env`` sees what a fresh process would."""
        return not self._broken and self._process.poll() is None and _at_import(env) == self._at_import

    def run(self, args: list[str], cwd: Path, env: Mapping[str, str], out: Path, err: Path,
            timeout: float | None) -> int:
        """Run ``python -m pytest *args`` in a forked child; its exit status."""
        assert self._process.stdin is not None and self._process.stdout is not None
        request = {"args": args, "cwd": str(cwd), "env": dict(env), "out": str(out), "err": str(err)}
        try:
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
        self._process.kill()
        self._process.wait()


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


def _become(request: dict[str, Any]) -> None:
    """In the child: turn into ``python -m pytest`` as the request describes, and never return."""
    import tempfile

    os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    import pytest

    sys.argv = [os.path.join(os.path.dirname(pytest.__file__), "__main__.py"), *request["args"]]
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [request["cwd"], *extra, *[p for p in sys.path[1:] if p not in extra]]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = pytest.main()
    sys.stdout.flush()
    raise SystemExit(int(code))


def _serve() -> None:
    _preload()
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
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


if __name__ == "__main__":
    _serve()
