"""This machine's copies of a bundle at a URL, one file per version of the object, and its locks."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Mapping

from .. import files
from ..bundle.format import Bundle, read_manifest, write_bundle
from .interface import Version
from .local import Lock
from .merge import env_id

_COPY = re.compile(r"[0-9a-f]{20}-(all|[0-9a-f]{12})\.bundle")
#: A download left by a process killed midway is removed after this many seconds.
_STALE_DOWNLOAD = 3600.0


class Copies:
    """The folder of one URL's copies, each named after the version it holds; locks for its readers and writers."""

    def __init__(self, folder: Path, label: str, lock_timeout: float) -> None:
        self.folder = folder
        self.label = label
        self.writers = Lock(folder / "bundle", lock_timeout)
        self.readers = Lock(folder / "read", lock_timeout)

    @staticmethod
    def _stem(version: Version) -> str:
        return hashlib.sha256(f"{version.tag}\0{version.size}".encode()).hexdigest()[:20]

    def path(self, version: Version, env: Mapping[str, str] | None) -> Path:
        """Where the copy of ``version`` (whole, or only ``env``'s entry) lives."""
        part = "all" if env is None else hashlib.sha256(env_id(env).encode()).hexdigest()[:12]
        return self.folder / f"{self._stem(version)}-{part}.bundle"

    def held(self, version: Version, env: Mapping[str, str] | None) -> Path | None:
        """The copy of ``version`` holding what the reader wants, if this machine keeps one."""
        if not version.tag or not version.size:
            return None
        return next((p for p in (self.path(version, None), self.path(version, env)) if p.is_file()), None)

    def holds(self, version: Version) -> bool:
        """Whether this machine keeps a copy of ``version`` of the object (of all or part of it)."""
        return bool(version.tag) and any(self.folder.glob(f"{self._stem(version)}-*.bundle"))

    def keep(self, bundle: Bundle, version: Version, env: Mapping[str, str] | None) -> Bundle | None:
        """Write ``bundle``'s entries as the copy of ``version`` (only ``env``'s, with ``env``); the copy, open."""
        if not version.tag or not version.size:
            return None
        target = self.path(version, env)
        write_bundle(Bundle(target, bundle.entries))
        try:
            kept = read_manifest(target, label=self.label)
        except FileNotFoundError:
            return None
        self.forget_others(version)
        return kept

    def download(self) -> Path:
        """A new file to download the object into: renamed into a copy by :meth:`adopt`, else removed by the caller."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="download-", suffix=".part", dir=self.folder)
        os.close(fd)
        os.chmod(name, 0o666 & ~files.umask())  # as every copy: readable by whoever shares the folder
        return Path(name)

    def adopt(self, download: Path, version: Version) -> Path | None:
        """Make ``download``, the whole object read and checked, the copy of ``version``; its path (``None``: a
        version that cannot be told from the next, so nothing is kept)."""
        if not version.tag or not version.size:
            return None
        target = self.path(version, None)
        files.replace(download, target)
        self.forget_others(version)
        return target

    def forget_others(self, version: Version) -> None:
        """Remove the copies of every other version, and downloads left by processes killed midway."""
        stem = self._stem(version)
        for old in self.folder.glob("*.bundle"):
            if not old.name.startswith(stem) and _COPY.fullmatch(old.name):
                with contextlib.suppress(OSError):
                    old.unlink()
        for left in self.folder.glob("download-*.part"):
            with contextlib.suppress(OSError):
                if left.stat().st_mtime < time.time() - _STALE_DOWNLOAD:
                    left.unlink()
