"""Bundle format 2 in-process: entries written with the package's writer and read back with its reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache.bundle.binaries import CarriedBinaries, build_id
from pytest_compilecache.bundle.format import (FORMAT, MAGIC, Bundle, BundleError, Entry, NotABundle, NotAFile,
                                               Unreadable, Unwritable, entry_of, members_of, payload_of, read_manifest)
from pytest_compilecache.bundle.keyindex import KeyIndex
from pytest_compilecache.bundle.members import WHOLE, MemberDamaged, Members
from pytest_compilecache.bundle.writing import encoded_size, write_bundle

CPU = {"torch": "2.13.0+cpu", "device": "cpu", "python": "3.11", "config_hash": "c0ffee"}
GPU = {**CPU, "torch": "2.13.0+cu128", "device": "NVIDIA H200", "cuda": "12.8"}
OLD = {**CPU, "torch": "2.11.0+cpu"}

ARTIFACTS = [
    ("inductor", "f" + "1" * 30, b"graph one " * 40),
    ("aot_autograd", "a" + "2" * 30, b"aot entry " * 25),
    ("autotune", "triton_kernel_3", b'{"found_by_coordesc": true}'),
    ("pgo", "code_state_4", b""),
]


def entry(env: dict[str, str], artifacts: list[tuple[str, str, bytes]] = ARTIFACTS, created: float = 0.0,
          binaries: CarriedBinaries | None = None, index: KeyIndex | None = None) -> Entry:
    """An entry made in this process, as an updating session makes one (its artifacts packed now)."""
    return entry_of(env, Members.packed(artifacts), created, binaries, index)


def write(path: Path, *entries: Entry) -> Path:
    write_bundle(Bundle(path, list(entries)))
    return path


def manifest(path: Path) -> dict[str, Any]:
    """The manifest of the bundle at ``path``, read as docs/file-format.md lays it out."""
    length, _, rest = path.read_bytes()[len(MAGIC):].partition(b"\n")
    parsed: dict[str, Any] = json.loads(rest[:int(length)])
    return parsed


def test_an_entry_reads_back_as_it_was_described(tmp_path: Path) -> None:
    """What the manifest says of an entry (env, dates, counts, table size and checksum, stored bytes) reads back
    equal to what the writer made."""
    made = entry(CPU, created=1000.5)
    made.history = {"built_compile_seconds": 6.1, "tests": {"t.py::test_a": 1.25}}
    with read_manifest(write(tmp_path / "b.bundle", made)) as bundle:
        (read,) = bundle.entries
    assert read.from_file and not made.from_file
    assert read.describe() == made.describe()
    assert read.artifacts == {"inductor": {"count": 1, "bytes": 400}, "aot_autograd": {"count": 1, "bytes": 250},
                              "autotune": {"count": 1, "bytes": 27}, "pgo": {"count": 1, "bytes": 0}}


def test_every_artifact_reads_back_with_its_type_key_and_content(tmp_path: Path) -> None:
    """Each artifact comes back in the order written, its content whole (an empty one included)."""
    with read_manifest(write(tmp_path / "b.bundle", entry(CPU))) as bundle:
        members = bundle.members(bundle.entries[0])
        assert list(members.contents()) == ARTIFACTS
        assert [(m.kind, m.key, m.size) for m in members.table] == [(k, key, len(c)) for k, key, c in ARTIFACTS]


def test_several_environments_share_one_file_and_each_is_found_by_its_env(tmp_path: Path) -> None:
    """Three entries in one file: ``find`` returns each by its environment, with its own artifacts."""
    contents = {label: [("inductor", "f" + str(i) * 30, f"graph of {label}".encode())]
                for i, label in enumerate(["cpu", "gpu", "old"], 1)}
    envs = {"cpu": CPU, "gpu": GPU, "old": OLD}
    path = write(tmp_path / "b.bundle", *(entry(envs[k], contents[k]) for k in envs))
    with read_manifest(path) as bundle:
        assert [e.env for e in bundle.entries] == list(envs.values())
        for label, env in envs.items():
            found = bundle.find(env)
            assert found is not None
            assert list(bundle.members(found).contents()) == contents[label]
        assert bundle.find({**CPU, "device": "mps"}) is None


def test_a_partial_read_needs_only_the_asked_artifact_intact(tmp_path: Path) -> None:
    """One artifact's bytes damaged in the file: another of the entry still reads, the damaged one alone fails,
    named by type and key."""
    path = write(tmp_path / "b.bundle", entry(CPU))
    with read_manifest(path) as bundle:
        e = bundle.entries[0]
        graph = bundle.members(e).keyed("inductor", ARTIFACTS[0][1])[0]
        at = bundle._start + e.offset + e.size + graph.offset + graph.stored // 2
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    with read_manifest(path) as bundle:
        members = bundle.members(bundle.entries[0])
        (aot,) = members.keyed("aot_autograd", ARTIFACTS[1][1])
        assert members.read(aot) == ARTIFACTS[1][2]
        with pytest.raises(MemberDamaged, match=f"inductor artifact {ARTIFACTS[0][1]} "
                                                r"(is corrupt \(it does not inflate\)|fails its checksum)"):
            members.read(graph)


def test_guard_variants_under_one_key_are_all_kept(tmp_path: Path) -> None:
    """Two artifacts of one type and key (one per guard variant) both survive the round trip, in order."""
    key = "f" + "9" * 30
    variants = [("inductor", key, b"variant one"), ("inductor", key, b"variant two")]
    with read_manifest(write(tmp_path / "b.bundle", entry(CPU, variants))) as bundle:
        members = bundle.members(bundle.entries[0])
        assert [members.read(m) for m in members.keyed("inductor", key)] == [b"variant one", b"variant two"]
        assert members.keyed("inductor", "f" + "8" * 30) == []


def test_artifacts_stay_readable_after_the_bundle_is_closed(tmp_path: Path) -> None:
    """Members handed out before ``close`` read on (a session lists them, then torch asks later); a table not read
    before is refused once closed, naming the file."""
    path = write(tmp_path / "b.bundle", entry(CPU), entry(GPU))
    bundle = read_manifest(path)
    members = bundle.members(bundle.entries[0])
    bundle.close()
    assert members.read(members.table[0]) == ARTIFACTS[0][2]
    with pytest.raises(BundleError, match="closed before the table of artifacts for torch 2.13.0\\+cu128") as exc:
        bundle.members(bundle.entries[1])
    assert str(exc.value).startswith(f"{path}: ")
    members.close()


def test_write_returns_the_size_it_said_it_would_write(tmp_path: Path) -> None:
    """``encoded_size`` before the write, the size ``write_bundle`` returns and the file's size agree."""
    ki = KeyIndex(torch="2.13")
    ki.add("f" + "1" * 30, "inductor", "def f(x): ...", {"gm": ("h", "graph")})
    bundle = Bundle(tmp_path / "b.bundle", [entry(CPU, index=ki), entry(GPU)])
    expected = encoded_size(bundle)
    assert write_bundle(bundle) == expected == bundle.path.stat().st_size


