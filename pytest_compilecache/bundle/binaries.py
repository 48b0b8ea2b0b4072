"""Compiled C++ binaries, which Mega-Cache leaves out, as a bundle entry carries them by *build identity* (what
torch's key does not cover; see docs/design.md). This module never imports torch."""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping

from .. import files
from ..caught import caught
from .._torchapi import layout

#: How much of a section is copied at a time.
_CHUNK = 1024 * 1024
#: zlib's level for carried files (compressed once, when made; copied as stored from then on).
_LEVEL = 6


def build_id(identity: Mapping[str, str]) -> str:
    """A short name for a build identity (what a binary's fit depends on beyond torch's key)."""
    return hashlib.sha256(json.dumps(dict(identity), sort_keys=True).encode()).hexdigest()[:16]


class BinaryDamaged(Exception):
    """A carried file cannot be used; the message names it and says why."""


@dataclass(frozen=True)
class CarriedFile:
    """One binary (or its source) a bundle entry carries, compressed as a bundle stores it: made or pooled here
    (compressed once), or read by range from the bundle it came from (copied as it is into another)."""

    build: str
    path: str
    sha256: str
    size: int
    #: Its bytes as stored (compressed); may raise :class:`OSError`.
    _raw: Callable[[], bytes] = field(repr=False, compare=False)
    #: How many bytes it takes in the bundle it is read from; ``None`` when compressed here.
    _stored: int | None = field(default=None, repr=False, compare=False)

    @classmethod
    def made(cls, build: str, path: str, data: bytes) -> "CarriedFile":
        """A file of content ``data``, compressed now."""
        packed = zlib.compress(data, _LEVEL)
        return cls(build, path, hashlib.sha256(data).hexdigest(), len(data), lambda: packed)

    @classmethod
    def in_pool(cls, build: str, path: str, file: Path) -> "CarriedFile":
        """A pooled ``file``, its checksum taken now, compressed when a bundle first needs it (then kept: a bundle
        reads it twice), and only if it still has that content; raises :class:`OSError` where it cannot be read."""
        sha256, size = files.checksum(file)

        @functools.cache
        def raw() -> bytes:
            data = file.read_bytes()
            if hashlib.sha256(data).hexdigest() != sha256:
                raise OSError(f"{file} changed since it was listed")
            return zlib.compress(data, _LEVEL)

        return cls(build, path, sha256, size, raw)

    @property
    def here(self) -> bool:
        """Whether it is compressed in this process, not copied as stored from a bundle."""
        return self._stored is None

    @property
    def stored(self) -> int:
        """Bytes it takes in a bundle (compressed); raises :class:`BinaryDamaged` where it cannot be read."""
        return len(self.raw()) if self._stored is None else self._stored

    def raw(self) -> bytes:
        """Its bytes as stored (compressed), not checked; raises :class:`BinaryDamaged` where they cannot be read."""
        try:
            chunk = self._raw()
        except OSError as exc:
            raise BinaryDamaged(f"carried binary {self.path} cannot be read: {exc.strerror or exc}") from None
        if self._stored is not None and len(chunk) != self._stored:
            raise BinaryDamaged(f"carried binary {self.path} is cut short")
        return chunk

    def content(self) -> bytes:
        """Its content, checked against its checksum; raises :class:`BinaryDamaged`."""
        chunk = self.raw()
        try:  # never inflated past its size
            data = zlib.decompressobj().decompress(chunk, min(self.size, sys.maxsize - 1) + 1)
        except zlib.error:
            data = b""
        if len(data) != self.size or hashlib.sha256(data).hexdigest() != self.sha256:
            raise BinaryDamaged(f"carried binary {self.path} fails its checksum; not used")
        return data


