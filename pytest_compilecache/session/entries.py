"""A loaded entry's artifacts and carried binaries handed to torch's cache folder as torch asks for them; a damaged
artifact is said once for all, a damaged binary once each."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Collection, Iterable, Iterator, Mapping

from .. import misses
from .._torchapi.layout import in_order, is_cpp
from ..bundle.binaries import BinaryDamaged, CarriedFile
from ..bundle.members import WHOLE, Member, MemberDamaged, Members
from ..report.model import Concern, Problem, ProcessReport
from .pool import BinaryPool


class EntryOnDemand:
    """The :class:`~pytest_compilecache._torchapi.ondemand.EntrySource` of one bundle entry, counted in ``report``."""

    def __init__(self, members: Members, name: str, report: ProcessReport) -> None:
        self.members, self.name, self.report = members, name, report
        self._damaged: list[str] = []
        #: Where in ``report.problems`` the damaged artifacts are said (once for all of them).
        self._said: int | None = None
        #: The carried binaries put in place when torch asks for their two-character folder, by folder.
        self._pool: BinaryPool | None = None
        self._folders: dict[str, list[tuple[str, CarriedFile]]] = {}
        #: When the binaries were loaded: the time of those written later (they are loaded, not built, then).
        self._loaded = 0.0
        self._probes: set[str] = set()

    def up_front(self, later: Collection[str]) -> list[tuple[str, str, bytes]]:
        """(type, key, content) of the artifacts whose types are not in ``later``, each checked (a damaged one is
        left out, but a :data:`WHOLE` one, the entry itself, raises :class:`MemberDamaged`)."""
        return [(m.kind, m.key, content) for m in self.members.table if m.kind not in later
                for content in ([self.members.read(m)] if m.kind == WHOLE else self._read(m))]

    def contents(self, kind: str, key: str) -> list[bytes]:
        found = [content for member in self.members.keyed(kind, key) for content in self._read(member)]
        self.report.placed[kind] = self.report.placed.get(kind, 0) + len(found)
        self.report.placed_bytes += sum(map(len, found))
        return found

    def _read(self, member: Member) -> list[bytes]:
        try:
            return [self.members.read(member)]
        except MemberDamaged as exc:
            self._damaged.append(str(exc))
            misses.left_out_damaged(member.key, f"{self.name}: {exc}")
        more = f" ({len(self._damaged) - 1} more of its artifacts are damaged too)" if len(self._damaged) > 1 else ""
        said = Problem(Concern.BUNDLE, f"{self.name}: {self._damaged[0]}{more}; it is left out, and torch compiles "
                                       "what it held", self.name)
        if self._said is None:
            self._said = len(self.report.problems)
            self.report.problems.append(said)
        else:
            self.report.problems[self._said] = said
        return []

    def keys(self) -> Iterable[tuple[str, str]]:
        return dict.fromkeys((member.kind, member.key) for member in self.members.table)

    def carry(self, later: Mapping[str, CarriedFile], pool: BinaryPool, probes: Collection[str] = ()) -> None:
        """Put the carried binaries ``later`` into ``pool`` and a template when torch asks for their folder;
        ``probes``: those that are torch's CPU probes (counted apart: no test's kernel)."""
        if not later:
            return
        self._pool, self._loaded, self._probes = pool, time.time(), set(probes)
        for path, listed in in_order(later):  # by two-character folder, or Triton's folder of one kernel
            folder = "/".join(path.split("/", 2)[:2]) if path.startswith("triton/") else path.split("/", 1)[0]
            self._folders.setdefault(folder, []).append((path, listed))
        if kernels := sum(1 for path in later if is_cpp(path) and path not in self._probes):
            self.report.on_demand["cpp"] = kernels

    def checked_binaries(self, files: Iterable[tuple[str, CarriedFile]]) -> Iterator[tuple[str, bytes]]:
        """(path, content) of ``files``, each checked as it is read; a damaged one is said and left out."""
        for path, file in files:
            try:
                yield path, file.content()
            except BinaryDamaged as exc:
                self.report.problems.append(Problem(Concern.BINARY, f"{self.name}: {exc}", self.name))

    def place_folder(self, name: str, template: str) -> bool:
        wanted, pool = self._folders.get(name), self._pool
        if not wanted or pool is None:
            return True
        missing = [(path, listed) for path, listed in wanted if not (pool.path / path).exists()]
        written, failed = pool.add_all(self.checked_binaries(missing), self._loaded)
        for path, error in failed:
            self.report.problems.append(Problem(Concern.BINARY, f"{self.name}: carried binary {path} could not be "
                                                                f"pooled: {error}", self.name))
        pool.put(Path(template), [path for path, _ in wanted])
        sizes = {path: listed.size for path, listed in missing}
        self.report.placed_bytes += sum(sizes[path] for path in written if path not in self._probes)
        kernels = sum(1 for path, _ in wanted if is_cpp(path) and path not in self._probes)
        self.report.placed["cpp"] = self.report.placed.get("cpp", 0) + kernels
        return not failed

    def folders(self) -> Iterable[str]:
        return list(self._folders)

    def close(self) -> None:
        self.members.close()
