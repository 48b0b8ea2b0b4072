"""The plugin's state for one pytest process: options, the process's cache root, per-test caches."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest

from .cache import CompileCache
from .environment import SavedEnv, caches_disabled_by_env, point_cache_dirs_at


class CompileCacheSession:
    """Everything the hooks and fixtures of one pytest process share; kept in ``config.stash``."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.isolate_all: bool = bool(config.getoption("compile_cache_isolate") or config.getini("compile_cache_isolate"))
        self._root: Path | None = None
        self._count = 0
        self._headers_dir: Path | None = None
        self._saved_env: SavedEnv | None = None

    @property
    def root(self) -> Path:
        """This process's own folder: per-test cache dirs, and torch's default dir while isolated."""
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="pytest-compilecache-"))
        return self._root

    def start(self) -> None:
        """Before collection: with isolation for all tests, point compiles outside tests at our root."""
        if self.isolate_all:
            self._saved_env = SavedEnv()
            point_cache_dirs_at(str(self.root / "outside-tests"))

    def close(self) -> None:
        """Restore the environment and remove this process's folder."""
        if self._saved_env is not None:
            self._saved_env.restore()
            self._saved_env = None
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def new_cache(self, nodeid: str, kind: str = "cold") -> CompileCache:
        """A fresh, not yet active :class:`CompileCache` in a new folder named after the test."""
        self._count += 1
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.rsplit("::", 1)[-1])[:60]
        path = self.root / "tests" / f"{self._count:05d}-{name}"
        return CompileCache(path, self.root / "process", self.headers_dir, kind=kind)

    @property
    def headers_dir(self) -> Path:
        """Where precompiled C++ headers go: ini ``compile_cache_headers_dir``, else ``.pytest_cache``."""
        if self._headers_dir is None:
            configured = self.config.getini("compile_cache_headers_dir")
            cache = getattr(self.config, "cache", None)
            if configured:
                self._headers_dir = Path(configured).expanduser().absolute()
            elif cache is not None:
                self._headers_dir = cache.mkdir("compilecache") / "precompiled_headers"
            else:
                self._headers_dir = self.root / "precompiled_headers"
        return self._headers_dir

    def header(self) -> list[str]:
        """Lines for pytest's header: how isolation is set up and what disables caches."""
        lines = [f"compilecache: isolation of every test: {'on' if self.isolate_all else 'off'}"]
        lines.extend(f"compilecache: WARNING: {line}; cache assertions are meaningless" for line in caches_disabled_by_env())
        return lines
