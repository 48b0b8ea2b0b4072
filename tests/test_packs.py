"""The pack layout of a bundle at a URL, in a folder of this machine (``local://``: the same code as an object
store, without a server): what a reader downloads, what a writer uploads, and what pruning removes when."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from pytest_compilecache.bundle.format import Entry, entry_of, read_manifest
from pytest_compilecache.bundle.members import Members
from pytest_compilecache.storage import packs
from pytest_compilecache.storage.interface import Written
from pytest_compilecache.storage.packs import PACKS, PackStore
from pytest_compilecache.storage.ranges import HEAD_BYTES

DATA_BUNDLE = Path(__file__).parent / "data" / "h200-torch2.11.bundle"


def _entry(tag: str, *tests: int) -> Entry:
    """An entry for the GPU machine of the bundle in tests/data, ``cache_key_tag=tag``, holding for each test of
    ``tests`` an FX graph and an AOTAutograd entry of its own (30 kB each, incompressible; no torch needed)."""
    with read_manifest(DATA_BUNDLE) as bundle:
        env = {**bundle.entries[0].env, "cache_key_tag": tag}
    members = Members.packed((kind, f"{prefix}{'0' * 47}{n:04x}", random.Random(f"{kind}{n}").randbytes(30_000))
                             for n in tests for kind, prefix in (("inductor", "f"), ("aot_autograd", "a")))
    return entry_of(env, members)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"local://{tmp_path / 'store' / 'suite.bundle'}"


def _listed(url: str, tmp_path: Path) -> dict[str, int]:
    """The packs a reader sees."""
    return PackStore(url, tmp_path / "lister", 30)._listing()


def test_one_test_of_many_downloads_its_own_artifacts_and_the_tables(url: str, tmp_path: Path) -> None:
    PackStore(url, tmp_path / "writer", 30).add([_entry("t", *range(1, 41))])
    (stored,) = _listed(url, tmp_path).values()
    reader = PackStore(url, tmp_path / "reader", 30)
    bundle = reader.read(_entry("t").env)
    assert bundle is not None
    entry = bundle.find(_entry("t").env)
    assert entry is not None
    members = bundle.members(entry)
    wanted = [m for m in members.table if m.key.endswith("0027")]
    assert len(wanted) == 2 and [c for _, _, c in members.contents(wanted)]
    moved = reader.transfer.downloaded
    assert moved <= HEAD_BYTES + sum(m.stored for m in wanted) < stored / 10, (moved, stored)
    bundle.fetch_ahead(entry)
    assert stored - HEAD_BYTES <= reader.transfer.downloaded <= stored + HEAD_BYTES, \
        "ahead: the rest of the pack, in few requests (what lies between two of them read again)"
    again = PackStore(url, tmp_path / "reader", 30)
    bundle = again.read(_entry("t").env)
    assert bundle is not None
    assert [c for _, _, c in bundle.members(bundle.entries[0]).contents()] and again.transfer.downloaded == 0, \
        "a pack never changes: what this machine read serves the next reader"


def test_a_writer_uploads_what_the_packs_lack_and_a_record_of_its_run(url: str, tmp_path: Path) -> None:
    store = PackStore(url, tmp_path / "a", 30)
    assert store.add([_entry("t", *range(1, 21))], run=1.0).status is Written.SAVED
    (first,) = _listed(url, tmp_path).values()
    saved = PackStore(url, tmp_path / "b", 30).add([_entry("t", *range(1, 22))], run=2.0)
    assert saved.status is Written.SAVED and saved.added_artifacts == {"inductor": 1, "aot_autograd": 1}
    assert saved.transfer.uploaded < first / 10, "one test's artifacts, not the bundle again"
    entry = saved.bundle.find(_entry("t").env)
    assert entry is not None and len(saved.bundle.members(entry).table) == 42
    index, _ = saved.bundle.key_index(entry)
    assert index is not None and index.runs == [1.0, 2.0], "each run's record of what it used"
    unchanged = PackStore(url, tmp_path / "c", 30).add([_entry("t", 5)], run=3.0)
    assert unchanged.status is Written.UNCHANGED and unchanged.transfer.uploaded == 0


def test_a_pack_is_named_by_its_content_and_no_upload_in_progress_is_listed(url: str, tmp_path: Path) -> None:
    import hashlib

    name = PackStore(url, tmp_path / "a", 30)._write([_entry("t", 1)], [])
    folder = Path(url.removeprefix("local://")) / PACKS
    assert name == hashlib.sha256((folder / name).read_bytes()).hexdigest()[:32] + ".bundle"
    (folder / f".{name}.0123.part").write_bytes(b"half an upload")
    assert list(_listed(url, tmp_path)) == [name], "an upload in progress is no pack"


def test_replaced_packs_are_skipped_at_once_and_removed_after_the_grace(url: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = PackStore(url, tmp_path / "a", 30)
    store.add([_entry("x", 1)])
    store.add([_entry("y", 2)])
    early = PackStore(url, tmp_path / "early", 30).read()
    assert early is not None and len(early.entries) == 2
    store.update(lambda current: [e for e in current.entries if e.env["cache_key_tag"] == "y"] if current else [])
    assert len(_listed(url, tmp_path)) == 3, "the replaced packs stay for readers that listed them"
    bundle = PackStore(url, tmp_path / "late", 30).read()
    assert bundle is not None and [e.env["cache_key_tag"] for e in bundle.entries] == ["y"]
    x = early.find(_entry("x").env)
    assert x is not None and [c for _, _, c in early.members(x).contents()], "the early reader reads on"
    monkeypatch.setattr(packs, "GRACE_SECONDS", 0.0)
    time.sleep(0.01)
    store.update(lambda current: current.entries if current else [])
    names = list(_listed(url, tmp_path))
    assert len(names) == 2, names
    bundle = PackStore(url, tmp_path / "last", 30).read()
    assert bundle is not None and [e.env["cache_key_tag"] for e in bundle.entries] == ["y"]


def test_prune_drops_what_the_last_runs_did_not_use_from_their_records(url: str, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_compilecache import cli

    PackStore(url, tmp_path / "a", 30).add([_entry("t", 1, 2, 3)], run=1.0)
    PackStore(url, tmp_path / "b", 30).add([_entry("t", 3, 4)], run=2.0)
    assert cli.main(["prune", url, "--max-unused-runs", "1"]) == 0
    assert "dropped as unused in the last 1 updating run: 2 fx_graph, 2 aot_autograd" in \
        capsys.readouterr().out, "tests 1 and 2: no record of the last run names them"
    bundle = PackStore(url, tmp_path / "c", 30).read()
    assert bundle is not None
    keys = {m.key[-4:] for m in bundle.members(bundle.entries[0]).table}
    assert keys == {"0003", "0004"}, "what the last run used stays"


def test_with_the_key_set_only_a_sealed_list_replaces_packs(url: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer without the signing key (store credentials only) uploads a pack that claims to replace every
    other: readers with the key ignore the claim, and a prune removes nothing for it; a prune made with the
    key replaces packs as usual."""
    from pytest_compilecache.bundle.format import Bundle
    from pytest_compilecache.bundle.writing import write_bundle

    monkeypatch.setenv("PYTEST_COMPILE_CACHE_KEY", "s3cret")
    store = PackStore(url, tmp_path / "a", 30)
    store.add([_entry("x", 1)])
    store.add([_entry("y", 2)])
    names = sorted(_listed(url, tmp_path))
    forged = tmp_path / "forged.bundle"
    monkeypatch.delenv("PYTEST_COMPILE_CACHE_KEY")
    write_bundle(Bundle(forged, [], supersedes=tuple(names), written=1.0))
    monkeypatch.setenv("PYTEST_COMPILE_CACHE_KEY", "s3cret")
    store.client.put(forged, f"{PACKS}/forged.bundle")
    bundle = PackStore(url, tmp_path / "b", 30).read()
    assert bundle is not None and sorted(e.env["cache_key_tag"] for e in bundle.entries) == ["x", "y"]
    monkeypatch.setattr(packs, "GRACE_SECONDS", 0.0)
    store.update(lambda current: current.entries if current else [])
    assert set(names) <= set(_listed(url, tmp_path)), "nothing removed on an unsealed claim"
    store.update(lambda current: [e for e in current.entries if e.env["cache_key_tag"] == "y"] if current else [])
    bundle = PackStore(url, tmp_path / "c", 30).read()
    assert bundle is not None and [e.env["cache_key_tag"] for e in bundle.entries] == ["y"]



def test_a_readers_lock_held_too_long_leaves_each_part_read_when_asked(url: str, tmp_path: Path) -> None:
    """Another process holds this machine's readers' lock past the lock timeout: the bundle is still read (its
    tables, then each artifact when asked), never refused."""
    import filelock

    PackStore(url, tmp_path / "writer", 30).add([_entry("t", 1, 2)])
    reader = PackStore(url, tmp_path / "reader", 0.2)
    held = filelock.FileLock(reader._readers.file)
    held.acquire()
    try:
        bundle = reader.read(_entry("t").env)
        assert bundle is not None
        entry = bundle.find(_entry("t").env)
        assert entry is not None
        bundle.fetch_ahead(entry)
        assert len([c for _, _, c in bundle.members(entry).contents()]) == 4
    finally:
        held.release()