def test_the_file_starts_with_the_magic_line_and_a_sorted_manifest(tmp_path: Path) -> None:
    """The layout docs/file-format.md gives: the magic line, the manifest's length, then format-2 JSON."""
    path = write(tmp_path / "b.bundle", entry(CPU))
    assert path.read_bytes().startswith(MAGIC)
    top = manifest(path)
    assert top["format"] == FORMAT == 2
    assert list(top) == sorted(top) and list(top["entries"][0]) == sorted(top["entries"][0])


def test_rewriting_a_read_bundle_reproduces_it_byte_for_byte(tmp_path: Path) -> None:
    """A bundle read and written elsewhere unchanged is the same file: members, binaries and key index are copied
    as stored, never recompressed."""
    ki = KeyIndex(torch="2.13")
    ki.add("f" + "1" * 30, "inductor", "def f(x): ...", {"gm": ("h", "graph"), "inductor_config[a]": ("c", "1")})
    identity = {"compiler": "g++"}
    carried = CarriedBinaries({build_id(identity): identity})
    carried.add(build_id(identity), "ab/kernel.main.so", b"binary" * 50)
    original = write(tmp_path / "a.bundle", entry(CPU, binaries=carried, index=ki), entry(GPU))
    copy = tmp_path / "b.bundle"
    with read_manifest(original) as bundle:
        bundle.path = copy
        write_bundle(bundle)
    assert copy.read_bytes() == original.read_bytes()


def test_an_entry_without_binaries_or_index_has_neither_section(tmp_path: Path) -> None:
    """No ``binaries`` or ``index`` key in the manifest; reading them gives nothing and no problem."""
    path = write(tmp_path / "b.bundle", entry(CPU))
    described = manifest(path)["entries"][0]
    assert "binaries" not in described and "index" not in described
    with read_manifest(path) as bundle:
        carried, problems = bundle.carried(bundle.entries[0])
        assert not carried and problems == []
        assert bundle.key_index(bundle.entries[0]) == (None, "")


