"""An entry's artifacts one by one (``members.py``): the table, each artifact compressed alone, checked when read."""

from __future__ import annotations

import hashlib
import json
import tracemalloc
import zlib
from typing import Callable

import pytest

from pytest_compilecache.bundle import members as members_module
from pytest_compilecache.bundle.members import Member, MemberDamaged, Members, unpack_table

ARTIFACTS = [
    ("inductor", "f" + "1" * 30, b"graph " * 100),
    ("aot_autograd", "a" + "2" * 30, b"aot " * 60),
    ("inductor", "f" + "1" * 30, b"a guard variant"),
    ("pgo", "state", b""),
]


def test_the_table_round_trips_every_member() -> None:
    """``table_blob`` then ``unpack_table`` gives back each member: type, key, place, sizes and checksum."""
    packed = Members.packed(ARTIFACTS)
    assert unpack_table(packed.table_blob()) == packed.table
    assert [m.sha256 for m in packed.table] == [hashlib.sha256(c).hexdigest() for _, _, c in ARTIFACTS]


def test_members_lie_back_to_back_in_the_order_given() -> None:
    """Each member starts where the one before it ends; ``stored`` is their sum."""
    packed = Members.packed(ARTIFACTS)
    offsets = [m.offset for m in packed.table]
    assert offsets == [sum(m.stored for m in packed.table[:i]) for i in range(len(ARTIFACTS))]
    assert packed.stored == sum(m.stored for m in packed.table) > 0


def test_counts_sum_artifacts_by_type() -> None:
    """``counts`` is what the manifest says of an entry: per type, how many artifacts and their bytes."""
    assert Members.packed(ARTIFACTS).counts() == {"inductor": {"count": 2, "bytes": 615},
                                                  "aot_autograd": {"count": 1, "bytes": 240},
                                                  "pgo": {"count": 1, "bytes": 0}}


def test_chosen_members_read_from_where_they_are() -> None:
    """``Members.chosen`` picks members of two sources into one entry, placed anew, each read from its source."""
    one, two = Members.packed(ARTIFACTS[:2]), Members.packed([("autotune", "k", b"{}")])
    picked = Members.chosen([(two, two.table[0]), (one, one.table[1])])
    assert [m.offset for m in picked.table] == [0, two.table[0].stored]
    assert list(picked.contents()) == [("autotune", "k", b"{}"), ARTIFACTS[1]]
    assert picked.raw(picked.table[1]) == one.raw(one.table[1])


CONTENT = b"the real content"
GOOD = zlib.compress(CONTENT)
SHA = hashlib.sha256(CONTENT).hexdigest()


def stored_as(blob: bytes, size: int = len(CONTENT), sha: str = SHA, listed: int | None = None) -> tuple[Members,
                                                                                                       Member]:
    """Members whose one member's bytes as stored are ``blob`` (``listed`` bytes, says the table; by default all of
    them), said to inflate to ``size`` bytes of checksum ``sha``."""
    member = Member("inductor", "fkey", 0, len(blob) if listed is None else listed, size, sha)
    return Members([member], lambda at, n: blob[at:at + n]), member


def unreadable() -> tuple[Members, Member]:
    def refuse(at: int, n: int) -> bytes:
        raise OSError(5, "Input/output error")

    member = Member("inductor", "fkey", 0, len(GOOD), len(CONTENT), SHA)
    return Members([member], refuse), member


@pytest.mark.parametrize(("damaged", "reason"), [
    (lambda: stored_as(GOOD[:-2], listed=len(GOOD)), "is cut short"),
    (lambda: stored_as(b"not zlib!"), "is corrupt (it does not inflate)"),
    (lambda: stored_as(GOOD, sha="0" * 64), "fails its checksum"),
    (lambda: stored_as(GOOD, size=len(CONTENT) - 1), "fails its checksum"),
    (unreadable, "cannot be read: Input/output error"),
], ids=["cut short", "not zlib", "wrong checksum", "wrong size", "unreadable"])
def test_a_damaged_member_is_refused_naming_it(damaged: Callable[[], tuple[Members, Member]], reason: str) -> None:
    """Reading checks each member: its length as stored, that it inflates, its size and checksum; the error names
    the artifact's type and key."""
    members, member = damaged()
    with pytest.raises(MemberDamaged) as exc:
        members.read(member)
    assert str(exc.value) == f"inductor artifact fkey {reason}"


def test_a_member_that_inflates_past_its_size_is_not_inflated() -> None:
    """A member saying 10 bytes whose stored form inflates to 50 MB: refused after reading at most 11 bytes out."""
    bomb = zlib.compress(b"\0" * 50_000_000, 9)
    members, member = stored_as(bomb, 10, "0" * 64)
    tracemalloc.start()
    try:
        with pytest.raises(MemberDamaged, match="fails its checksum"):
            members.read(member)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000, f"{peak} bytes allocated to check a 10-byte member"


def table(rows: object) -> bytes:
    return zlib.compress(json.dumps(rows).encode())


@pytest.mark.parametrize("blob", [
    b"not zlib", zlib.compress(b"not json"), table({"a": 1}), table([["inductor", "k", 1, 1]]),
    table([["inductor", "k", 0, 1, "s"]]), table([["inductor", "k", 1, -1, "s"]]),
    table([["inductor", 7, 1, 1, "s"]]), table([["inductor", "k", 1.0, 1, "s"]]),
    table([["inductor", "k", 1, 1, "s"]])[:12],
], ids=["not zlib", "not json", "object", "short row", "nothing stored", "negative size", "key a number",
        "stored a float", "cut short"])
def test_unpack_table_refuses_what_is_not_a_table(blob: bytes) -> None:
    """A table that does not inflate, is not JSON rows, or holds a row of the wrong shape or types is refused."""
    with pytest.raises(MemberDamaged, match="^the table of artifacts is malformed$"):
        unpack_table(blob)


def test_a_table_past_its_cap_is_not_inflated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table inflating past the cap (256 MB; made small here) is refused as implausibly large."""
    monkeypatch.setattr(members_module, "_MAX_TABLE", 64)
    with pytest.raises(MemberDamaged, match="implausibly large"):
        unpack_table(Members.packed(ARTIFACTS).table_blob())


def test_contents_of_some_members_reads_only_those() -> None:
    """``contents(members)`` reads the given members only: the others may be damaged."""
    good = Members.packed(ARTIFACTS[:2])
    reads: list[int] = []
    fetch: Callable[[int, int], bytes] = good._fetch

    def counting(at: int, n: int) -> bytes:
        reads.append(at)
        return fetch(at, n)

    watched = Members(good.table, counting)
    assert list(watched.contents([good.table[1]])) == [ARTIFACTS[1]]
    assert reads == [good.table[1].offset]
