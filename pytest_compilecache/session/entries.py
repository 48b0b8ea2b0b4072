"""A loaded entry's artifacts handed to torch's cache folder as torch asks for them; a damaged one is said once."""

from __future__ import annotations

from typing import Collection, Iterable

from ..bundle.members import WHOLE, Member, MemberDamaged, Members
from ..report.model import Concern, Problem, ProcessReport


class EntryOnDemand:
    """The :class:`~pytest_compilecache._torchapi.ondemand.EntrySource` of one bundle entry, counted in ``report``."""

    def __init__(self, members: Members, name: str, report: ProcessReport) -> None:
        self.members, self.name, self.report = members, name, report
        self._damaged: list[str] = []
        #: Where in ``report.problems`` the damaged artifacts are said (once for all of them).
        self._said: int | None = None

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
