"""Compiled C++ binaries, which Mega-Cache leaves out: found in cache folders, pooled, carried in bundles, by
*build identity* (what torch's key does not cover; see docs/design.md). This module never imports torch."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Protocol

from filelock import FileLock

from .. import files
from .._torchapi import layout
from .members import no_file

#: How much of a section is copied at a time.
_CHUNK = 1024 * 1024
#: zlib's level for carried files (compressed once, when made; copied as stored from then on).
_LEVEL = 6
#: The pool's file whose content changes with every add or drop (see :meth:`BinaryPool.version`).
_VERSION = "version"


def build_id(identity: Mapping[str, str]) -> str:
    """A short name for a build identity (what a binary's fit depends on beyond torch's key)."""
    return hashlib.sha256(json.dumps(dict(identity), sort_keys=True).encode()).hexdigest()[:16]


def _write_atomic(dest: Path, data: bytes, mtime: float | None = None) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(dest, data, fsync=False, mtime=mtime)


def _place(source: Path, dest: Path) -> bool:
    """Put ``source`` at ``dest`` atomically (a link, else a copy; a Triton group file rewritten); False if there."""
    if layout.is_group_file(dest.name):
        if dest.exists():
            return False
        _write_atomic(dest, layout.relocated_group(source.read_bytes(), dest.parent))
        return True
    try:
        return _link(source, dest)
    except OSError:  # another file system, or links not allowed: a copy
        if dest.exists():
            return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    _copy_over(source, dest)
    return True


def _copy_over(source: Path, dest: Path) -> None:
    """Copy ``source`` beside ``dest`` and rename it over ``dest``: a reader sees the old file or the new one."""
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.tmp")
    try:
        shutil.copy2(source, tmp)
        files.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _replace_if_rebuilt(source: Path, dest: Path) -> bool:
    """Replace the pooled ``dest`` with ``source`` where they differ (Triton rebuilt a module that would not load)."""
    try:
        if os.path.samefile(source, dest) or source.read_bytes() == dest.read_bytes():
            return False
    except OSError:
        return False
    _copy_over(source, dest)
    return True


def _link(source: Path, dest: Path) -> bool:
    """A hard link to ``source`` at ``dest``, its folder made where missing; False if ``dest`` exists."""
    try:
        os.link(source, dest)
    except FileExistsError:
        return False
    except FileNotFoundError:
        if not source.exists():
            raise
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, dest)
        except FileExistsError:
            return False
    return True


def drop_from(folder: Path, names: Iterable[str]) -> int:
    """Remove the binaries of a cache folder (or pool) that have these names; returns how many."""
    wanted = set(names)
    gone = [file for rel, file in layout.find_binaries(folder).items() if rel.rsplit("/", 1)[-1] in wanted]
    for file in gone:
        file.unlink(missing_ok=True)
    return len(gone)


class BinaryPool:
    """The binaries of one build identity built or loaded in a session, shared by its processes, written once each."""

    def __init__(self, root: Path, identity: Mapping[str, str]) -> None:
        self.identity = dict(identity)
        self.build = build_id(identity)
        self.path = Path(root) / self.build
        self._seeded: dict[Path, str] = {}
        if not (self.path / "identity.json").exists():
            _write_atomic(self.path / "identity.json", json.dumps(self.identity, sort_keys=True).encode())
            self._changed()

    def version(self) -> str:
        """A token that changes whenever any process adds to or drops from the pool ("" if unreadable)."""
        try:
            return (self.path / _VERSION).read_text()
        except OSError:
            return ""

    def _changed(self) -> None:
        files.write_atomic(self.path / _VERSION, uuid.uuid4().hex.encode(), fsync=False)

    def files(self) -> dict[str, Path]:
        """``{relative path: file}`` of everything in the pool."""
        return layout.find_binaries(self.path)

    def add_from(self, folder: Path, since: float = 0.0, leaving_out: Collection[str] = ()) -> int:
        """Take every binary of a cache folder the pool lacks (timings merged), not older than ``since`` nor in
        ``leaving_out``; how many."""
        taken = 0
        try:
            for rel, file in layout.in_order(layout.find_binaries(folder, since)):
                try:
                    if (since and file.stat().st_mtime < since) or rel in leaving_out:
                        continue
                    if layout.is_timings(rel):
                        taken += self._merge(rel, file.read_bytes())
                    elif _place(file, self.path / rel):
                        taken += 1
                    elif layout.is_triton_module(rel):
                        taken += _replace_if_rebuilt(file, self.path / rel)
                except OSError:
                    continue
        finally:
            if taken:
                self._changed()
        return taken

    def _merge(self, rel: str, data: bytes) -> bool:
        """Merge a timing file into the pool's, under a lock: processes add timings concurrently."""
        dest = self.path / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(dest.parent / ".timings.lock")):
            old = dest.read_bytes() if dest.exists() else None
            new = data if old is None else layout.merge_timings(old, data)
            if new == old:
                return False
            _write_atomic(dest, new)
        return True

    def add_all(self, items: Iterable[tuple[str, bytes]]) -> tuple[int, list[tuple[str, OSError]]]:
        """Add each ``(rel, bytes)`` the pool lacks; how many were added, and those that could not be written."""
        added, failed = 0, []
        try:
            for rel, data in items:
                try:
                    if layout.is_timings(rel):
                        added += self._merge(rel, data)
                    elif not (self.path / rel).exists():
                        _write_atomic(self.path / rel, data)
                        added += 1
                except OSError as exc:
                    failed.append((rel, exc))
        finally:
            if added:
                self._changed()
        return added, failed

    def add_loaded(self, items: Iterable[tuple[str, bytes]],
                   loaded: float) -> tuple[list[str], list[tuple[str, OSError]]]:
        """Add binaries (no timings) read from a bundle when torch asks for their folder: each the pool lacks,
        with the file time ``loaded`` (when the bundle was loaded: they are loaded, not built, then). The pool's
        version stays (every process places these itself when torch asks, so no :meth:`seed` must rescan); the
        paths written, and those that could not be."""
        written, failed = [], []
        for rel, data in items:
            try:
                if not (self.path / rel).exists():
                    _write_atomic(self.path / rel, data, mtime=loaded)
                    written.append(rel)
            except OSError as exc:
                failed.append((rel, exc))
        return written, failed

    def put(self, folder: Path, paths: Iterable[str]) -> int:
        """Link these pooled files (no timings) into a cache folder where missing; how many were placed."""
        placed = 0
        for rel in paths:
            try:
                placed += _place(self.path / rel, Path(folder) / rel)
            except OSError:
                continue
        return placed

    def drop(self, names: Iterable[str]) -> int:
        """Remove the pooled files with these names (binaries that failed to load); returns how many."""
        dropped = drop_from(self.path, names)
        if dropped:
            self._changed()
        return dropped

    def seed(self, folder: Path) -> int:
        """Link every pooled binary into a cache folder where missing (timings merged), once per pool change."""
        folder = Path(folder)
        version = self.version()
        if version and self._seeded.get(folder) == version:
            return 0
        placed = 0
        for rel, file in layout.in_order(self.files()):
            dest = folder / rel
            try:
                if layout.is_timings(rel) and dest.exists():
                    _write_atomic(dest, layout.merge_timings(dest.read_bytes(), file.read_bytes()))
                    placed += 1
                else:
                    placed += _place(file, dest)
            except OSError:
                continue
        self._seeded[folder] = version
        return placed


