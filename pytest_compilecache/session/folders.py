"""Where the plugin keeps things: per-test folders under pytest's basetemp, per-worker kept ones, and the plugin's home
(``compile_cache_home``), tried once per session by writing in it; where it cannot be written, a folder of the
session's own stands in."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import filelock
import pytest

from .. import files


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
        os.utime(base)  # used now: see prune
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


#: The standard tag (https://bford.info/cachedir/), as pytest's cache folder has it: backup tools skip the folder.
CACHEDIR_TAG = (b"Signature: 8a477f597d28d172789f06886806bc55\n"
                b"# This file is a cache directory tag created by pytest-compilecache.\n"
                b"# For information about cache directory tags, see:\n#\thttps://bford.info/cachedir/spec.html\n")
#: A folder of an environment (``workers/<environment>``) that no run has used for this many days is removed.
UNUSED_DAYS = 30
_DAY = 86400.0


def settle(home: Path, headers: Path, stand_in: Callable[[], Path]) -> dict[str, Any]:
    """The home and headers' folder where a file can be made in them, else folders under ``stand_in()``, as the
    :class:`.options.Options` fields they set (``home_notices``: why a configured folder is not used, a line each)."""
    notices = []
    if why := _made(home, tag=True):
        moved = stand_in() / "home"
        notices.append(_instead("compile_cache_home", home, why, moved))
        home, headers = moved, moved / headers.relative_to(home) if headers.is_relative_to(home) else headers
    if why := _made(headers):
        moved = stand_in() / "precompiled-headers"
        notices.append(_instead("compile_cache_headers_dir", headers, why, moved))
        headers = moved
    return {"home": home, "headers_dir": headers, "home_notices": tuple(notices)}


def _made(folder: Path, tag: bool = False) -> str:
    """Why ``folder`` cannot be made or written in ("" when a file could be made in it); with ``tag``, tagged."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if tag and not (folder / "CACHEDIR.TAG").exists():
            files.write_atomic(folder / "CACHEDIR.TAG", CACHEDIR_TAG, fsync=False)
    except OSError as exc:
        return f"{exc.filename or folder}: {exc.strerror or exc}"
    return files.cannot_write(folder)


def prune(home: Path) -> None:
    """At most once a day (``home/.pruned`` says when last), remove the environments' folders no run has used
    (touched) for :data:`UNUSED_DAYS` days."""
    stamp, now = home / ".pruned", time.time()
    try:
        if stamp.exists() and now - stamp.stat().st_mtime < _DAY:
            return
        stamp.touch()
        gone = [p for p in (home / "workers").iterdir() if now - p.stat().st_mtime > UNUSED_DAYS * _DAY]
    except OSError:
        return
    for folder in gone:
        shutil.rmtree(folder, ignore_errors=True)


def _instead(name: str, folder: Path, why: str, moved: Path) -> str:
    return (f"{name} {folder} cannot be written ({why}); this session uses {moved} instead, removed at its end "
            f"(set {name} to a folder this user can write to keep it between runs)")
