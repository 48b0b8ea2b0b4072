"""Damaged and hostile bundles, read in-process: each problem is refused (or costs only what it damaged), and its
message names the file and the reason, once, on one line."""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path
from typing import Any, Callable

import pytest

from pytest_compilecache.bundle.binaries import CarriedBinaries, build_id
from pytest_compilecache.bundle.format import (MAGIC, Bundle, BundleError, NotABundle, Unreadable, entry_of,
                                               read_manifest)
from pytest_compilecache.bundle.keyindex import KeyIndex
from pytest_compilecache.bundle.members import MemberDamaged, Members
from pytest_compilecache.bundle.writing import write_bundle

CPU = {"torch": "2.13.0+cpu", "device": "cpu", "python": "3.11"}
LABEL = "torch 2.13.0+cpu on cpu"
GRAPH = ("inductor", "f" + "1" * 30, b"an fx graph " * 30)
AOT = ("aot_autograd", "a" + "2" * 30, b"an aot entry " * 20)
IDENTITY = {"compiler": "g++ 12", "machine": "x86_64"}
BUILD = build_id(IDENTITY)
KERNEL = "ab/cabcdef.main.so"


def good_bundle(path: Path) -> Path:
    """One entry with two artifacts, a carried binary and a key index: every kind of section."""
    index = KeyIndex(torch="2.13")
    index.add(GRAPH[1], "inductor", "def f(x): ...", {"gm": ("h", "graph"), "inductor_config[x]": ("c", "1")})
    index.note_run(100.0, [f"inductor/{GRAPH[1]}"])
    carried = CarriedBinaries({BUILD: IDENTITY})
    carried.add(BUILD, KERNEL, b"\x7fELF kernel " * 20)
    write_bundle(Bundle(path, [entry_of(CPU, Members.packed([GRAPH, AOT]), binaries=carried, index=index)]))
    return path


def split(data: bytes) -> tuple[dict[str, Any], bytes]:
    """A bundle's manifest and everything after it (where offsets count from)."""
    length, _, rest = data[len(MAGIC):].partition(b"\n")
    manifest: dict[str, Any] = json.loads(rest[:int(length)])
    return manifest, rest[int(length):]


def join(manifest: dict[str, Any], body: bytes) -> bytes:
    text = json.dumps(manifest).encode()
    return MAGIC + b"%d\n" % len(text) + text + body


