"""Signed bundle entries (``signing.py`` and where the writer and merge use it): an HMAC-SHA256 over an entry's
manifest fields, keyed from ``PYTEST_COMPILE_CACHE_KEY``; a write vouches only for what it checked."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest

from pytest_compilecache.bundle import signing
from pytest_compilecache.bundle.format import Bundle, BundleError, Entry, entry_of, members_of, read_manifest
from pytest_compilecache.bundle.keyindex import KeyIndex
from pytest_compilecache.bundle.members import Members
from pytest_compilecache.bundle.merge import combine, merge_input
from pytest_compilecache.bundle.writing import write_bundle

KEY, OTHER = b"the CI secret", b"a guess"
CPU = {"torch": "2.13.0+cpu", "device": "cpu"}
GPU = {"torch": "2.13.0+cu128", "device": "NVIDIA H200"}
FX1 = ("inductor", "f" + "1" * 30, b"graph one")
FX2 = ("inductor", "f" + "2" * 30, b"graph two")

DESCRIBED: dict[str, Any] = {
    "env": CPU, "created": 1.0, "updated": 2.0, "size": 10, "sha256": "ab" * 32, "stored": 20, "offset": 0,
    "artifacts": {"inductor": {"count": 1, "bytes": 9}}, "history": {"run": 1.0},
    "index": {"offset": 30, "size": 5, "sha256": "cd" * 32},
}
BINARIES: dict[str, Any] = {"offset": 35, "size": 4, "sha256": "ef" * 32, "builds": {"b": {"compiler": "g++"}},
                            "files": [["b", "ab/c.so", "01" * 32, 9, 4]]}


@pytest.fixture
def with_key(monkeypatch: pytest.MonkeyPatch) -> bytes:
    """The signing key set, as in a trusted CI workflow."""
    monkeypatch.setenv(signing.KEY_ENV, KEY.decode())
    return KEY


def entry(env: dict[str, str], *artifacts: tuple[str, str, bytes]) -> Entry:
    return entry_of(env, Members.packed(artifacts or (FX1,)))


def test_a_signature_verifies_with_its_key_only() -> None:
    """``check``: ``""`` with the key it was made with, :data:`MISMATCH` with another, :data:`UNSIGNED` without one."""
    signature = signing.sign(DESCRIBED, BINARIES, KEY)
    assert signing.check(DESCRIBED, BINARIES, signature, KEY) == ""
    assert signing.check(DESCRIBED, BINARIES, signature, OTHER) == signing.MISMATCH == "signature does not match"
    assert signing.check(DESCRIBED, BINARIES, "", KEY) == signing.UNSIGNED == "unsigned"


def test_offsets_are_not_signed() -> None:
    """Moving an entry in its file (its offsets, the index's and the binaries') keeps its signature valid."""
    signature = signing.sign(DESCRIBED, BINARIES, KEY)
    moved = {**DESCRIBED, "offset": 999, "index": {**DESCRIBED["index"], "offset": 1234}}
    assert signing.check(moved, {**BINARIES, "offset": 5678}, signature, KEY) == ""


CHANGES: dict[str, Callable[[dict[str, Any], dict[str, Any]], None]] = {
    "env": lambda d, b: d["env"].update(device="cuda"),
    "created": lambda d, b: d.update(created=1.5),
    "sha256 of the table": lambda d, b: d.update(sha256="00" * 32),
    "stored": lambda d, b: d.update(stored=21),
    "artifact counts": lambda d, b: d["artifacts"]["inductor"].update(count=2),
    "history": lambda d, b: d["history"].update(run=2.0),
    "key index checksum": lambda d, b: d["index"].update(sha256="00" * 32),
    "carried file checksum": lambda d, b: b["files"][0].__setitem__(2, "00" * 32),
    "build identity": lambda d, b: b["builds"]["b"].update(compiler="clang"),
}


@pytest.mark.parametrize("field", list(CHANGES))
def test_any_signed_field_changed_breaks_the_signature(field: str) -> None:
    """Every field the signature covers is covered: change one and the signature no longer matches."""
    signature = signing.sign(DESCRIBED, BINARIES, KEY)
    described, binaries = copy.deepcopy(DESCRIBED), copy.deepcopy(BINARIES)
    CHANGES[field](described, binaries)
    assert signing.check(described, binaries, signature, KEY) == signing.MISMATCH


@pytest.mark.parametrize("signature", ["\ud800é", "ü" * 64, "0" * 64])
def test_a_forged_signature_is_a_mismatch_never_an_error(signature: str) -> None:
    """A signature of any text (non-ASCII, a lone surrogate) is compared, and does not match."""
    assert signing.check(DESCRIBED, BINARIES, signature, KEY) == signing.MISMATCH


@pytest.mark.parametrize(("value", "expected"), [(None, None), ("", None), ("s3cret", b"s3cret")])
def test_the_key_comes_from_the_environment_and_empty_is_none(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                                              expected: bytes | None) -> None:
    """``key()``: unset or empty is no key."""
    if value is None:
        monkeypatch.delenv(signing.KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(signing.KEY_ENV, value)
    assert signing.key() == expected


def test_a_bundle_written_with_the_key_verifies_and_fails_with_another(tmp_path: Path, with_key: bytes) -> None:
    """Entries made here are signed when written with the key; read back, they verify with it, and with another
    key the problem names the file, the entry, the reason and the variable."""
    path = tmp_path / "b.bundle"
    write_bundle(Bundle(path, [entry(CPU), entry(GPU, FX2)]))
    with read_manifest(path) as bundle:
        assert all(e.signature for e in bundle.entries)
        assert [bundle.signature_problem(e, with_key) for e in bundle.entries] == ["", ""]
        problem = bundle.signature_problem(bundle.entries[1], OTHER)
    assert problem == (f"{path}: the entry for torch 2.13.0+cu128 on NVIDIA H200: signature does not match "
                       f"({signing.KEY_ENV} is set); it is not used")


def test_an_unsigned_bundle_is_not_used_with_the_key_and_used_without(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundle written without the key carries no signature: with the key, its entry is refused as ``unsigned``
    (naming the file); without it, nothing is checked and its artifacts read as ever."""
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    path = tmp_path / "b.bundle"
    write_bundle(Bundle(path, [entry(CPU)]))
    with read_manifest(path) as bundle:
        e = bundle.entries[0]
        assert e.signature == ""
        assert list(bundle.members(e).contents()) == [FX1]
        assert bundle.signature_problem(e, KEY) == (f"{path}: the entry for torch 2.13.0+cpu on cpu: unsigned "
                                                    f"({signing.KEY_ENV} is set); it is not used")


