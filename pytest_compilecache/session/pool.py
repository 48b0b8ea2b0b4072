"""The session's on-disk pool of compiled binaries, one folder per build identity, shared by its processes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Collection, Iterable, Mapping

from filelock import FileLock

from .. import files
from ..caught import caught
from .._torchapi import layout
from ..bundle.binaries import CarriedBinaries, CarriedFile, build_id


def _place(source: Path, dest: Path) -> bool:
    """Put ``source`` at ``dest`` whole (a Triton group file rewritten for its folder); False where it is there."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not layout.is_group_file(dest.name):
        return files.place_file(str(source), str(dest))
    if dest.exists():
        return False
    files.write_atomic(dest, layout.relocated_group(source.read_bytes(), dest.parent), fsync=False)
    return True


class BinaryPool:
    """The binaries of one build identity built or loaded in a session, shared by its processes, written once each."""

    def __init__(self, root: Path, identity: Mapping[str, str]) -> None:
        self.identity = dict(identity)
        self.build = build_id(identity)
        self.path = Path(root) / self.build
        self._seeded: dict[Path, str] = {}
        if not (self.path / "identity.json").exists():
            self.path.mkdir(parents=True, exist_ok=True)
            files.write_atomic(self.path / "identity.json", json.dumps(self.identity, sort_keys=True).encode(),
                               fsync=False)
            self._changed()

    def _changed(self) -> None:
        """A new token in the file ``version``: any process that adds to or drops from the pool writes one."""
        files.write_atomic(self.path / "version", uuid.uuid4().hex.encode(), fsync=False)

    def add_from(self, folder: Path, since: float = 0.0, leaving_out: Collection[str] = ()) -> int:
        """Take every binary of a cache folder the pool lacks (timings merged), not older than ``since`` nor in
        ``leaving_out``; how many."""
        taken = 0
        try:
            for rel, file in layout.in_order(layout.find_binaries(folder, since)):
                dest = self.path / rel
                try:
                    if (since and file.stat().st_mtime < since) or rel in leaving_out:
                        continue
                    if layout.is_timings(rel):
                        taken += self._merge(rel, file.read_bytes())
                    elif _place(file, dest):
                        taken += 1
                    elif layout.is_triton_module(rel) and file.read_bytes() != dest.read_bytes():
                        files.write_atomic(dest, file.read_bytes(), fsync=False)  # rebuilt: the pooled one failed
                        taken += 1
                except OSError as exc:  # left out of the pool: torch builds it again where asked
                    caught("pooling a compiled file", exc)
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
            files.write_atomic(dest, new, fsync=False)
        return True

    def add_all(self, items: Iterable[tuple[str, bytes]],
                loaded: float | None = None) -> tuple[list[str], list[tuple[str, OSError]]]:
        """Add each ``(rel, bytes)`` the pool lacks (timings merged); the paths added, and those that could not be.
        With ``loaded`` (placed as torch asks), that is their file time and the version stays (no seed rescans)."""
        added, failed = [], []
        try:
            for rel, data in items:
                dest = self.path / rel
                try:
                    if layout.is_timings(rel) and loaded is None:
                        if self._merge(rel, data):
                            added.append(rel)
                    elif not dest.exists():
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        files.write_atomic(dest, data, fsync=False, mtime=loaded)
                        added.append(rel)
                except OSError as exc:
                    failed.append((rel, exc))
        finally:
            if added and loaded is None:
                self._changed()
        return added, failed

    def put(self, folder: Path, paths: Iterable[str]) -> int:
        """Link these pooled files into a cache folder where missing (timings merged); how many were placed."""
        placed = 0
        for rel in paths:
            file, dest = self.path / rel, Path(folder) / rel
            try:
                if layout.is_timings(rel) and dest.exists():
                    files.write_atomic(dest, layout.merge_timings(dest.read_bytes(), file.read_bytes()), fsync=False)
                    placed += 1
                else:
                    placed += _place(file, dest)
            except OSError as exc:  # left to torch to build
                caught("placing a pooled compiled file", exc)
        return placed

    def drop(self, names: Iterable[str], seeded: Path) -> None:
        """Remove the files with these names (binaries that failed to load) from the pool and a folder it seeded."""
        wanted = set(names)
        for folder in (self.path, seeded):
            for rel, file in layout.find_binaries(folder).items():
                if rel.rsplit("/", 1)[-1] in wanted:
                    file.unlink(missing_ok=True)
        self._changed()

    def seed(self, folder: Path) -> int:
        """Link every pooled binary into a cache folder where missing (timings merged), once per pool change."""
        folder = Path(folder)
        try:
            version = (self.path / "version").read_text()
        except OSError:
            version = ""
        if version and self._seeded.get(folder) == version:
            return 0
        placed = self.put(folder, [rel for rel, _ in layout.in_order(layout.find_binaries(self.path))])
        self._seeded[folder] = version
        return placed


def pooled(root: Path) -> CarriedBinaries:
    """Everything the pools under ``root`` hold (every build) for a bundle; an unreadable file left out, said."""
    carried = CarriedBinaries()
    try:
        builds = sorted(d for d in Path(root).iterdir() if d.is_dir())
    except OSError:
        return carried
    for folder in builds:
        try:
            identity = json.loads((folder / "identity.json").read_text())
        except (OSError, ValueError) as exc:
            caught("reading a pooled build's identity", exc)
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
            except OSError as exc:
                carried.problems.append(f"pooled binary {file} cannot be read: {exc.strerror or exc}; not carried")
    return carried
