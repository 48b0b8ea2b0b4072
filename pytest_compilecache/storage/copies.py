"""This machine's copies of a bundle at a URL, one file per version of the object, and its locks."""

from __future__ import annotations

import contextlib
import hashlib
import re
from pathlib import Path
from typing import Mapping

from ..bundle.format import Bundle, read_manifest, write_bundle
from .interface import Version
from .local import Lock
from .merge import env_id

_COPY = re.compile(r"[0-9a-f]{20}-(all|[0-9a-f]{12})\.bundle")


class Copies:
    """The folder of one URL's copies. Each is named after the object version it holds (and, for a
    copy of one entry, that entry's environment), so a copy can never be taken for another version.
    A short lock (:attr:`readers`) lets one process of the machine download while the others wait
    and then find the copy; a second (:attr:`writers`) serializes the machine's writers and its warmup.
    Bundles read from here are called ``label`` in messages."""

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
        for candidate in [self.path(version, None)] + ([self.path(version, env)] if env is not None else []):
            if candidate.is_file():
                return candidate
        return None

    def holds(self, version: Version) -> bool:
        """Whether this machine keeps a copy of ``version`` of the object (of all or part of it)."""
        return bool(version.tag) and any(self.folder.glob(f"{self._stem(version)}-*.bundle"))

    def keep(self, bundle: Bundle, version: Version, env: Mapping[str, str] | None) -> Bundle | None:
        """Write ``bundle``'s entries as the copy of ``version`` (all of it, or only ``env``'s entry),
        remove copies of other versions, and return the copy, open. Where the version has no tag, or
        another process that holds a newer version removed this copy at once, keep nothing (``None``)."""
        if not version.tag or not version.size:
            return None
        target = self.path(version, env)
        self.folder.mkdir(parents=True, exist_ok=True)
        write_bundle(Bundle(target, bundle.entries))
        try:
            kept = read_manifest(target, label=self.label)
        except FileNotFoundError:
            return None
        self.forget_others(version)
        return kept

    def forget_others(self, version: Version) -> None:
        """Remove the copies of every other version."""
        stem = self._stem(version)
        for old in self.folder.glob("*.bundle"):
            if not old.name.startswith(stem) and _COPY.fullmatch(old.name):
                with contextlib.suppress(OSError):
                    old.unlink()
