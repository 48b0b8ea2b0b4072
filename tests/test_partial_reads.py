"""Bundle format 2: an entry's artifacts read one by one, when torch asks; a damaged one costs only itself."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path

import pytest

from pytest_compilecache.bundle.format import FORMAT, MAGIC, Bundle, BundleError, entry_of, read_manifest
from pytest_compilecache.bundle.writing import write_bundle
from pytest_compilecache.bundle.members import Member, MemberDamaged, Members, unpack_table

from helpers import BuildBundle

pytestmark = pytest.mark.slow

CONFTEST = """
import torch

def f(x):
    return torch.sin(x) + 1

def g(x):
    return torch.cos(x) * 2

def h(x):
    return torch.tanh(x) - 3

def pytest_compilecache_warmup(cache):
    for fn in (f, g, h):
        torch.compile(fn)(torch.randn(8))
"""

TESTS = """
import pytest
import torch
from conftest import f, g, h

@pytest.mark.parametrize("fn", [f, g, h], ids=["f", "g", "h"])
def test_compiles(warm_cache, fn):
    torch.compile(fn)(torch.randn(8))
"""


@pytest.fixture(scope="module")
def built(build_bundle: BuildBundle) -> Path:
    """A bundle of the three tests' graphs, written by one real session of them (copied by each test)."""
    return build_bundle({"conftest.py": CONFTEST, "test_three.py": TESTS})


def build(pytester: pytest.Pytester, built: Path, tests: str = TESTS) -> Path:
    """The three tests in ``pytester.path`` (``tests`` their source), beside a copy of the built bundle."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_three=tests)
    bundle = pytester.path / "three.bundle"
    shutil.copy(built, bundle)
    return bundle


def totals(report: Path) -> tuple[dict, dict]:
    data = json.loads(report.read_text())
    return data["totals"]["fx_graph"], data["bundle"]["processes"][0]


@pytest.mark.compat
def test_one_test_reads_only_its_own_artifacts(pytester: pytest.Pytester, run_inner, built: Path,
                                               kernels_name_their_folder: bool) -> None:
    """Re-running one test from a bundle of three reads that test's FX graph and AOTAutograd entries, not the
    others': the report says what the entry holds and what torch asked for, and the test hits."""
    bundle = build(pytester, built)
    with read_manifest(bundle) as read:
        assert read.entries[0].stored
        table = read.members(read.entries[0]).table
    kinds = sorted(m.kind for m in table)
    assert kinds.count("inductor") == 3 and kinds.count("aot_autograd") == 3, kinds
    report = pytester.path / "one.json"
    result = run_inner(f"--compile-cache-bundle={bundle}", f"--compile-cache-report={report}", "-k", "f]", fresh=True)
    result.assert_outcomes(passed=1, deselected=2)
    fx, process = totals(report)
    assert (fx["hits"], fx["misses"]) == (1, 0)
    # AOTAutograd entries are read on demand where torch finds them through _get_tmp_dir_for_key (2.8 and later).
    # C++ binaries where torch names their folder through get_path (every version tested): one kernel each here.
    later = process["on_demand"]
    assert later.get("inductor") == 3 and later.keys() <= {"inductor", "aot_autograd", "cpp"}, process
    assert process["placed"] == {kind: 1 for kind in later}, process
    assert process["loaded"].get("aot_autograd", 3) == 3, process
    (test,) = json.loads(report.read_text())["tests"].values()
    carried = process["binaries"].get("carried", 0)
    if kernels_name_their_folder:
        assert carried == 0 and "cpp" not in later, process  # torch 2.7: a kernel built elsewhere is not the same
    else:
        assert later["cpp"] == carried == 3, process
        assert test["cpp"]["hits"] == test["cpp"]["from_bundle"] == 1 and test["cpp"]["misses"] == 0, test["cpp"]
    with read_manifest(bundle) as read:
        files = (read.entries[0].binaries_section or {}).get("files", [])
    held = sum(m.size for m in table if m.kind in later) + sum(f[3] for f in files if f[1].endswith((".so", ".cpp")))
    assert 0 < process["placed_bytes"] < held * 0.6, (process["placed_bytes"], held)
    result.stdout.fnmatch_lines(["*on demand: 1 of 3 fx_graph*" + (", 1 of 3 cpp read when needed*" if carried
                                                                   else "read when needed*")])