@dataclass
class CarriedBinaries:
    """The binaries a bundle entry carries, grouped by build identity: made here, pooled, or listed from a bundle's
    section (each read and checked when asked for)."""

    builds: dict[str, dict[str, str]] = field(default_factory=dict)
    files: dict[tuple[str, str], CarriedFile] = field(default_factory=dict)
    #: One per build or file left out when listed (a forged build id, a name outside torch's cache layout).
    problems: list[str] = field(default_factory=list, compare=False)
    #: Read from a bundle's section: its builds and files as read, the section's bytes as stored (a chunk at a
    #: time) and the section (without offset), copied as they are while the builds and files stay as read.
    _as_read: tuple[tuple[dict[str, dict[str, str]], dict[tuple[str, str], CarriedFile]],
                    Callable[[], Iterator[bytes]], dict[str, Any]] | None = field(default=None, repr=False,
                                                                                  compare=False)

    def __bool__(self) -> bool:
        return bool(self.files)

    @classmethod
    def of_section(cls, section: Mapping[str, Any], fetch: Callable[[int, int], bytes]) -> "CarriedBinaries":
        """The files a checked manifest section lists, their bytes read by ``fetch(at, size)`` from the section
        as stored, unchecked (a bundle copies them, or while they stay as listed the section as it is)."""
        forged = {b for b, i in section["builds"].items() if build_id(i) != b}
        builds = {b: dict(i) for b, i in section["builds"].items() if b not in forged}
        problems = [f"carried binaries of build {b} do not match its build identity; not used" for b in sorted(forged)]
        listed, at = {}, 0
        for build, path, sha256, size, stored in section["files"]:
            if build not in forged and not layout.valid_path(path):
                problems.append(f"carried binary {path!r} has a name outside torch's cache layout; not used")
            elif build not in forged:
                read = functools.partial(fetch, at, stored)
                listed[(build, path)] = CarriedFile(build, path, sha256, size, read, stored)
            at += stored
        total = section["size"]

        def chunks() -> Iterator[bytes]:
            for at in range(0, total, _CHUNK):
                try:
                    chunk = fetch(at, min(_CHUNK, total - at))
                except OSError as exc:
                    raise BinaryDamaged(f"the carried binaries cannot be read: {exc.strerror or exc}") from None
                if len(chunk) != min(_CHUNK, total - at):
                    raise BinaryDamaged("the carried binaries are cut short")
                yield chunk

        as_read = {k: v for k, v in section.items() if k != "offset"}
        return cls(builds, listed, problems, ((dict(builds), dict(listed)), chunks, as_read))

    def add(self, build: str, path: str, data: bytes) -> None:
        """Add a file unless one with this build and path is there (the first one wins; timing files are merged)."""
        old = self.files.get((build, path))
        if old is not None and layout.is_timings(path):
            try:
                data = layout.merge_timings(old.content(), data)
            except BinaryDamaged as exc:  # the damaged copy is replaced
                caught("merging autotune timings", exc)
        elif old is not None:
            return
        self.files[(build, path)] = CarriedFile.made(build, path, data)

    def fitting(self, build: str) -> dict[str, CarriedFile]:
        """``{path: file}`` of the files of ``build`` (the binaries that fit a machine of that build identity)."""
        return {path: file for (b, path), file in self.files.items() if b == build}

    def probes(self, probe_sources: Collection[str]) -> set[str]:
        """The carried binaries (paths) built from one of ``probe_sources``: torch's CPU probes, no test's kernel."""
        texts = {hashlib.sha256(source.encode()).hexdigest() for source in probe_sources}
        listed = self.files.values()
        sources = {f.path.rsplit(".", 1)[0] for f in listed if f.path.endswith(".cpp") and f.sha256 in texts}
        return {f.path for f in listed if layout.is_cpp(f.path) and f.path.rsplit(".", 1)[0] in sources}

    def counts(self, probe_sources: Collection[str] = ()) -> dict[str, int]:
        """``{"count": C++ binaries, "bytes": their size}``, with the CPU probes built from ``probe_sources`` apart."""
        probes = self.probes(probe_sources)
        kernels = [f for f in self.files.values() if layout.is_cpp(f.path) and f.path not in probes]
        apart = {"probes": len(probes)} if probes else {}
        return {"count": len(kernels), "bytes": sum(f.size for f in kernels), **apart}

    def triton_counts(self) -> dict[str, int]:
        """``{"count": Triton kernels, "bytes": size of all Triton files}`` (its compiled modules are no kernels)."""
        triton = [f for f in self.files.values() if f.path.startswith(layout.TRITON + "/")]
        kernels = {f.path.rsplit("/", 1)[0] for f in triton if layout.is_group_file(f.path.rsplit("/", 1)[1])}
        return {"count": len(kernels), "bytes": sum(f.size for f in triton)}

    def checked(self) -> tuple["CarriedBinaries", list[str]]:
        """These binaries less those that cannot be read or fail their checksum (each read now, one at a time), and
        one problem per file left out."""
        damaged = {}
        for key, file in self.files.items():
            try:
                file.content()
            except BinaryDamaged as exc:
                damaged[key] = str(exc)
        if not damaged:
            return self, []
        kept = {key: file for key, file in self.files.items() if key not in damaged}
        return CarriedBinaries(dict(self.builds), kept), list(damaged.values())

    @staticmethod
    def union(parts: Iterable["CarriedBinaries"]) -> "CarriedBinaries":
        """Every build and file of ``parts``; for one build and path the earliest part wins, but a copy stored in a
        bundle over the same content compressed here; timing files are merged (a damaged one left out)."""
        merged = CarriedBinaries()
        for part in parts:
            for build, identity in part.builds.items():
                merged.builds.setdefault(build, identity)
            for key, file in part.files.items():
                have = merged.files.get(key)
                if have is not None and layout.is_timings(key[1]):
                    try:
                        merged.add(key[0], key[1], file.content())
                    except BinaryDamaged as exc:
                        caught("merging autotune timings", exc)
                        continue
                elif have is None or (have.here and not file.here and have.sha256 == file.sha256):
                    merged.files[key] = file
        return merged

    def packed(self) -> tuple[Callable[[], Iterator[bytes]], dict[str, Any]]:
        """The section a bundle stores, a file at a time as stored, and its manifest section (without offset): as it
        was read where nothing changed since. Raises :class:`BinaryDamaged` where a file cannot be read."""
        if self._as_read is not None:
            (builds, as_read), chunks, section = self._as_read
            if self.builds == builds and len(self.files) == len(as_read) and all(
                    self.files.get(key) is file for key, file in as_read.items()):
                return chunks, section
        ordered = []
        digest = hashlib.sha256()
        for file in sorted(self.files.values(), key=lambda f: (f.build, f.path)):
            try:
                digest.update(file.raw())
            except BinaryDamaged:
                if not file.here:
                    raise
                continue  # gone from the pool since it was listed (dropped as unloadable): rebuilt where needed
            ordered.append(file)
        listing = [[f.build, f.path, f.sha256, f.size, f.stored] for f in ordered]
        used = {f.build for f in ordered}
        section = {"size": sum(f.stored for f in ordered), "sha256": digest.hexdigest(),
                   "builds": {b: i for b, i in self.builds.items() if b in used}, "files": listing}
        return (lambda: (f.raw() for f in ordered)), section