def test_mismatch_names_the_file_and_each_field_the_closest_entry_differs_in(tmp_path: Path) -> None:
    """No entry for this machine: the message names the bundle and the fields of the closest entry that differ."""
    path = write(tmp_path / "b.bundle", entry(GPU), entry(OLD))
    here = {**CPU, "python": "3.12"}
    with read_manifest(path) as bundle:
        why = bundle.mismatch(here)
    assert why == f"{path}: no entry matches this machine (torch: bundle 2.11.0+cpu, here 2.13.0+cpu; " \
                  "python: bundle 3.11, here 3.12)"


def test_messages_name_the_label_not_the_local_copy(tmp_path: Path) -> None:
    """A bundle read from a local copy of a URL is named by the URL in messages."""
    path = write(tmp_path / "copy.bundle", entry(GPU))
    url = "https://cache.example/suite.bundle"
    with read_manifest(path, label=url) as bundle:
        assert bundle.name == url
        assert bundle.mismatch(CPU).startswith(f"{url}: no entry matches")
        assert str(path) not in bundle.mismatch(CPU)


def test_a_whole_megacache_entry_gives_its_payload_without_torch(tmp_path: Path) -> None:
    """An entry torch could not take apart (one ``megacache`` member) hands back its bytes as they were."""
    blob = b"\x00mega-cache bytes as torch wrote them\xff" * 10
    with read_manifest(write(tmp_path / "b.bundle", entry(CPU, [(WHOLE, "", blob)]))) as bundle:
        assert bundle.payload(bundle.entries[0]) == blob


def test_an_entry_not_read_yet_has_no_members_or_payload(tmp_path: Path) -> None:
    """``members_of`` and ``payload_of`` refuse an entry whose table was never read, naming the given name."""
    with read_manifest(write(tmp_path / "b.bundle", entry(CPU))) as bundle:
        unread = bundle.entries[0]
    with pytest.raises(BundleError, match=r"^the-name: the artifacts for torch 2\.13\.0\+cpu on cpu were not read$"):
        members_of(unread, "the-name")
    with pytest.raises(BundleError, match=r"^the-name: the payload for torch 2\.13\.0\+cpu on cpu was not read$"):
        payload_of(unread, "the-name")


def test_read_all_reads_every_section_then_closes(tmp_path: Path) -> None:
    """``read_all`` unpacks each entry's key index and binaries listing, then closes; the artifacts still read."""
    ki = KeyIndex(torch="2.13")
    ki.note_run(5.0, ["inductor/" + ARTIFACTS[0][1]])
    with read_manifest(write(tmp_path / "b.bundle", entry(CPU, index=ki), entry(GPU))) as bundle:
        bundle.read_all()
        assert bundle._file is None
        first, second = bundle.entries
        assert first.index is not None and first.index.used == ki.used and second.index is None
        assert list(bundle.members(first).contents()) == ARTIFACTS


def test_a_folder_is_not_a_bundle_file(tmp_path: Path) -> None:
    """Reading a directory raises :class:`NotAFile` naming it."""
    with pytest.raises(NotAFile) as exc:
        read_manifest(tmp_path)
    assert str(exc.value) == f"{tmp_path}: is a directory, not a bundle file"
    assert Unreadable.of(exc.value) is Unreadable.NOT_A_FILE


def test_a_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    """A missing bundle is no error of the bundle's: the caller tells it from a bad one."""
    with pytest.raises(FileNotFoundError):
        read_manifest(tmp_path / "absent.bundle")


def test_a_write_that_cannot_be_made_names_the_file_and_leaves_it(tmp_path: Path) -> None:
    """A bundle whose folder is a file cannot be written: the error names the path and says it is unchanged."""
    blocker = tmp_path / "file"
    blocker.write_bytes(b"not a folder")
    with pytest.raises(BundleError) as exc:
        write(blocker / "b.bundle", entry(CPU))
    message = str(exc.value)
    assert message.startswith(f"{blocker / 'b.bundle'}: cannot write: ") and message.endswith("the file there is "
                                                                                                "unchanged")
    assert blocker.read_bytes() == b"not a folder"


@pytest.mark.parametrize("kind, unreadable", [(NotABundle, Unreadable.NOT_A_BUNDLE), (NotAFile, Unreadable.NOT_A_FILE),
                                              (Unwritable, Unreadable.UNWRITABLE)])
def test_a_problem_keeps_its_kind_when_raised_as_a_refinement_of_it(kind: type[BundleError],
                                                                     unreadable: Unreadable) -> None:
    """What is not a bundle is never written over, even by --compile-cache-rebuild, which replaces only DAMAGED: a
    more particular error of one of these kinds must keep its kind, not fall through to DAMAGED."""
    refined = type("Refined", (kind,), {})
    assert Unreadable.of(kind("x")) is unreadable
    assert Unreadable.of(refined("x")) is unreadable
    assert Unreadable.of(BundleError("x")) is Unreadable.DAMAGED