def test_rewriting_a_signed_bundle_without_the_key_keeps_its_signatures(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry copied by a write without the key (moved behind another entry) keeps a valid signature."""
    monkeypatch.setenv(signing.KEY_ENV, KEY.decode())
    index = KeyIndex()
    index.note_run(1.0, ["inductor/" + FX1[1]])
    signed = tmp_path / "signed.bundle"
    write_bundle(Bundle(signed, [entry_of(CPU, Members.packed([FX1]), index=index)]))
    monkeypatch.delenv(signing.KEY_ENV)
    moved = tmp_path / "moved.bundle"
    with read_manifest(signed) as bundle:
        bundle.read_all()  # another Bundle writes them: their sections must be read through this one first
        write_bundle(Bundle(moved, [entry(GPU, FX2), *bundle.entries]))
    with read_manifest(moved) as bundle:
        assert bundle.entries[1].offset > 0 and bundle.entries[0].signature == ""
        assert bundle.signature_problem(bundle.entries[1], KEY) == ""


@pytest.mark.parametrize("signature", ["", "0" * 64], ids=["unsigned", "bad signature"])
def test_a_write_with_the_key_never_signs_what_it_did_not_check(tmp_path: Path, with_key: bytes,
                                                                 signature: str) -> None:
    """An entry read from a file unsigned, or with a bad signature, is not signed by rewriting it with the key."""
    path = tmp_path / "b.bundle"
    write_bundle(Bundle(path, [entry(CPU)]))
    with read_manifest(path) as bundle:
        bundle.entries[0].signature = signature
        bundle.path = tmp_path / "again.bundle"
        write_bundle(bundle)
    with read_manifest(tmp_path / "again.bundle") as again:
        assert again.entries[0].signature == signature
        assert again.signature_problem(again.entries[0], with_key).endswith("it is not used")


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_a_smaller_entry_is_signed_anew_only_where_it_was_signed_validly(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          signed: bool) -> None:
    """An entry with an artifact taken out (as ``prune`` does) is signed by a write with the key when the entry it
    came from was validly signed, and stays unsigned when it was not."""
    if signed:
        monkeypatch.setenv(signing.KEY_ENV, KEY.decode())
    else:
        monkeypatch.delenv(signing.KEY_ENV, raising=False)
    path = tmp_path / "b.bundle"
    write_bundle(Bundle(path, [entry(CPU, FX1, FX2)]))
    monkeypatch.setenv(signing.KEY_ENV, KEY.decode())
    with read_manifest(path) as bundle:
        e = bundle.entries[0]
        members = bundle.members(e)
        smaller = e.with_members(Members.chosen((members, m) for m in members.table[:1]), None)
        write_bundle(Bundle(tmp_path / "smaller.bundle", [smaller]))
    with read_manifest(tmp_path / "smaller.bundle") as read:
        assert list(read.members(read.entries[0]).contents()) == [FX1]
        assert (read.signature_problem(read.entries[0], KEY) == "") is signed


def test_a_pack_is_sealed_with_the_key(tmp_path: Path, with_key: bytes) -> None:
    """A pack's list of the packs it replaces and its time are written with a seal the key verifies."""
    path = tmp_path / "pack.bundle"
    write_bundle(Bundle(path, [entry(CPU)], supersedes=("pack-1", "pack-2"), written=1795513623.5))
    with read_manifest(path) as bundle:
        assert bundle.supersedes == ("pack-1", "pack-2") and bundle.written == 1795513623.5
        assert bundle.seal == signing.seal(["pack-1", "pack-2"], 1795513623.5, with_key)
        assert bundle.seal != signing.seal(["pack-1"], 1795513623.5, with_key)


def test_merge_refuses_an_unsigned_input_with_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the key set, ``merge`` refuses an input entry without a valid signature, naming the file."""
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    path = tmp_path / "unsigned.bundle"
    write_bundle(Bundle(path, [entry(CPU)]))
    monkeypatch.setenv(signing.KEY_ENV, KEY.decode())
    with read_manifest(path) as bundle:
        with pytest.raises(BundleError) as exc:
            merge_input(bundle)
    assert str(exc.value) == (f"{path}: the entry for torch 2.13.0+cpu on cpu: unsigned ({signing.KEY_ENV} is set); "
                              "it is not used; merge refuses it")


def test_an_updating_write_drops_an_unvouched_entry_of_its_machine(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With the key, an unsigned stored entry is not merged into the signed one a session adds: it is dropped and
    the drop is said; the entry written is signed."""
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    path = tmp_path / "b.bundle"
    write_bundle(Bundle(path, [entry(CPU, FX1)]))
    monkeypatch.setenv(signing.KEY_ENV, KEY.decode())
    with read_manifest(path) as current:
        current.read_all()
        result = combine(current, [entry(CPU, FX2)], run=5.0)
        (kept,) = result.entries
        assert set(members_of(kept, "test").contents()) == {FX2}
        assert result.dropped == ("dropped a bundle entry for torch 2.13.0+cpu on cpu: unsigned "
                                  f"({signing.KEY_ENV} is set); it was not merged into the signed one",)
        write_bundle(Bundle(tmp_path / "out.bundle", result.entries))
    with read_manifest(tmp_path / "out.bundle") as out:
        assert out.signature_problem(out.entries[0], KEY) == ""