def damage(bundle: Path) -> tuple[Member, bytes]:
    """Flip a byte in the middle of the bundle's first FX graph; that member, and the bytes now in the file."""
    with read_manifest(bundle) as read:
        entry = read.entries[0]
        victim = next(m for m in read.members(entry).table if m.kind == "inductor")
        at = read._start + entry.offset + entry.size + victim.offset + victim.stored // 2
    data = bytearray(bundle.read_bytes())
    data[at] ^= 0xFF
    bundle.write_bytes(bytes(data))
    return victim, bytes(data)


def test_a_damaged_artifact_costs_only_itself(pytester: pytest.Pytester, run_inner, built: Path) -> None:
    """One FX graph's bytes damaged in the file: the test that needs it compiles (a miss), the others hit, the
    summary names that artifact once, and the bundle is left as it is."""
    bundle = build(pytester, built)
    victim, data = damage(bundle)
    report = pytester.path / "damaged.json"
    result = run_inner(f"--compile-cache-bundle={bundle}", f"--compile-cache-report={report}")
    result.assert_outcomes(passed=3)
    summary = json.loads(report.read_text())
    process = summary["bundle"]["processes"][0]
    missed = [name for name, test in summary["tests"].items() if test["fx_graph"]["misses"]]
    assert len(missed) == 1, summary["tests"]
    assert all(test["fx_graph"]["hits"] == 1 for name, test in summary["tests"].items() if name not in missed)
    named = [p for p in process["problems"] if victim.key in p]
    assert len(named) == 1 and str(bundle) in named[0], process["problems"]
    assert result.stdout.str().count(victim.key) == 1
    assert bundle.read_bytes() == data, "a bundle is not rewritten without --compile-cache-update"


ASSERTING = TESTS + """
    warm_cache.assert_misses(fx_graph=0)
"""


def test_a_test_that_ran_without_a_damaged_member_skips_and_strict_fails_it(pytester: pytest.Pytester,
                                                                             run_inner, built: Path) -> None:
    """A warm test whose hit assertion fails because a member it needed is damaged: skipped with the reason (the
    bundle, the member, why) where the run is not strict, failed with it where it is; the summary names the member
    and that test once."""
    bundle = build(pytester, built, ASSERTING)
    victim, _ = damage(bundle)
    report = pytester.path / "damaged.json"
    result = run_inner(f"--compile-cache-bundle={bundle}", f"--compile-cache-report={report}", "-rs")
    result.assert_outcomes(passed=2, skipped=1)
    assert result.ret == 0
    (skip,) = [line for line in result.stdout.lines if line.startswith("SKIPPED")]
    assert re.search(f"{re.escape(f'{bundle}: {victim}')} (is corrupt|fails its checksum)", skip), skip
    summary = json.loads(report.read_text())
    (ran_without,) = [name for name, test in summary["tests"].items() if test["fx_graph"]["misses"]]
    (problem,) = [p for p in summary["bundle"]["problems"] if victim.key in p]
    assert ran_without in problem, problem
    problems = [line for line in result.stdout.lines if line.startswith("PROBLEM") and victim.key in line]
    assert len(problems) == 1 and ran_without in problems[0], result.stdout.str()
    strict = run_inner(f"--compile-cache-bundle={bundle}", "--compile-cache-strict")
    strict.assert_outcomes(passed=2, failed=1)
    assert strict.ret == 1
    strict.stdout.fnmatch_lines([f"*this test ran without what a damaged bundle held for it: {bundle}: {victim} *"])
    # A failure the damage does not account for (a count off the other way) still fails where not strict.
    pytester.makepyfile(test_three=ASSERTING.replace("assert_misses(fx_graph=0)", "assert_misses(fx_graph=0, aot_autograd=7)"))
    other = run_inner(f"--compile-cache-bundle={bundle}")
    other.assert_outcomes(failed=3)


