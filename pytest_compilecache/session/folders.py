"""Where one pytest process keeps its caches: per-test folders under pytest's basetemp, per-worker kept ones."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import filelock
import pytest


class Folders:
    """This process's folders under pytest's basetemp, made on first use; a test's is removed when the test ends."""

    def __init__(self, config: pytest.Config, shared: Path | None = None) -> None:
        self._config, self._shared, self._owns_shared = config, shared, shared is None
        self._root: Path | None = None
        self._owned_root, self._count = False, 0

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
        """Remove a test's folder (nothing reads it again: each test's name is new)."""
        shutil.rmtree(path, ignore_errors=True)

    def remove(self, keep_root: bool) -> None:
        """Remove what this process made; with ``keep_root``, the root and failed tests' folders stay for pytest."""
        leaving = [] if self._root is None else [self._root / name for name in ("template", "session-cache", "process")]
        if self._shared is not None and self._owns_shared:
            leaving.append(self._shared)
        if self._root is not None and not (keep_root and not self._owned_root):
            leaving = [self._root]
        for path in leaving:
            shutil.rmtree(path, ignore_errors=True)
        self._root = None


def _environment_key() -> str:
    """A short hash of the interpreter and torch installation (no torch import)."""
    from importlib import metadata  # here: it costs about 12 ms to import, and only worker mode asks

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    return hashlib.sha256(f"{sys.executable}\n{sys.version}\n{torch_version}".encode()).hexdigest()[:12]


class WorkerDir:
    """A cache folder kept between runs per worker id (the next free ``<id>-<n>`` if in use), locked until released."""

    def __init__(self, home: Path, worker_id: str) -> None:
        base = home / "workers" / _environment_key()
        base.mkdir(parents=True, exist_ok=True)
        os.utime(base)  # used now: see home.prune
        for n in range(1000):
            name = worker_id if n == 0 else f"{worker_id}-{n}"
            lock = filelock.FileLock(str(base / f".{name}.lock"))
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                continue
            self.path = base / name
            self.path.mkdir(exist_ok=True)
            self._lock = lock
            return
        raise pytest.UsageError(f"{base}: no free per-worker cache folder (1000 in use)")

    def release(self) -> None:
        """Let another session use this folder."""
        self._lock.release()
