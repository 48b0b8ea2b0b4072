"""Where one pytest process keeps its caches: per-test folders under pytest's basetemp, per-worker kept ones."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .. import _torchapi, files


#: The remover process's program: removes each NUL-terminated absolute path it reads, until its input ends.
_REMOVER = """import os, shutil, sys
pending = b""
for chunk in iter(lambda: sys.stdin.buffer.read1(65536), b""):
    *paths, pending = (pending + chunk).split(b"\\0")
    for path in map(os.fsdecode, paths):
        if os.path.isabs(path):
            shutil.rmtree(path, ignore_errors=True)
"""

#: The class as this module found it: a test's mock of ``subprocess.Popen``, still active in its
#: teardown, does not become what removes folders.
_Popen = subprocess.Popen


class _Remover:
    """Removes folders without making anyone wait: a folder is first moved into a trash folder (a
    rename, at once: nothing sees it at its old path again), then removed by one process of its own,
    started with the first removal, which finishes what it was given after this one ends. (A thread
    would take turns with the tests for the interpreter's lock: about 2 ms a ``warm_cache`` test.)
    While that process is behind (its pipe full), what is moved waits in the trash for :meth:`finish`."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._start_tried = False
        self._moved = 0
        self._unmoved: list[Path] = []

    def remove(self, path: Path, trash: Path) -> None:
        """Move ``path`` into ``trash`` now, and remove it soon."""
        moved = self._move(path, trash)
        if moved is not None:
            self._send([moved])

    def _move(self, path: Path, trash: Path) -> Path | None:
        """Where ``path`` is now (in ``trash``, or where it was if it cannot move); None if it is gone."""
        self._moved += 1
        target = trash / f"{self._moved:05d}-{path.name}"
        for _ in range(2):
            try:
                trash.mkdir(exist_ok=True)
                os.rename(path, target)
                return target
            except FileNotFoundError:  # the folder is gone, or the trash was removed under us: look again
                if not path.exists():
                    return None
            except OSError:  # another file system, a file held open: removed where it is
                break
        self._unmoved.append(path)
        return path

    def _send(self, paths: list[Path]) -> bool:
        """Have the remover process remove ``paths`` (here and now, if it cannot run); False, and
        nothing sent, if its pipe is full (each path is in the trash, or among the unmoved)."""
        if not self._start_tried:
            self._start_tried = True
            self._process = _start_remover()
        process = self._process
        if process is not None and process.stdin is not None:
            try:
                _write(process.stdin.fileno(), b"".join(os.fsencode(path) + b"\0" for path in paths))
                return True
            except BlockingIOError:
                return False
            except (OSError, ValueError):  # the process is gone
                self._let_go()
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)
        return True

    def _let_go(self) -> None:
        """Close the remover process's input (it finishes what it has, then ends); the next removal starts another."""
        if self._process is not None and self._process.stdin is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()
        self._process = None
        self._start_tried = False

    def finish(self, paths: list[Path], trash: Path) -> None:
        """Move ``paths`` into ``trash`` too, and have everything there (and whatever could not be
        moved) removed, without waiting for it."""
        for path in paths:
            if path.exists():
                self._move(path, trash)
        left = [p for p in (trash, *self._unmoved) if p.exists()]
        self._unmoved = []
        if left and not self._send(left):  # the process is behind: a new one takes the rest, beside it
            self._let_go()
            self._send(left)
        self._let_go()


def _write(fd: int, data: bytes) -> None:
    """Write ``data`` to the non-blocking pipe ``fd``, or raise ``BlockingIOError`` if none of it fits
    now (once part of it is written, the rest is, waiting)."""
    written = os.write(fd, data)
    if written == 0 and data:  # a full pipe that does not say so (Windows' non-blocking pipes)
        raise BlockingIOError
    data = data[written:]
    if data:
        _set_blocking(fd, True)
        try:
            while data:
                data = data[os.write(fd, data):]
        finally:
            _set_blocking(fd, False)


def _set_blocking(fd: int, blocking: bool) -> None:
    """Where the platform can (not Windows before Python 3.12, whose pipes then always block)."""
    with contextlib.suppress(AttributeError, OSError):
        os.set_blocking(fd, blocking)


#: Remover processes started by this process and still running (kept, so that none is collected while it runs).
_removers: list[subprocess.Popen[bytes]] = []