def natural(value: Any) -> bool:
    """Whether ``value`` is a non-negative integer (``true`` is none)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_section(section: Any) -> None:
    """Raise :class:`TypeError` unless ``section`` is a well-formed binaries manifest section."""
    if not isinstance(section, dict):
        raise TypeError("binaries must be an object")
    for name in ("offset", "size"):
        if not natural(section.get(name)):
            raise TypeError(f"binaries.{name} must be a non-negative integer")
    if not isinstance(section.get("sha256"), str):
        raise TypeError("binaries.sha256 must be a string")
    builds = section.get("builds")
    if not isinstance(builds, dict) or not all(
            isinstance(b, str) and isinstance(i, dict) and all(isinstance(v, str) for v in i.values())
            for b, i in builds.items()):
        raise TypeError("binaries.builds must map build ids to string fields")
    files = section.get("files")
    if not isinstance(files, list):
        raise TypeError("binaries.files must be a list")
    total = 0
    for item in files:
        if not (isinstance(item, list) and len(item) == 5 and all(isinstance(x, str) for x in item[:3])
                and all(natural(x) for x in item[3:])):
            raise TypeError("binaries.files entries must be [build, path, sha256, size, stored size]")
        if item[0] not in builds:
            raise TypeError(f"binaries.files names an unknown build {item[0]!r}")
        total += item[4]
    if total != section["size"]:
        raise TypeError("binaries.files do not add up to binaries.size")


def identity_differences(carried: Mapping[str, str], here: Mapping[str, str]) -> str:
    """Which fields of two build identities differ, in words."""
    keys = list(here) + [k for k in carried if k not in here]
    diffs = [f"{k}: {carried.get(k, '(absent)')} there, {here.get(k, '(absent)')} here"
             for k in keys if carried.get(k) != here.get(k)]
    return "; ".join(diffs) or "identical"
