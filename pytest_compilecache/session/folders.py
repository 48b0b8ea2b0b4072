"""Where one pytest process keeps its caches: per-test folders under pytest's basetemp, per-worker kept ones."""

from __future__ import annotations

import hashlib
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from .. import files


class _Remover:
    """Removes folders without making anyone wait: a folder is first moved into a trash folder (a
    rename, at once: nothing sees it at its old path again), then removed on a thread of its own while
    tests run; what is still there when the process ends is left to a detached process."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._moved = 0
        self._unmoved: list[Path] = []

    def remove(self, path: Path, trash: Path) -> None:
        """Move ``path`` into ``trash`` now, and remove it soon."""
        moved = self._move(path, trash)
        if moved is None:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="compilecache-remover", daemon=True)
            self._thread.start()
        self._queue.put(moved)

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

    def _run(self) -> None:
        while (path := self._queue.get()) is not None:
            shutil.rmtree(path, ignore_errors=True)

    def finish(self, paths: list[Path], trash: Path) -> None:
        """Move ``paths`` into ``trash`` too, and have everything there (and whatever could not be
        moved) removed, without waiting for it."""
        for path in paths:
            if path.exists():
                self._move(path, trash)
        if self._thread is not None:
            self._queue.put(None)
            self._thread = None
        left = [p for p in (trash, *self._unmoved) if p.exists()]
        self._unmoved = []
        if left:
            _remove_detached(left)


#: Detached removals started by this process (kept, so that none is collected while it runs).
_detached: list[subprocess.Popen[bytes]] = []


def _remove_detached(paths: list[Path]) -> None:
    """Remove ``paths`` in a process of its own that outlives this one (pytest's exit does not wait for it)."""
    code = "import shutil, sys\nfor path in sys.argv[1:]:\n    shutil.rmtree(path, ignore_errors=True)"
    flags = getattr(subprocess, "CREATE_NO_WINDOW", 0) | getattr(subprocess, "DETACHED_PROCESS", 0)
    try:
        _detached.append(subprocess.Popen(
            [sys.executable, "-c", code, *map(str, paths)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, creationflags=flags))
    except OSError:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)


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
        background, by a detached process for what is left when the session ends.

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