def changed(path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """The bundle at ``path`` with its manifest changed by ``change``, written back."""
    manifest, body = split(path.read_bytes())
    change(manifest)
    path.write_bytes(join(manifest, body))
    return path


def flipped(path: Path, where: Callable[[dict[str, Any]], int]) -> Path:
    """The bundle at ``path`` with one byte inverted, at ``where(entry's manifest)`` from the payload's start."""
    manifest, body = split(path.read_bytes())
    data = bytearray(body)
    data[where(manifest["entries"][0])] ^= 0xFF
    path.write_bytes(join(manifest, bytes(data)))
    return path


def assert_names(message: str, path: Path, reason: str) -> None:
    """The project's rule: the message starts with the file, names it once, says ``reason``, on one line."""
    assert message.startswith(f"{path}: ") and message.count(str(path)) == 1, message
    assert reason in message, message
    assert "\n" not in message, message


HEADERS = {
    "empty": (b"", BundleError, "empty file, not a bundle"),
    "another file": (b"model weights, say\n", NotABundle, "not a pytest-compilecache bundle (it does not start"),
    "web page": (b"<!DOCTYPE html><html><body>Sign in</body></html>", NotABundle, "it is a web page"),
    "no length": (MAGIC, BundleError, "corrupt: the manifest length is unreadable"),
    "length not digits": (MAGIC + b"12a\n{}", BundleError, "corrupt: the manifest length is unreadable"),
    "endless length line": (MAGIC + b"9" * 100, BundleError, "corrupt: the manifest length is unreadable"),
    "oversized length": (MAGIC + b"999999999999\n{}", BundleError, "corrupt: manifest length 999999999999 is "
                                                                  "implausible"),
    "manifest cut short": (MAGIC + b"100\n{\"format\": 2}", BundleError, "truncated: the manifest is cut short"),
    "not json": (MAGIC + b"5\n{{{{{", BundleError, "corrupt: the manifest is not valid JSON"),
    "not utf-8": (MAGIC + b"2\n\xff\xfe", BundleError, "corrupt: the manifest is not valid JSON"),
    "nested too deep": (MAGIC + b"200000\n" + b"[" * 200000, BundleError, "corrupt: the manifest is not valid JSON"),
    "no format": (MAGIC + b"15\n{\"entries\": []}", BundleError, "corrupt: the manifest has no format version"),
    "a list": (MAGIC + b"2\n[]", BundleError, "corrupt: the manifest has no format version"),
}


@pytest.mark.parametrize("case", list(HEADERS))
def test_a_damaged_header_is_refused_naming_the_file_and_why(tmp_path: Path, case: str) -> None:
    """Whatever is wrong before the entries (marker, length line, manifest JSON), reading stops with the right kind
    of error, naming the file and the reason."""
    data, kind, reason = HEADERS[case]
    path = tmp_path / "b.bundle"
    path.write_bytes(data)
    with pytest.raises(BundleError) as exc:
        read_manifest(path)
    assert type(exc.value) is kind
    assert_names(str(exc.value), path, reason)


def test_a_format_1_bundle_is_refused_naming_the_rebuild_option(tmp_path: Path) -> None:
    """A bundle an earlier version wrote (format 1) is refused in one line naming the file, the format, the one
    this plugin reads and ``--compile-cache-rebuild``."""
    path = changed(good_bundle(tmp_path / "old.bundle"), lambda m: m.update(format=1))
    with pytest.raises(BundleError) as exc:
        read_manifest(path)
    assert_names(str(exc.value), path, "bundle format 1 is not supported by this pytest-compilecache (it reads "
                                       "format 2)")
    assert "--compile-cache-rebuild" in str(exc.value)
    assert Unreadable.of(exc.value) is Unreadable.DAMAGED


@pytest.mark.parametrize("version", [3, 99, "2", True, None])
def test_any_other_format_is_refused(tmp_path: Path, version: object) -> None:
    """A later format, or a format field of the wrong type (``true`` equals 1 in Python), is refused by value."""
    path = changed(good_bundle(tmp_path / "b.bundle"), lambda m: m.update(format=version))
    with pytest.raises(BundleError) as exc:
        read_manifest(path)
    assert_names(str(exc.value), path, f"bundle format {version!r} is not supported")


MALFORMED: dict[str, Callable[[dict[str, Any]], None]] = {
    "no entries": lambda m: m.pop("entries"),
    "env a list": lambda m: m["entries"][0].update(env=["torch"]),
    "sha256 a number": lambda m: m["entries"][0].update(sha256=7),
    "size a float": lambda m: m["entries"][0].update(size=1.5),
    "created NaN": lambda m: m["entries"][0].update(created=float("nan")),
    "created huge": lambda m: m["entries"][0].update(created=10 ** 400),
    "stored a boolean": lambda m: m["entries"][0].update(stored=True),
    "stored negative": lambda m: m["entries"][0].update(stored=-1),
    "count a string": lambda m: m["entries"][0]["artifacts"]["inductor"].update(count="1"),
    "signature a number": lambda m: m["entries"][0].update(signature=123),
    "index offset negative": lambda m: m["entries"][0]["index"].update(offset=-1),
    "binaries of an unknown build": lambda m: m["entries"][0]["binaries"]["files"][0].__setitem__(0, "0" * 16),
    "binaries that do not add up": lambda m: m["entries"][0]["binaries"].update(size=1),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_entry_is_refused_as_corrupt(tmp_path: Path, case: str) -> None:
    """A manifest entry of the wrong shape or type (including numbers no float holds) is one clean error, never a
    TypeError or OverflowError from inside the reader."""
    path = changed(good_bundle(tmp_path / "b.bundle"), MALFORMED[case])
    with pytest.raises(BundleError) as exc:
        read_manifest(path)
    assert_names(str(exc.value), path, "corrupt: the manifest's entries are malformed")


OUTSIDE: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "table": (lambda e: e.update(size=e["size"] + 10 ** 6), f"the artifacts for {LABEL} lie"),
    "stored": (lambda e: e.update(stored=e["stored"] + 10 ** 6), f"the artifacts for {LABEL} lie"),
    "offset": (lambda e: e.update(offset=-5), f"the artifacts for {LABEL} lie"),
    "binaries": (lambda e: e["binaries"].update(offset=10 ** 6), f"the binaries for {LABEL} lie"),
    "index": (lambda e: e["index"].update(offset=10 ** 6), f"the key index for {LABEL} lies"),
}


@pytest.mark.parametrize("case", list(OUTSIDE))
def test_a_section_past_the_end_of_the_file_is_refused_before_any_read(tmp_path: Path, case: str) -> None:
    """A manifest placing a section (or an oversized length) past the file's end is refused when the manifest
    is read, saying which section of which entry."""
    change, what = OUTSIDE[case]
    path = changed(good_bundle(tmp_path / "b.bundle"), lambda m: change(m["entries"][0]))
    with pytest.raises(BundleError) as exc:
        read_manifest(path)
    assert_names(str(exc.value), path, f"truncated: {what} past the end of the file")


@pytest.mark.parametrize("cut", [1, 100])
def test_a_truncated_file_is_refused(tmp_path: Path, cut: int) -> None:
    """A bundle cut short (a partial download or copy) is refused when read, naming the file."""
    path = good_bundle(tmp_path / "b.bundle")
    path.write_bytes(path.read_bytes()[:-cut])
    with pytest.raises(BundleError) as exc:
        read_manifest(path)
    assert_names(str(exc.value), path, "truncated: ")


def test_malformed_supersedes_is_refused(tmp_path: Path) -> None:
    """A pack's ``supersedes`` that is no list of names is refused, naming the fields."""
    path = changed(good_bundle(tmp_path / "b.bundle"), lambda m: m.update(supersedes=[1, 2], written=5.0))
    with pytest.raises(BundleError) as exc:
        read_manifest(path)
    assert_names(str(exc.value), path, "corrupt: the manifest's supersedes, written or seal is malformed")


def test_a_flipped_byte_in_the_table_fails_its_checksum(tmp_path: Path) -> None:
    """The table is checked before any artifact is listed: a damaged one is refused, naming the entry."""
    path = flipped(good_bundle(tmp_path / "b.bundle"), lambda e: e["offset"] + e["size"] // 2)
    with read_manifest(path) as bundle:
        with pytest.raises(BundleError) as exc:
            bundle.members(bundle.entries[0])
    assert_names(str(exc.value), path, f"corrupt: the table of artifacts for {LABEL} fails its checksum")


def crafted(path: Path, table: bytes, stored: bytes) -> Path:
    """A one-entry bundle whose table is ``table`` (its checksum right) followed by ``stored``."""
    manifest = {"format": 2, "entries": [{"env": CPU, "offset": 0, "size": len(table), "stored": len(stored),
                                          "sha256": hashlib.sha256(table).hexdigest()}]}
    path.write_bytes(join(manifest, table + stored))
    return path


TABLES = {
    "not zlib": (b"no zlib stream", "the table of artifacts is malformed"),
    "not rows": (zlib.compress(b'{"rows": 1}'), "the table of artifacts is malformed"),
    "a row too short": (zlib.compress(b'[["inductor", "fk", 3, 3]]'), "the table of artifacts is malformed"),
    "nothing stored": (zlib.compress(b'[["inductor", "fk", 0, 3, "00"]]'), "the table of artifacts is malformed"),
    "sizes a boolean": (zlib.compress(b'[["inductor", "fk", true, 3, "00"]]'), "the table of artifacts is malformed"),
    "rows not adding up": (zlib.compress(b'[["inductor", "fk", 2, 3, "00"]]'), "does not match the entry's size"),
}


@pytest.mark.parametrize("case", list(TABLES))
def test_a_malformed_table_with_a_valid_checksum_is_corrupt(tmp_path: Path, case: str) -> None:
    """A table whose checksum holds but whose rows are not a table (or do not add up to the stored bytes) is
    refused as corrupt, naming the file and entry."""
    table, reason = TABLES[case]
    path = crafted(tmp_path / "b.bundle", table, b"xyz")
    with read_manifest(path) as bundle:
        with pytest.raises(BundleError) as exc:
            bundle.members(bundle.entries[0])
    assert_names(str(exc.value), path, reason)
    assert LABEL in str(exc.value)


def test_damaged_binaries_fail_their_section_checksum(tmp_path: Path) -> None:
    """A flipped byte in the carried binaries fails the section's checksum when they are read."""
    path = flipped(good_bundle(tmp_path / "b.bundle"), lambda e: e["binaries"]["offset"] + 2)
    with read_manifest(path) as bundle:
        assert list(bundle.members(bundle.entries[0]).contents()) == [GRAPH, AOT]
        with pytest.raises(BundleError) as exc:
            bundle.carried(bundle.entries[0])
    assert_names(str(exc.value), path, f"corrupt: the binaries for {LABEL} fail their checksum")


def test_a_damaged_carried_file_costs_only_itself(tmp_path: Path) -> None:
    """A file damaged inside a section whose checksum was made to hold: ``carried(check=True)`` leaves it out
    with one problem naming the bundle and the file."""
    manifest, body = split(good_bundle(tmp_path / "b.bundle").read_bytes())
    section = manifest["entries"][0]["binaries"]
    start, size = section["offset"], section["size"]
    blob = zlib.compress(b"something else entirely")
    section.update(size=len(blob), sha256=hashlib.sha256(blob).hexdigest())
    section["files"][0][4] = len(blob)
    index = manifest["entries"][0]["index"]
    index["offset"] += len(blob) - size
    path = tmp_path / "b.bundle"
    path.write_bytes(join(manifest, body[:start] + blob + body[start + size:]))
    with read_manifest(path) as bundle:
        carried, problems = bundle.carried(bundle.entries[0], check=True)
    assert not carried
    (problem,) = problems
    assert_names(problem, path, f"carried binary {KERNEL} fails its checksum; not used")


@pytest.mark.parametrize(("change", "reason"), [
    (lambda s: s["builds"].update({BUILD: {**IDENTITY, "compiler": "clang"}}),
     f"carried binaries of build {BUILD} do not match its build identity; not used"),
    (lambda s: s["files"][0].__setitem__(1, "../../etc/cron.d/x"),
     "carried binary '../../etc/cron.d/x' has a name outside torch's cache layout; not used"),
])
def test_a_forged_build_or_path_is_left_out_naming_the_file(tmp_path: Path, change: Callable[[dict[str, Any]], None],
                                                             reason: str) -> None:
    """A build whose id is not its identity's hash, or a path that could write outside the cache folder, is left
    out of the listing, with a problem naming the bundle."""
    path = changed(good_bundle(tmp_path / "b.bundle"), lambda m: change(m["entries"][0]["binaries"]))
    with read_manifest(path) as bundle:
        carried, problems = bundle.carried(bundle.entries[0])
    assert not carried
    (problem,) = problems
    assert_names(problem, path, reason)


def test_a_key_index_failing_its_checksum_costs_only_explanations(tmp_path: Path) -> None:
    """A damaged key index is a problem (naming the file) from the key index alone: the artifacts still read."""
    path = flipped(good_bundle(tmp_path / "b.bundle"), lambda e: e["index"]["offset"] + 3)
    with read_manifest(path) as bundle:
        e = bundle.entries[0]
        problem = bundle.read_key_index(e)
        index, again = bundle.key_index(e)
        assert list(bundle.members(e).contents()) == [GRAPH, AOT]
    assert index is None and again == problem
    assert_names(problem, path, f"the key index of {LABEL} fails its checksum; misses cannot be explained")


def test_a_key_index_that_cannot_be_unpacked_is_named_unusable(tmp_path: Path) -> None:
    """A key index whose checksum holds but which is not an index: unusable, said once, naming the file and why."""
    manifest, body = split(good_bundle(tmp_path / "b.bundle").read_bytes())
    index = manifest["entries"][0]["index"]
    garbage = zlib.compress(b'{"format": 7}')
    index.update(size=len(garbage), sha256=hashlib.sha256(garbage).hexdigest())
    path = tmp_path / "b.bundle"
    path.write_bytes(join(manifest, body[:index["offset"]] + garbage))
    with read_manifest(path) as bundle:
        assert bundle.read_key_index(bundle.entries[0]) == ""
        unpacked, problem = bundle.key_index(bundle.entries[0])
    assert unpacked is None
    assert_names(problem, path, f"the key index of {LABEL} is unusable (the key index has an unknown format (7))")


def test_a_hostile_env_is_named_on_one_printable_line(tmp_path: Path) -> None:
    """Env values with line breaks, escapes and direction overrides are escaped where messages name the entry."""
    path = changed(good_bundle(tmp_path / "b.bundle"),
                   lambda m: m["entries"][0]["env"].update(torch="2.13\nFAKE OK", device="\u202e\x1b[31m"))
    path = flipped(path, lambda e: e["offset"])
    with read_manifest(path) as bundle:
        with pytest.raises(BundleError) as exc:
            bundle.members(bundle.entries[0])
    assert_names(str(exc.value), path, "the table of artifacts for torch 2.13\\nFAKE OK on \\u202e\\x1b[31m fails")


def test_a_member_read_through_a_closed_file_is_damaged_not_a_crash(tmp_path: Path) -> None:
    """Members whose file was let go of (``release``) raise :class:`MemberDamaged` naming the artifact, which a
    session turns into a miss."""
    path = good_bundle(tmp_path / "b.bundle")
    bundle = read_manifest(path)
    members = bundle.members(bundle.entries[0])
    members.close()
    bundle.release()
    with pytest.raises(MemberDamaged, match=f"^inductor artifact {GRAPH[1]} cannot be read: .*closed"):
        members.read(members.table[0])