def pooled(root: Path) -> "CarriedBinaries":
    """Everything the pools under ``root`` hold (every build), ready to be written into a bundle."""
    carried = CarriedBinaries()
    try:
        builds = sorted(d for d in Path(root).iterdir() if d.is_dir())
    except OSError:
        return carried
    for folder in builds:
        try:
            identity = json.loads((folder / "identity.json").read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(identity, dict) or build_id(identity) != folder.name:
            continue
        carried.builds[folder.name] = {str(k): str(v) for k, v in identity.items()}
        for rel, file in sorted(layout.find_binaries(folder).items()):
            try:
                if layout.is_timings(rel):
                    carried.add(folder.name, rel, file.read_bytes())
                elif (folder.name, rel) not in carried.files:
                    carried.files[(folder.name, rel)] = CarriedFile.in_pool(folder.name, rel, file)
            except OSError:
                continue
    return carried


class _Source(Protocol):
    """Where a carried file's stored (compressed) bytes come from."""

    #: Whether they are compressed in this process (not copied from a bundle).
    here: bool

    @property
    def stored(self) -> int: ...

    def raw(self) -> bytes: ...


class _Made:
    """Content made in this process, compressed now."""

    here = True

    def __init__(self, data: bytes) -> None:
        self._packed = zlib.compress(data, _LEVEL)
        self.stored = len(self._packed)

    def raw(self) -> bytes:
        return self._packed


class _Pooled:
    """A file of a session's pool, compressed when first needed (then kept: a bundle reads it twice), and only if
    it still has the content it was listed with."""

    here = True

    def __init__(self, file: Path, sha256: str) -> None:
        self._file, self._sha256 = file, sha256
        self._packed: bytes | None = None

    @property
    def stored(self) -> int:
        return len(self.raw())

    def raw(self) -> bytes:
        if self._packed is None:
            data = self._file.read_bytes()
            if hashlib.sha256(data).hexdigest() != self._sha256:
                raise OSError(f"{self._file} changed since it was listed")
            self._packed = zlib.compress(data, _LEVEL)
        return self._packed


class _InBundle:
    """A file stored in a bundle, read by range as it is stored."""

    here = False

    def __init__(self, fetch: Callable[[int, int], bytes], at: int, stored: int) -> None:
        self._fetch, self._at, self.stored = fetch, at, stored

    def raw(self) -> bytes:
        return self._fetch(self._at, self.stored)


@dataclass(frozen=True)
class CarriedFile:
    """One binary (or its source) a bundle entry carries, compressed as a bundle stores it: made in this process
    (compressed once), or read by range from the bundle it came from (copied as it is into another, never inflated
    for it)."""

    build: str
    path: str
    sha256: str
    size: int
    _source: _Source = field(repr=False, compare=False)

    @classmethod
    def made(cls, build: str, path: str, data: bytes) -> "CarriedFile":
        """A file of content ``data``, compressed now."""
        return cls(build, path, hashlib.sha256(data).hexdigest(), len(data), _Made(data))

    @classmethod
    def in_pool(cls, build: str, path: str, file: Path) -> "CarriedFile":
        """A pooled ``file``, its checksum taken now, compressed when a bundle first needs it; raises
        :class:`OSError` where it cannot be read."""
        sha256, size = files.checksum(file)
        return cls(build, path, sha256, size, _Pooled(file, sha256))

    @classmethod
    def in_bundle(cls, listed: "Listed", fetch: Callable[[int, int], bytes]) -> "CarriedFile":
        """A file a bundle's section lists, read by ``fetch(at, size)`` from the section as stored."""
        return cls(listed.build, listed.path, listed.sha256, listed.size, _InBundle(fetch, listed.at, listed.stored))

    @property
    def here(self) -> bool:
        """Whether it is compressed in this process, not copied as stored from a bundle."""
        return self._source.here

    @property
    def stored(self) -> int:
        """Bytes it takes in a bundle (compressed); raises :class:`BinaryDamaged` where it cannot be read."""
        try:
            return self._source.stored
        except OSError as exc:
            raise BinaryDamaged(f"carried binary {self.path} cannot be read: {exc.strerror or exc}") from None

    def raw(self) -> bytes:
        """Its bytes as stored (compressed), not checked; raises :class:`BinaryDamaged` where they cannot be read."""
        try:
            chunk = self._source.raw()
        except OSError as exc:
            raise BinaryDamaged(f"carried binary {self.path} cannot be read: {exc.strerror or exc}") from None
        if len(chunk) != self.stored:
            raise BinaryDamaged(f"carried binary {self.path} is cut short")
        return chunk

    def content(self) -> bytes:
        """Its content, checked against its checksum; raises :class:`BinaryDamaged`."""
        data = _inflated(self.raw(), self.size, self.sha256)
        if data is None:
            raise BinaryDamaged(f"carried binary {self.path} fails its checksum; not used")
        return data


@dataclass
class CarriedBinaries:
    """The binaries a bundle entry carries, grouped by build identity."""

    builds: dict[str, dict[str, str]] = field(default_factory=dict)
    files: dict[tuple[str, str], CarriedFile] = field(default_factory=dict)
    #: Read from a bundle's section: its builds and files as read, the section's bytes as stored (a chunk at a
    #: time) and the section (without offset), copied as they are while the builds and files stay as read.
    _as_read: tuple[tuple[dict[str, dict[str, str]], dict[tuple[str, str], CarriedFile]],
                    Callable[[], Iterator[bytes]], dict[str, Any]] | None = field(default=None, repr=False,
                                                                                  compare=False)

    def __bool__(self) -> bool:
        return bool(self.files)

    def add(self, build: str, path: str, data: bytes) -> None:
        """Add a file unless one with this build and path is there (the first one wins; timing files are merged)."""
        old = self.files.get((build, path))
        if old is not None and layout.is_timings(path):
            try:
                data = layout.merge_timings(old.content(), data)
            except BinaryDamaged:  # the damaged copy is replaced
                pass
        elif old is not None:
            return
        self.files[(build, path)] = CarriedFile.made(build, path, data)

    def counts(self, probe_sources: Collection[str] = ()) -> dict[str, int]:
        """``{"count": C++ binaries, "bytes": their size}``, with the CPU probes built from ``probe_sources`` apart."""
        return _cpp_counts(self.files.values(), probe_sources)

    def probes(self, probe_sources: Collection[str]) -> set[str]:
        """The carried binaries (paths) built from one of ``probe_sources``: torch's CPU probes, no test's kernel."""
        return _probes(self.files.values(), probe_sources)

    def triton_counts(self) -> dict[str, int]:
        """``{"count": Triton kernels, "bytes": size of all Triton files}`` (its compiled modules are no kernels)."""
        return _triton_counts(self.files.values())

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
        """Every build and file of ``parts``; for one build and path, the earliest part wins, but a copy stored in a
        bundle (copied as it is) over the same content compressed here; timing files are merged (a damaged one
        left out)."""
        merged = CarriedBinaries()
        for part in parts:
            for build, identity in part.builds.items():
                merged.builds.setdefault(build, identity)
            for key, file in part.files.items():
                have = merged.files.get(key)
                if have is not None and layout.is_timings(key[1]):
                    try:
                        merged.add(key[0], key[1], file.content())
                    except BinaryDamaged:
                        continue
                elif have is None or (have.here and not file.here and have.sha256 == file.sha256):
                    merged.files[key] = file
        return merged

    def _unchanged(self, builds: dict[str, dict[str, str]], files: dict[tuple[str, str], CarriedFile]) -> bool:
        """Whether these are still ``builds`` and the very ``files`` (the same objects) they were read as."""
        return self.builds == builds and len(self.files) == len(files) and all(
            self.files.get(key) is file for key, file in files.items())

    def packed(self) -> tuple[Callable[[], Iterator[bytes]], dict[str, Any]]:
        """The section a bundle stores, a file at a time as stored (read once to check it, once to write it), and
        its manifest section (without offset); the section these were read from, as it is, where nothing changed
        since. Raises :class:`BinaryDamaged` where a file cannot be read."""
        if self._as_read is not None and self._unchanged(*self._as_read[0]):
            return self._as_read[1], self._as_read[2]
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


def check_section(section: Any) -> None:
    """Raise :class:`TypeError` unless ``section`` is a well-formed binaries manifest section."""
    if not isinstance(section, dict):
        raise TypeError("binaries must be an object")
    for name in ("offset", "size"):
        if not isinstance(section.get(name), int) or isinstance(section.get(name), bool) or section[name] < 0:
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
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in item[3:])):
            raise TypeError("binaries.files entries must be [build, path, sha256, size, stored size]")
        if item[0] not in builds:
            raise TypeError(f"binaries.files names an unknown build {item[0]!r}")
        total += item[4]
    if total != section["size"]:
        raise TypeError("binaries.files do not add up to binaries.size")