def _start_remover() -> subprocess.Popen[bytes] | None:
    """A process that removes the paths written to its input and outlives this one (pytest's exit does
    not wait for it); None where none can start."""
    _removers[:] = [process for process in _removers if process.poll() is None]
    flags = getattr(subprocess, "CREATE_NO_WINDOW", 0) | getattr(subprocess, "DETACHED_PROCESS", 0)
    try:
        with _torchapi.processes_read_no_entries():  # it reads no cache entry: nothing to make whole for it
            process = _Popen(
                [sys.executable, "-S", "-c", _REMOVER], bufsize=0, stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=os.path.dirname(sys.executable) or None,
                start_new_session=True, close_fds=True, creationflags=flags)
    except Exception:  # whatever keeps it from starting, folders are then removed where they are
        return None
    if process.stdin is not None:
        _set_blocking(process.stdin.fileno(), False)
    _removers.append(process)
    return process


class Folders:
    """This process's folders, created on first use.

    ``root`` lies under pytest's basetemp (so ``--basetemp`` and its retention apply); per-test
    folders are made inside it and removed when their test ends (in the background: see :meth:`discard`).
    """

    def __init__(self, config: pytest.Config, shared: Path | None = None) -> None:
        self._config = config
        self._root: Path | None = None
        self._owned_root = False
        self._shared = shared
        self._owns_shared = shared is None
        self._count = 0
        self._remover = _Remover()

    @property
    def root(self) -> Path:
        """This process's own folder."""
        if self._root is None:
            factory = getattr(self._config, "_tmp_path_factory", None)
            if factory is not None:
                try:
                    self._root = factory.mktemp("compilecache", numbered=False)
                except FileExistsError:
                    self._root = factory.mktemp("compilecache", numbered=True)
            else:
                self._root = Path(tempfile.mkdtemp(prefix="pytest-compilecache-"))
                self._owned_root = True
        return self._root

    @property
    def process(self) -> Path:
        """Stands in for torch's shared default directory in this process."""
        path = self.root / "process"
        path.mkdir(exist_ok=True)
        return path

    @property
    def template(self) -> Path:
        """The cache folder the bundle is loaded into; every ``warm_cache`` test starts from its links (``files.link_tree``)."""
        return self.root / "template"

    @property
    def session_cache(self) -> Path:
        """Where compiles outside fixtures go when isolation or a bundle is on."""
        return self.root / "session-cache"

    @property
    def shared(self) -> Path:
        """The folder all processes of the session share (made by the controller, or here)."""
        if self._shared is None:
            self._shared = self.root / "shared"
            self._shared.mkdir(exist_ok=True)
        return self._shared

    def for_test(self, nodeid: str) -> Path:
        """A new, not yet created folder named after a test."""
        self._count += 1
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.rsplit("::", 1)[-1])[:60]
        return self.root / "tests" / f"{self._count:05d}-{name}"

    def discard(self, path: Path) -> None:
        """Remove a test's folder: gone from its path at once, its files removed in the background
        (nothing reads it again: each test's name is new)."""
        self._remover.remove(path, self.root / "trash")

    def remove(self, keep_root: bool) -> None:
        """Remove what this process made: gone from their paths at once, their files removed in the
        background by the remover process, which outlives this one.

        With ``keep_root`` the root stays for pytest's retention, with the folders of failed tests.
        """
        if self._root is None:
            if self._shared is not None and self._owns_shared:
                shutil.rmtree(self._shared, ignore_errors=True)
            return
        leaving = [self._root / name for name in ("template", "session-cache", "process")]
        if self._shared is not None and self._owns_shared:
            leaving.append(self._shared)
        if keep_root and not self._owned_root:
            self._remover.finish(leaving, self._root / "trash")
        else:
            gone = self._root.with_name(f"{self._root.name}-removed-{os.getpid()}")
            try:
                os.rename(self._root, gone)
            except OSError:
                gone = self._root
            self._remover.finish([], gone)
        self._root = None


def _environment_key() -> str:
    """A short hash of the interpreter and torch installation (no torch import)."""
    from importlib import metadata  # here: it costs about 12 ms to import, and only worker mode asks

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    text = f"{sys.executable}\n{sys.version}\n{torch_version}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class WorkerDir:
    """A cache folder kept between runs for one worker id, never shared by two live processes.

    ``<home>/workers/<environment>/<worker id>``: if another live session holds that worker id's
    folder, the next free ``<worker id>-<n>`` is taken. The lock is held until :meth:`release`.
    """

    def __init__(self, home: Path, worker_id: str) -> None:
        base = home / "workers" / _environment_key()
        base.mkdir(parents=True, exist_ok=True)
        for n in range(1000):
            name = worker_id if n == 0 else f"{worker_id}-{n}"
            lock = files.PathLock(base / f"{name}.lock")
            try:
                lock.acquire(timeout=0)
            except files.LockTimeout:
                continue
            self.path = base / name
            self.path.mkdir(exist_ok=True)
            self._lock: files.PathLock | None = lock
            return
        raise pytest.UsageError(f"{base}: no free per-worker cache folder (1000 in use)")

    def release(self) -> None:
        """Let another session use this folder."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None
