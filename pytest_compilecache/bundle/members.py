"""An entry's artifacts one by one: a table, then each artifact compressed alone, read when asked."""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator

#: zlib's fastest level: a bundle is written on every updating run, and read far more often than that.
_LEVEL = 1
_MAX_TABLE = 256 * 1024 * 1024
#: The type of a member holding a whole entry's Mega-Cache bytes: torch could not take them apart when written.
WHOLE = "megacache"


class MemberDamaged(Exception):
    """A member (or the table) cannot be used; the message says which artifact and why."""


@dataclass(frozen=True)
class Member:
    """One artifact of an entry: its Mega-Cache type and key, where its bytes lie and their checksum."""

    kind: str
    key: str
    #: From the first member's first byte; ``stored``: bytes there (compressed); ``size``: bytes of the artifact.
    offset: int
    stored: int
    size: int
    sha256: str

    def __str__(self) -> str:
        return f"{self.kind} artifact {self.key}"


def unpack_table(blob: bytes) -> list[Member]:
    """The members a table lists; raises :class:`MemberDamaged` when it is not one."""
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(blob, _MAX_TABLE)
        if inflater.unconsumed_tail:
            raise MemberDamaged("the table of artifacts is implausibly large")
        rows = json.loads(raw)
        table, offset = [], 0
        for kind, key, stored, size, sha in rows:
            if not all(isinstance(v, str) for v in (kind, key, sha)) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= low for v, low in ((stored, 1), (size, 0))):
                raise TypeError
            table.append(Member(kind, key, offset, stored, size, sha))
            offset += stored
    except (zlib.error, ValueError, TypeError, RecursionError):
        raise MemberDamaged("the table of artifacts is malformed") from None
    return table


def no_file() -> None:
    """What closing reads from memory does (nothing)."""


class Members:
    """The artifacts of one entry: listed at once, each read alone and checked before anyone sees a byte of it."""

    def __init__(self, table: list[Member], fetch: Callable[[int, int], bytes],
                 close: Callable[[], None] = no_file) -> None:
        self.table = table
        self._fetch, self._close = fetch, close
        self._by_key: dict[tuple[str, str], list[Member]] = {}
        for member in table:
            self._by_key.setdefault((member.kind, member.key), []).append(member)

    @classmethod
    def packed(cls, artifacts: Iterable[tuple[str, str, bytes]]) -> "Members":
        """Members of ``artifacts`` (type, key, content), each compressed now, in the order given."""
        table, blobs, offset = [], [], 0
        for kind, key, content in artifacts:
            blobs.append(zlib.compress(content, _LEVEL))
            table.append(Member(kind, key, offset, len(blobs[-1]), len(content), hashlib.sha256(content).hexdigest()))
            offset += len(blobs[-1])
        region = b"".join(blobs)
        return cls(table, lambda at, size: region[at:at + size])

    @classmethod
    def chosen(cls, picks: Iterable[tuple["Members", Member]]) -> "Members":
        """Members made of members of others (each compressed), in the order given, read from where they are."""
        table, sources, offset = [], {}, 0
        for members, member in picks:
            assert member.stored > 0
            table.append(replace(member, offset=offset))
            sources[offset] = (members, member)
            offset += member.stored
        return cls(table, lambda at, _: sources[at][0].raw(sources[at][1]))

    def table_blob(self) -> bytes:
        """The table as a bundle stores it."""
        rows = [[m.kind, m.key, m.stored, m.size, m.sha256] for m in self.table]
        return zlib.compress(json.dumps(rows, separators=(",", ":")).encode(), _LEVEL)

    def counts(self) -> dict[str, dict[str, int]]:
        """``{type: {"count": n, "bytes": n}}`` of the artifacts (as a manifest describes an entry)."""
        counts: dict[str, dict[str, int]] = {}
        for member in self.table:
            kind = counts.setdefault(member.kind, {"count": 0, "bytes": 0})
            kind["count"] += 1
            kind["bytes"] += member.size
        return counts

    @property
    def stored(self) -> int:
        """Bytes the members take in the file."""
        return sum(member.stored for member in self.table)

    def keyed(self, kind: str, key: str) -> list[Member]:
        """The members of type ``kind`` under ``key`` (several where torch keeps one per guard variant)."""
        return self._by_key.get((kind, key), [])

    def raw(self, member: Member) -> bytes:
        """The member's bytes as stored (compressed), not checked: copied as they are into another bundle."""
        return self._fetch(member.offset, member.stored)

    def read(self, member: Member) -> bytes:
        """The member's content, checked against its checksum; raises :class:`MemberDamaged`."""
        try:
            blob = self._fetch(member.offset, member.stored)
        except OSError as exc:
            raise MemberDamaged(f"{member} cannot be read: {exc.strerror or exc}") from None
        if len(blob) != member.stored:
            raise MemberDamaged(f"{member} is cut short")
        try:
            content = zlib.decompressobj().decompress(blob, member.size + 1)
        except zlib.error:
            raise MemberDamaged(f"{member} is corrupt (it does not inflate)") from None
        if len(content) != member.size or hashlib.sha256(content).hexdigest() != member.sha256:
            raise MemberDamaged(f"{member} fails its checksum")
        return content

    def contents(self, members: Iterable[Member] | None = None) -> Iterator[tuple[str, str, bytes]]:
        """(type, key, content) of ``members`` (all of them by default), each checked."""
        for member in self.table if members is None else members:
            yield member.kind, member.key, self.read(member)

    def close(self) -> None:
        """Let go of the file the members are read from."""
        self._close()
