"""Carried binaries (``binaries.py``): compiled files by build identity, written into a bundle entry, read back by
range and checked when asked for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache.bundle.binaries import (BinaryDamaged, CarriedBinaries, CarriedFile, build_id,
                                                 check_section, identity_differences)
from pytest_compilecache.bundle.format import Bundle, entry_of, read_manifest
from pytest_compilecache.bundle.members import Members
from pytest_compilecache.bundle.writing import write_bundle

CPU = {"torch": "2.13.0+cpu", "device": "cpu"}
GCC12 = {"compiler": "/usr/bin/g++-12", "native": "znver3", "libc": "glibc 2.36"}
GCC13 = {**GCC12, "compiler": "/usr/bin/g++-13"}
B12, B13 = build_id(GCC12), build_id(GCC13)


def carried(*files: tuple[str, str, bytes]) -> CarriedBinaries:
    made = CarriedBinaries({B12: GCC12, B13: GCC13})
    for build, path, data in files:
        made.add(build, path, data)
    return made


def round_trip(path: Path, binaries: CarriedBinaries) -> CarriedBinaries:
    """``binaries`` written with an entry and read back (listed, each file read when asked)."""
    write_bundle(Bundle(path, [entry_of(CPU, Members.packed([("pgo", "k", b"x")]), binaries=binaries)]))
    with read_manifest(path) as bundle:
        read, problems = bundle.carried(bundle.entries[0])
    assert problems == []
    return read


def test_build_id_is_a_hash_of_the_identity_whatever_its_order() -> None:
    """A build id names an identity: equal for equal fields in any order, different for any field changed."""
    assert build_id(dict(reversed(list(GCC12.items())))) == B12
    assert B12 != B13 and len(B12) == 16


def test_files_of_two_builds_round_trip_through_a_bundle(tmp_path: Path) -> None:
    """Every file comes back under its build and path with its content, and the builds with their identities."""
    files = [(B12, "ab/cone.main.so", b"\x7fELF one"), (B12, "ab/cone.main.cpp", b"int main() {}"),
             (B13, "cd/ctwo.main.so", b"\x7fELF two"), (B12, "triton/" + "k" * 20 + "/kernel.cubin", b"cubin")]
    read = round_trip(tmp_path / "b.bundle", carried(*files))
    assert read.builds == {B12: GCC12, B13: GCC13}
    assert {key: f.content() for key, f in read.files.items()} == {(b, p): d for b, p, d in files}


def test_fitting_gives_only_the_files_of_one_build(tmp_path: Path) -> None:
    """A machine gets the files of its own build identity, by path, and none of another build's."""
    read = round_trip(tmp_path / "b.bundle", carried((B12, "ab/cone.main.so", b"one"), (B13, "ab/cone.main.so", b"13")))
    assert {path: f.content() for path, f in read.fitting(B13).items()} == {"ab/cone.main.so": b"13"}
    assert read.fitting(build_id({"compiler": "clang"})) == {}


def test_an_added_file_is_written_beside_those_read(tmp_path: Path) -> None:
    """Binaries read from a bundle with a file added (an updating run's): the rewrite holds both."""
    read = round_trip(tmp_path / "a.bundle", carried((B12, "ab/cone.main.so", b"one")))
    read.add(B12, "cd/cnew.main.so", b"new")
    again = round_trip(tmp_path / "b.bundle", read)
    assert {p: f.content() for (_, p), f in again.files.items()} == {"ab/cone.main.so": b"one",
                                                                     "cd/cnew.main.so": b"new"}


def test_add_keeps_the_first_file_of_a_build_and_path() -> None:
    """A second file of the same build and path is ignored (the first one wins)."""
    made = carried((B12, "ab/cone.main.so", b"first"), (B12, "ab/cone.main.so", b"second"))
    assert made.files[(B12, "ab/cone.main.so")].content() == b"first"


def timings(values: dict[str, Any]) -> bytes:
    return json.dumps({"cache": values}).encode()


def test_add_merges_gemm_timing_files_keeping_the_first_values() -> None:
    """Max-autotune timing files (``cache/...``) are merged, not replaced: every timing of both, the first's where
    both have one."""
    made = carried((B12, "cache/abc", timings({"mm": {"a": 1.0, "b": 2.0}})),
                   (B12, "cache/abc", timings({"mm": {"b": 9.0, "c": 3.0}, "bmm": {"d": 4.0}})))
    merged = json.loads(made.files[(B12, "cache/abc")].content())
    assert merged == {"cache": {"mm": {"a": 1.0, "b": 2.0, "c": 3.0}, "bmm": {"d": 4.0}}}


def test_union_lets_the_earliest_part_win_a_path() -> None:
    """The union of parts holds every build and file; for one build and path the earliest part's file."""
    first = carried((B12, "ab/cone.main.so", b"first"))
    second = carried((B12, "ab/cone.main.so", b"second"), (B13, "cd/ctwo.main.so", b"two"))
    both = CarriedBinaries.union([first, second])
    assert {p: f.content() for (_, p), f in both.files.items()} == {"ab/cone.main.so": b"first",
                                                                    "cd/ctwo.main.so": b"two"}


def test_union_prefers_a_stored_copy_to_the_same_content_made_here(tmp_path: Path) -> None:
    """The same content compressed here and read from a bundle: the union keeps the bundle's copy (copied as
    stored, never recompressed)."""
    stored = round_trip(tmp_path / "b.bundle", carried((B12, "ab/cone.main.so", b"same")))
    made = carried((B12, "ab/cone.main.so", b"same"))
    both = CarriedBinaries.union([made, stored])
    assert both.files[(B12, "ab/cone.main.so")].here is False