class _File(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def sha256(self) -> str: ...

    @property
    def size(self) -> int: ...


def _probes(files: Iterable[_File], probe_sources: Collection[str]) -> set[str]:
    """The binaries (paths) among ``files`` built from one of ``probe_sources``, told by their sources' checksums."""
    texts = {hashlib.sha256(source.encode()).hexdigest() for source in probe_sources}
    listed = list(files)
    sources = {f.path.rsplit(".", 1)[0] for f in listed if f.path.endswith(".cpp") and f.sha256 in texts}
    return {f.path for f in listed if layout.is_cpp(f.path) and f.path.rsplit(".", 1)[0] in sources}


def _cpp_counts(files: Iterable[_File], probe_sources: Collection[str]) -> dict[str, int]:
    listed = list(files)
    probes = _probes(listed, probe_sources)
    kernels = [f for f in listed if layout.is_cpp(f.path) and f.path not in probes]
    apart = {"probes": len(probes)} if probes else {}
    return {"count": len(kernels), "bytes": sum(f.size for f in kernels), **apart}


def _triton_counts(files: Iterable[_File]) -> dict[str, int]:
    triton = [f for f in files if f.path.startswith(layout.TRITON + "/")]
    kernels = {f.path.rsplit("/", 1)[0] for f in triton if layout.is_group_file(f.path.rsplit("/", 1)[1])}
    return {"count": len(kernels), "bytes": sum(f.size for f in triton)}


class BinaryDamaged(Exception):
    """A carried file cannot be used; the message names it and says why."""


@dataclass(frozen=True)
class Listed:
    """One carried file as its bundle lists it; ``at``: where its stored (compressed) bytes start in the section."""

    build: str
    path: str
    sha256: str
    size: int
    stored: int
    at: int


class CarriedListing:
    """The binaries a bundle entry carries, listed at once, each read and checked when asked for (the listing, with
    every file's checksum, is what an entry's signature covers)."""

    def __init__(self, builds: dict[str, dict[str, str]], files: dict[tuple[str, str], Listed],
                 problems: list[str], fetch: Callable[[Listed], bytes | None],
                 close: Callable[[], None] = no_file, raw: Callable[[int, int], bytes] | None = None) -> None:
        #: The build identities named by their build ids, and the files of those builds with usable names.
        self.builds, self.files = builds, files
        #: One per build or file left out at once (a forged build id, a name outside torch's cache layout).
        self.problems = problems
        self._fetch, self._close, self._raw = fetch, close, raw

    @classmethod
    def of_section(cls, section: Mapping[str, Any], fetch: Callable[[int, int], bytes],
                   close: Callable[[], None] = no_file) -> "CarriedListing":
        """The files a checked manifest section lists, their bytes read by ``fetch(at, size)`` from the section."""
        forged = {b for b, i in section["builds"].items() if build_id(i) != b}
        builds = {b: dict(i) for b, i in section["builds"].items() if b not in forged}
        problems = [f"carried binaries of build {b} do not match its build identity; not used" for b in sorted(forged)]
        files, at = {}, 0
        for build, path, sha, size, stored in section["files"]:
            if build not in forged and not layout.valid_path(path):
                problems.append(f"carried binary {path!r} has a name outside torch's cache layout; not used")
            elif build not in forged:
                files[(build, path)] = Listed(build, path, sha, size, stored, at)
            at += stored

        def read(listed: Listed) -> bytes | None:
            chunk = fetch(listed.at, listed.stored)
            return _inflated(chunk, listed.size, listed.sha256) if len(chunk) == listed.stored else None

        return cls(builds, files, problems, read, close, fetch)

    def as_stored(self, section: Mapping[str, Any]) -> "CarriedBinaries":
        """The listed files of ``section`` (the section they were listed from) as :class:`CarriedBinaries` read by
        range as stored, unchecked (for a bundle to copy: the section's checksum vouches for them); while they stay
        as listed, a bundle copies the section as it is (files this version leaves out included)."""
        raw = self._raw
        assert raw is not None, "a listing of a bundle's section"
        files = {key: CarriedFile.in_bundle(f, raw) for key, f in self.files.items()}
        size = section["size"]

        def chunks() -> Iterator[bytes]:
            for at in range(0, size, _CHUNK):
                try:
                    chunk = raw(at, min(_CHUNK, size - at))
                except OSError as exc:
                    raise BinaryDamaged(f"the carried binaries cannot be read: {exc.strerror or exc}") from None
                if len(chunk) != min(_CHUNK, size - at):
                    raise BinaryDamaged("the carried binaries are cut short")
                yield chunk

        as_read = {k: v for k, v in section.items() if k != "offset"}
        carried = CarriedBinaries(dict(self.builds), files)
        carried._as_read = ((dict(self.builds), dict(files)), chunks, as_read)
        return carried

    @classmethod
    def of(cls, carried: "CarriedBinaries") -> "CarriedListing":
        """A listing of binaries in memory (made in this process, or read and checked whole)."""
        files = {key: Listed(f.build, f.path, f.sha256, f.size, f.size, 0) for key, f in carried.files.items()}
        return cls(dict(carried.builds), files, [],
                   lambda listed: carried.files[(listed.build, listed.path)].content())

    def fitting(self, build: str) -> dict[str, Listed]:
        """``{path: file}`` of the files of ``build`` (the binaries that fit a machine of that build identity)."""
        return {path: listed for (b, path), listed in self.files.items() if b == build}

    def read(self, listed: Listed) -> bytes:
        """A file's content, checked against its checksum; raises :class:`BinaryDamaged`."""
        try:
            data = self._fetch(listed)
        except OSError as exc:
            raise BinaryDamaged(f"carried binary {listed.path} cannot be read: {exc.strerror or exc}; not used") \
                from None
        if data is None:
            raise BinaryDamaged(f"carried binary {listed.path} fails its checksum; not used")
        return data

    def counts(self, probe_sources: Collection[str] = ()) -> dict[str, int]:
        """``{"count": C++ binaries, "bytes": their size}`` as listed, with the CPU probes apart."""
        return _cpp_counts(self.files.values(), probe_sources)

    def probes(self, probe_sources: Collection[str]) -> set[str]:
        """The listed binaries (paths) built from one of ``probe_sources``: torch's CPU probes, no test's kernel."""
        return _probes(self.files.values(), probe_sources)

    def triton_counts(self) -> dict[str, int]:
        """``{"count": Triton kernels, "bytes": size of all Triton files}`` (its compiled modules are no kernels)."""
        return _triton_counts(self.files.values())

    def close(self) -> None:
        """Let go of the file the binaries are read from."""
        self._close()


def _inflated(chunk: bytes, size: int, sha: str) -> bytes | None:
    """``chunk`` inflated, where that gives ``size`` bytes with checksum ``sha`` (never inflating past ``size``)."""
    try:
        data = zlib.decompressobj().decompress(chunk, min(size, sys.maxsize - 1) + 1)
    except zlib.error:
        return None
    return data if len(data) == size and hashlib.sha256(data).hexdigest() == sha else None


def identity_differences(carried: Mapping[str, str], here: Mapping[str, str]) -> str:
    """Which fields of two build identities differ, in words."""
    keys = list(here) + [k for k in carried if k not in here]
    diffs = [f"{k}: {carried.get(k, '(absent)')} there, {here.get(k, '(absent)')} here"
             for k in keys if carried.get(k) != here.get(k)]
    return "; ".join(diffs) or "identical"