FORMAT_1 = """
import hashlib, json, sys
from pathlib import Path
from pytest_compilecache.bundle.format import MAGIC, read_manifest

with read_manifest(Path(sys.argv[1])) as read:
    entry = read.entries[0]
    payload = read.payload(entry)
described = {k: v for k, v in entry.describe().items() if k not in ("stored", "index")}
described.update(offset=0, size=len(payload), sha256=hashlib.sha256(payload).hexdigest())
manifest = json.dumps({"format": 1, "entries": [described]}).encode()
Path(sys.argv[2]).write_bytes(MAGIC + b"%d\\n" % len(manifest) + manifest + payload)
"""


@pytest.mark.compat
def test_a_format_1_bundle_is_refused_in_one_line_and_a_rebuild_replaces_it(pytester: pytest.Pytester,
                                                                            run_inner, built: Path) -> None:
    """A bundle written by an earlier version (one payload an entry) is refused with one line naming the file and
    the option that rebuilds it; a run with that option writes it in the current format."""
    bundle = build(pytester, built)
    old = pytester.path / "old.bundle"
    # torch puts the artifacts back together in a process of its own (pytester forgets modules a test imports).
    done = subprocess.run([sys.executable, "-c", FORMAT_1, str(bundle), str(old)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with pytest.raises(BundleError) as refused:
        read_manifest(old)
    assert str(old) in str(refused.value) and "--compile-cache-rebuild" in str(refused.value)
    assert "\n" not in str(refused.value)
    run_inner(f"--compile-cache-bundle={old}", "--compile-cache-rebuild").assert_outcomes(passed=3)
    head = old.read_bytes()[len(MAGIC):]
    size, _, rest = head.partition(b"\n")
    assert json.loads(rest[:int(size)])["format"] == FORMAT
    with read_manifest(old) as rebuilt:
        assert len(rebuilt.members(rebuilt.entries[0]).table) >= 6


def test_members_are_checked_one_by_one() -> None:
    """The table lists each artifact; reading one checks its bytes; a cut or altered one is named."""
    contents = [("inductor", "fabc", b"x" * 1000), ("autotune", "ab/k.best_config", b'{"a": 1}')]
    packed = Members.packed(contents)
    listed = unpack_table(packed.table_blob())
    assert listed == packed.table
    region = b"".join(packed.raw(member) for member in packed.table)
    members = Members(listed, lambda offset, size: region[offset:offset + size])
    assert list(members.contents()) == contents
    assert [m.key for m in members.keyed("inductor", "fabc")] == ["fabc"]
    cut = Members(listed, lambda offset, size: region[offset:offset + size - 1])
    with pytest.raises(MemberDamaged, match="inductor artifact fabc is cut short"):
        cut.read(listed[0])
    other = zlib.compress(b"y" * 1000, 1)
    swapped = Members(listed[:1], lambda offset, size: other)
    with pytest.raises(MemberDamaged, match="fails its checksum|cut short"):
        swapped.read(listed[0])
    with pytest.raises(MemberDamaged, match="table of artifacts is malformed"):
        unpack_table(zlib.compress(b'[["inductor", "k", -1, 0, "s"]]'))


def test_a_member_is_never_inflated_past_its_stated_size_and_a_table_row_must_hold_bytes() -> None:
    """A crafted member that inflates to 50 MB, stated as 100 bytes, is refused after 101; a row of zero stored
    bytes (which would share its place with the next row) makes the table malformed."""
    bomb = zlib.compress(bytes(50 * 1024 * 1024), 9)
    listed = unpack_table(zlib.compress(json.dumps([["inductor", "fbomb", len(bomb), 100, "0" * 64]]).encode()))
    tracemalloc.start()
    try:
        with pytest.raises(MemberDamaged, match="fails its checksum"):
            Members(listed, lambda offset, size: bomb).read(listed[0])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5 * 1024 * 1024, peak
    with pytest.raises(MemberDamaged, match="malformed"):
        unpack_table(zlib.compress(json.dumps([["inductor", "fa", 0, 0, "0" * 64]]).encode()))


def test_a_merge_keeps_the_intact_copy_and_leaves_out_a_damaged_autotune_result() -> None:
    """An update's union over (type, key, content): where the bundle's stored copy is damaged and the run made the
    same artifact again, the run's copy is kept (the damage is repaired); a damaged autotune result is left out."""
    from pytest_compilecache.bundle.merge import _merged

    made = [("inductor", "fk", b"x" * 100), ("autotune", "ab/k.best_config", b'{"found_by_coordesc": true}')]
    fresh = Members.packed(made)
    stored = bytearray(b"".join(fresh.raw(m) for m in fresh.table))
    for member in fresh.table:
        stored[member.offset + 3] ^= 0xFF
    old = Members(fresh.table, lambda offset, size: bytes(stored[offset:offset + size]))
    assert list(_merged([old, fresh]).contents()) == made
    only_old = _merged([old])
    assert [m.kind for m in only_old.table] == ["inductor"], "the damaged autotune result is left out"


def test_carried_binaries_are_read_one_by_one_and_each_checked(tmp_path: Path) -> None:
    """A bundle's carried binaries are listed without reading them; each file read alone is checked against its
    own checksum (a damaged one is named, the others read), and a released bundle's listing reads nothing."""
    from pytest_compilecache.bundle.binaries import BinaryDamaged, CarriedBinaries, build_id

    identity = {"compiler": "cc 1"}
    carried = CarriedBinaries(builds={build_id(identity): identity})
    for path, data in [("ab/cabc.so", b"\x7fELF" * 300), ("ab/cabc.cpp", b"int main(){}"), ("cd/cdef.so", b"so" * 50)]:
        carried.add(build_id(identity), path, data)
    path = tmp_path / "b.bundle"
    write_bundle(Bundle(path, [entry_of({"device": "cpu"}, Members.packed([("inductor", "fk", b"x")]),
                                        binaries=carried)]))
    with read_manifest(path) as bundle:
        entry = bundle.entries[0]
        section = entry.binaries_section
        listing = bundle.carried_listing(entry)
    assert entry.binaries is None, "listing reads no binary"
    fitting = listing.fitting(build_id(identity))
    assert sorted(fitting) == ["ab/cabc.cpp", "ab/cabc.so", "cd/cdef.so"]
    assert fitting["cd/cdef.so"].content() == b"so" * 50, "read after the bundle is closed, by its own descriptor"
    damaged = bytearray(path.read_bytes())
    with read_manifest(path) as bundle:
        at = sum(f[4] for f in section["files"][:[f[1] for f in section["files"]].index("ab/cabc.so")])
        damaged[bundle._start + section["offset"] + at + 2] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with read_manifest(path) as bundle:
        again = bundle.carried_listing(bundle.entries[0])
    with pytest.raises(BinaryDamaged, match="carried binary ab/cabc.so fails its checksum"):
        again.fitting(build_id(identity))["ab/cabc.so"].content()
    assert again.fitting(build_id(identity))["ab/cabc.cpp"].content() == b"int main(){}"
    bundle.release()
    with pytest.raises(BinaryDamaged, match="cannot be read"):
        again.fitting(build_id(identity))["cd/cdef.so"].content()


def test_a_member_that_cannot_be_read_while_copied_names_the_source_not_the_destination(tmp_path: Path) -> None:
    """A write copies members from where they are read; a read error there is said as such, nothing is written."""
    def fail(offset: int, size: int) -> bytes:
        raise OSError(5, "Input/output error")

    table = Members.packed([("inductor", "fk", b"x" * 10)]).table
    target = tmp_path / "out.bundle"
    with pytest.raises(BundleError, match="inductor artifact fk .* cannot be read where it is read from: Input/output"):
        write_bundle(Bundle(target, [entry_of({"device": "cpu"}, Members(table, fail))]))
    assert not target.exists() and not list(tmp_path.iterdir())


def test_an_update_copies_the_bundles_carried_binaries_as_stored_without_holding_them(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """An updating run's merge writes the binaries the bundle carries as they are stored (not inflated and compressed
    again), one at a time: its memory does not grow with them."""
    import os

    from pytest_compilecache.bundle import binaries as binaries_module
    from pytest_compilecache.bundle.binaries import CarriedBinaries, build_id
    from pytest_compilecache.storage.local import LocalStore

    identity = {"compiler": "cc 1"}
    build = build_id(identity)
    old = CarriedBinaries(builds={build: identity})
    monkeypatch.setattr(binaries_module, "_LEVEL", 0)  # stored so by an earlier version: kept so
    old.add(build, "ab/cabc.cpp", b"int main() { return 0; }\n" * 40)
    for i in range(24):
        old.add(build, f"{i:02x}/c{i:02x}.so", os.urandom(1024 * 1024))
    monkeypatch.setattr(binaries_module, "_LEVEL", 6)
    env = {"device": "cpu"}
    path = tmp_path / "b.bundle"
    write_bundle(Bundle(path, [entry_of(env, Members.packed([("inductor", "f" + "o" * 51, b"x" * 100)]), binaries=old)]))
    with read_manifest(path) as bundle:
        before = bundle.entries[0].binaries_section
        stored_before = {(f[0], f[1]): f[4] for f in before["files"]}
    new = CarriedBinaries(builds={build: identity})
    new.add(build, "ef/cnew.so", b"\x7fELF" * 1000)
    new.add(build, "ab/cabc.cpp", b"int main() { return 0; }\n" * 40)  # the pool holds what the bundle carries
    addition = entry_of(env, Members.packed([("inductor", "f" + "n" * 51, b"y" * 100)]), binaries=new)
    tracemalloc.start()
    try:
        saved = LocalStore(path, 10).add([addition], run=1.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * 1024 * 1024, f"the merge held {peak / 2**20:.1f} MB for 24 MB of carried binaries"
    with saved.bundle as bundle:  # what the update hands back reads: an updating warmup loads from it
        entry = bundle.entries[0]
        after = {(f[0], f[1]): f[4] for f in entry.binaries_section["files"]}
        listing = bundle.carried_listing(entry)
        assert not bundle.carried(entry, check=True)[1], "the section and every file pass their checksums"
    assert {key: after[key] for key in stored_before} == stored_before, "copied as stored, never compressed again"
    assert after[(build, "ef/cnew.so")] < 4000, "a file made here is compressed"
    assert listing.fitting(build)["ab/cabc.cpp"].content() == b"int main() { return 0; }\n" * 40
    assert listing.fitting(build)["ef/cnew.so"].content() == b"\x7fELF" * 1000


def test_a_pooled_file_gone_before_the_write_is_left_out_not_the_write(tmp_path: Path) -> None:
    """Pooled files are listed (their checksums taken) first and compressed when written; one removed from the pool
    in between (dropped as unloadable) is left out of the bundle, and the rest is written."""
    from pytest_compilecache.bundle.binaries import build_id
    from pytest_compilecache.session.pool import BinaryPool, pooled

    identity = {"compiler": "cc 1"}
    pool = BinaryPool(tmp_path / "pools", identity)
    for name, data in [("ab/cabc.so", b"\x7fELF" * 300), ("cd/cdef.so", b"so" * 500)]:
        (pool.path / name).parent.mkdir(parents=True, exist_ok=True)
        (pool.path / name).write_bytes(data)
    carried = pooled(tmp_path / "pools")
    assert sorted(path for _, path in carried.files) == ["ab/cabc.so", "cd/cdef.so"]
    (pool.path / "ab/cabc.so").unlink()
    path = tmp_path / "b.bundle"
    write_bundle(Bundle(path, [entry_of({"device": "cpu"}, Members.packed([("inductor", "f" + "o" * 51, b"x")]),
                                        binaries=carried)]))
    with read_manifest(path) as bundle:
        listing = bundle.carried_listing(bundle.entries[0])
    assert sorted(listing.fitting(build_id(identity))) == ["cd/cdef.so"]
    assert listing.fitting(build_id(identity))["cd/cdef.so"].content() == b"so" * 500