def test_counts_give_cpp_binaries_and_set_probes_apart() -> None:
    """``counts``: C++ binaries (``.so``, ``.o``; not sources, not Triton files) and their bytes; the CPU probes
    built from the given probe sources counted apart."""
    probe = "int main() { /* avx512 probe */ }"
    made = carried((B12, "ab/ck.main.so", b"k" * 10), (B12, "ab/ck.main.cpp", b"source"), (B12, "cd/co.o", b"o" * 4),
                   (B12, "ef/cprobe.so", b"p" * 7), (B12, "ef/cprobe.cpp", probe.encode()),
                   (B12, "triton/" + "k" * 20 + "/mod.so", b"t"))
    assert made.counts() == {"count": 3, "bytes": 21}
    assert made.counts([probe]) == {"count": 2, "bytes": 14, "probes": 1}


def test_triton_counts_count_kernels_by_their_group_file() -> None:
    """Triton kernels are the folders with a group file; their bytes count every Triton file."""
    kernel, module = "triton/" + "a" * 20, "triton/" + "b" * 20
    made = carried((B12, f"{kernel}/__grp__k.json", b"{}"), (B12, f"{kernel}/k.cubin", b"c" * 5),
                   (B12, f"{module}/launcher.so", b"m" * 3))
    assert made.triton_counts() == {"count": 1, "bytes": 10}


def test_checked_leaves_out_a_damaged_file_with_one_problem() -> None:
    """``checked`` reads every file: one that fails its checksum is left out, and named once."""
    good = CarriedFile.made(B12, "ab/cgood.so", b"good")
    bad = CarriedFile(B12, "ab/cbad.so", good.sha256, 4, lambda: b"not zlib")
    made = CarriedBinaries({B12: GCC12}, {(B12, good.path): good, (B12, bad.path): bad})
    kept, problems = made.checked()
    assert list(kept.files) == [(B12, "ab/cgood.so")]
    assert problems == ["carried binary ab/cbad.so fails its checksum; not used"]


def test_a_file_read_short_is_cut_short() -> None:
    """A file read from a bundle with fewer bytes than listed is damaged, not silently short."""
    stored = CarriedFile(B12, "ab/c.so", "0" * 64, 4, lambda: b"abc", 10)
    with pytest.raises(BinaryDamaged, match="^carried binary ab/c.so is cut short$"):
        stored.content()


def test_a_pooled_file_changed_since_it_was_listed_is_refused(tmp_path: Path) -> None:
    """A pooled file is compressed when first needed, and only if it still has the content it was listed with."""
    pooled = tmp_path / "c.so"
    pooled.write_bytes(b"as listed")
    listed = CarriedFile.in_pool(B12, "ab/c.so", pooled)
    pooled.write_bytes(b"rebuilt since")
    with pytest.raises(BinaryDamaged, match=f"^carried binary ab/c.so cannot be read: {pooled} changed since it "
                                            "was listed$"):
        listed.raw()


def test_a_pooled_file_gone_before_the_write_is_left_out(tmp_path: Path) -> None:
    """A pooled file removed before the bundle is written (found unloadable) is left out of the section; the others
    are written."""
    gone, kept = tmp_path / "gone.so", tmp_path / "kept.so"
    gone.write_bytes(b"gone")
    kept.write_bytes(b"kept")
    made = CarriedBinaries({B12: GCC12})
    for name, file in (("ab/cgone.so", gone), ("ab/ckept.so", kept)):
        made.files[(B12, name)] = CarriedFile.in_pool(B12, name, file)
    gone.unlink()
    read = round_trip(tmp_path / "b.bundle", made)
    assert {p: f.content() for (_, p), f in read.files.items()} == {"ab/ckept.so": b"kept"}


def section() -> dict[str, Any]:
    return {"offset": 0, "size": 5, "sha256": "00", "builds": {B12: dict(GCC12)},
            "files": [[B12, "ab/c.so", "00", 9, 5]]}


@pytest.mark.parametrize(("change", "reason"), [
    (lambda s: s.update(offset=-1), "binaries.offset must be a non-negative integer"),
    (lambda s: s.update(size=True), "binaries.size must be a non-negative integer"),
    (lambda s: s.update(sha256=None), "binaries.sha256 must be a string"),
    (lambda s: s["builds"][B12].update(native=1), "binaries.builds must map build ids to string fields"),
    (lambda s: s.update(files={}), "binaries.files must be a list"),
    (lambda s: s["files"][0].pop(), "binaries.files entries must be [build, path, sha256, size, stored size]"),
    (lambda s: s["files"][0].__setitem__(0, "other"), "binaries.files names an unknown build 'other'"),
    (lambda s: s.update(size=6), "binaries.files do not add up to binaries.size"),
], ids=["offset", "size", "sha256", "builds", "files", "file row", "unknown build", "sizes"])
def test_check_section_says_what_is_malformed(change: Any, reason: str) -> None:
    """Each way a binaries section can be malformed is refused with what is wrong; a good one passes."""
    check_section(section())
    bad = section()
    change(bad)
    with pytest.raises(TypeError) as exc:
        check_section(bad)
    assert str(exc.value) == reason


def test_identity_differences_name_each_differing_field() -> None:
    """Why a machine gets no carried binaries: each field in which the build identities differ, or ``identical``."""
    assert identity_differences(GCC12, GCC12) == "identical"
    assert identity_differences(GCC12, {**GCC13, "python": "3.12"}) == (
        "compiler: /usr/bin/g++-12 there, /usr/bin/g++-13 here; python: (absent) there, 3.12 here")
