"""The pack layout of a bundle at a URL (``storage/``), in a folder of this process's machine (``local://``, the same
code as an object store without a server): packs named by their content, writes that add only what the packs lack,
listings that never name a pack half written, what a compaction replaces and when it goes; URLs as text, reads by
range, and failures said with the URL and the reason."""

from __future__ import annotations

import hashlib
import io
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache.bundle.format import Bundle, BundleError, Entry, entry_of, read_manifest
from pytest_compilecache.bundle.members import Members
from pytest_compilecache.bundle.writing import write_bundle
from pytest_compilecache.storage import packs, ranges
from pytest_compilecache.storage.errors import StoreError, StoreTimeout, why
from pytest_compilecache.storage.interface import Written
from pytest_compilecache.storage.local import LocalStore
from pytest_compilecache.storage.packs import PACKS, PackStore, open_store
from pytest_compilecache.storage.ranges import Ranges
from pytest_compilecache.storage.urls import file_url_path, is_url, parse_storage_options, redacted

DAY = 24 * 3600.0


def _entry(tag: str, *tests: int) -> Entry:
    """An entry for ``cache_key_tag=tag`` holding, for each test of ``tests``, an FX graph and an AOTAutograd entry
    of its own (3 kB each, incompressible)."""
    members = Members.packed((kind, f"{prefix}{'0' * 47}{n:04x}", random.Random(f"{kind}{n}").randbytes(3000))
                             for n in tests for kind, prefix in (("inductor", "f"), ("aot_autograd", "a")))
    return entry_of({"device": "cpu", "torch": "2.13.0+cpu", "cache_key_tag": tag}, members)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"local://{tmp_path / 'store' / 'suite.bundle'}"


@pytest.fixture
def folder(url: str) -> Path:
    """The folder of packs under ``url``."""
    return Path(url.removeprefix("local://")) / PACKS


def _store(url: str, tmp_path: Path, machine: str = "a") -> PackStore:
    """The store at ``url`` as seen from a machine of its own (its own folder of kept parts)."""
    return PackStore(url, tmp_path / f"copies-{machine}", 30)


def _tags(bundle: Bundle | None) -> list[str]:
    assert bundle is not None
    return sorted(e.env["cache_key_tag"] for e in bundle.entries)


def _keys(bundle: Bundle, tag: str) -> set[str]:
    """The last four characters of the keys of ``tag``'s entry (its tests' numbers, in hex)."""
    entry = next(e for e in bundle.entries if e.env["cache_key_tag"] == tag)
    return {m.key[-4:] for m in bundle.members(entry).table}


def _pack(url: str, tmp_path: Path, entries: list[Entry], supersedes: tuple[str, ...], written: float) -> str:
    """Upload a pack written at ``written`` (a writer on another machine, at another time); its name."""
    made = tmp_path / f"made-{written}.bundle"
    write_bundle(Bundle(made, entries, supersedes=supersedes, written=written))
    name = f"{hashlib.sha256(made.read_bytes()).hexdigest()[:32]}.bundle"
    _store(url, tmp_path, "uploader").client.put(made, f"{PACKS}/{name}")
    return name


# --- names, writes, listings ------------------------------------------------------------------------

def test_a_pack_is_named_after_the_checksum_of_its_bytes(url: str, folder: Path, tmp_path: Path) -> None:
    _store(url, tmp_path).add([_entry("x", 1, 2)])
    _store(url, tmp_path, "b").add([_entry("y", 3)])
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == 2
    assert names == sorted(f"{hashlib.sha256((folder / n).read_bytes()).hexdigest()[:32]}.bundle" for n in names)


def test_a_write_of_what_the_packs_hold_writes_nothing(url: str, folder: Path, tmp_path: Path) -> None:
    _store(url, tmp_path).add([_entry("x", 1, 2, 3)])
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    again = _store(url, tmp_path, "b").add([_entry("x", 2, 3)])
    assert again.status is Written.UNCHANGED and again.transfer.uploaded == 0
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    again.bundle.release()


def test_a_pack_written_again_under_its_name_is_the_same_object(url: str, folder: Path, tmp_path: Path) -> None:
    """Two writers of the same bytes write the same name: the second changes nothing a reader sees."""
    name = _pack(url, tmp_path, [_entry("x", 1)], (), 1000.0)
    first = (folder / name).read_bytes()
    _store(url, tmp_path, "another").client.put(tmp_path / "made-1000.0.bundle", f"{PACKS}/{name}")
    assert [p.name for p in folder.iterdir()] == [name] and (folder / name).read_bytes() == first


def test_a_pack_lists_only_what_its_write_added(url: str, folder: Path, tmp_path: Path) -> None:
    _store(url, tmp_path).add([_entry("x", 1, 2)], run=1.0)
    first = {p.name for p in folder.iterdir()}
    saved = _store(url, tmp_path, "b").add([_entry("x", 1, 2, 3), _entry("y", 4)], run=2.0)
    assert saved.status is Written.SAVED and saved.added_artifacts == {"inductor": 2, "aot_autograd": 2}
    (added,) = {p.name for p in folder.iterdir()} - first
    with read_manifest(folder / added) as pack:
        assert _keys(pack, "x") == {"0003"} and _keys(pack, "y") == {"0004"}
        assert pack.supersedes == (), "an addition replaces no pack"
    assert _keys(saved.bundle, "x") == {"0001", "0002", "0003"}, "readers see the union"
    saved.bundle.release()


def test_a_listing_never_names_a_pack_not_fully_written(url: str, folder: Path, tmp_path: Path) -> None:
    store = _store(url, tmp_path)
    store.add([_entry("x", 1)])
    (name,) = store._listing()
    (folder / f".{name}.0123abcd.part").write_bytes(b"half an upload")
    (folder / "notes.txt").write_text("not a pack")
    assert list(_store(url, tmp_path, "b")._listing()) == [name]


def test_an_upload_shows_its_pack_whole_or_not_at_all(url: str, folder: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """While a pack's bytes are written, no listing names it; an upload that fails leaves nothing behind and
    says the URL, the pack and the reason."""
    store = _store(url, tmp_path)
    fs = store.client.filesystem()[0]
    put_file = fs.put_file
    seen: list[dict[str, int]] = []

    def watched(source: str, target: str, **kwargs: Any) -> Any:
        done = put_file(source, target, **kwargs)
        seen.append(_store(url, tmp_path, "reader")._listing())
        return done

    monkeypatch.setattr(fs, "put_file", watched)
    store.add([_entry("x", 1)])
    assert seen == [{}], "written in full, still not listed"
    assert len(list(folder.iterdir())) == 1

    def cut(*args: Any, **kwargs: Any) -> None:
        raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(fs, "mv", cut)
    with pytest.raises(StoreError, match=f"^{url}: uploading {PACKS}/[0-9a-f]{{32}}.bundle failed: .*reset by peer"):
        store.add([_entry("y", 2)])
    assert len(list(folder.iterdir())) == 1, "no part of the cut upload is left"


def test_what_a_machine_read_of_a_pack_serves_its_next_reader(url: str, tmp_path: Path) -> None:
    _store(url, tmp_path, "writer").add([_entry("x", 1, 2, 3)])
    for downloads in (True, False):
        reader = _store(url, tmp_path, "reader")
        bundle = reader.read(_entry("x").env)
        assert bundle is not None
        bundle.fetch_ahead(bundle.entries[0])
        assert len(list(bundle.members(bundle.entries[0]).contents())) == 6
        assert (reader.transfer.downloaded > 0) is downloads, reader.transfer
        bundle.release()


def test_describe_counts_the_packs_without_reading_them(url: str, tmp_path: Path) -> None:
    store = _store(url, tmp_path)
    look = store.describe()
    assert not look.exists and look.text == f"{store.name}: missing, the session will create it"
    store.add([_entry("x", 1)])
    store.add([_entry("y", 2)])
    look = _store(url, tmp_path, "b").describe()
    assert look.exists and look.text.startswith(f"{store.name}: 2 packs, ") and look.problem == ""


# --- compaction: supersedes, and the day a replaced pack stays ------------------------------------

def test_a_compaction_names_the_packs_it_replaces_and_readers_skip_them(url: str, folder: Path,
                                                                      tmp_path: Path) -> None:
    store = _store(url, tmp_path)
    store.add([_entry("x", 1)])
    store.add([_entry("y", 2)])
    read = set(store._listing())
    early = _store(url, tmp_path, "early").read()
    written = store.update(lambda current: [e for e in current.entries if e.env["cache_key_tag"] == "y"]
                           if current else [])
    assert _tags(written) == ["y"]
    (new,) = set(store._listing()) - read
    with read_manifest(folder / new) as pack:
        assert set(pack.supersedes) == read and time.time() - pack.written < 60
    assert set(store._listing()) == read | {new}, "the replaced packs stay for readers that listed them"
    assert _tags(_store(url, tmp_path, "late").read()) == ["y"]
    assert early is not None and _keys(early, "x") == {"0001"}, "a reader from before reads on"


def test_a_pack_replaced_more_than_a_day_ago_goes_with_the_next_compaction(url: str, tmp_path: Path) -> None:
    now = time.time()
    old = _pack(url, tmp_path, [_entry("x", 1)], (), now - 3 * DAY)
    recent = _pack(url, tmp_path, [_entry("y", 2)], (), now - 3 * DAY + 1)
    _pack(url, tmp_path, [_entry("x", 1)], (old,), now - DAY - 60)  # a day and a minute ago
    _pack(url, tmp_path, [_entry("y", 2)], (recent,), now - DAY + 60)  # a minute short of a day
    store = _store(url, tmp_path)
    assert _tags(store.read()) == ["x", "y"]
    store.update(lambda current: current.entries if current else [])
    listed = set(store._listing())
    assert old not in listed and recent in listed, "only what was replaced more than 24 hours ago goes"


def test_removal_goes_earliest_replaced_first_and_stops_at_the_first_that_stays(
        url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    first = _pack(url, tmp_path, [_entry("x", 1)], (), now - 5 * DAY)
    second = _pack(url, tmp_path, [_entry("y", 2)], (), now - 5 * DAY + 1)
    _pack(url, tmp_path, [_entry("x", 1)], (first,), now - 3 * DAY)
    _pack(url, tmp_path, [_entry("y", 2)], (second,), now - 2 * DAY)
    store = _store(url, tmp_path)
    asked: list[str] = []
    monkeypatch.setattr(store.client, "remove", lambda name: asked.append(name) and False)
    said: list[str] = []
    store.update(lambda current: current.entries if current else [], dropped=said)
    assert asked == [f"{PACKS}/{first}"], "the earliest replaced first; none after one that stays"
    assert said == [f"2 packs replaced more than a day ago could not be removed ({first}, {second}); the next "
                    "prune tries again"]
    assert {first, second} <= set(store._listing())


def test_the_object_at_the_url_itself_is_read_as_a_pack_kept_in_memory_and_never_replaced(
        url: str, tmp_path: Path) -> None:
    """A bundle file at the URL (the layout before packs, or a file served over HTTP) is the pack "": read as one
    more, kept in this process's memory only (it may change), and out of reach of any pack's list of replaced ones."""
    own = Path(url.removeprefix("local://"))
    own.parent.mkdir(parents=True)
    write_bundle(Bundle(own, [_entry("legacy", 1)]))
    store = _store(url, tmp_path)
    assert list(store._listing()) == [""] and _tags(store.read()) == ["legacy"]
    assert [p for p in (tmp_path / "copies-a").rglob("*") if p.is_file() and not p.name.endswith(".lock")] == []
    forged = Bundle(tmp_path / "forged.bundle", [], supersedes=("", "old.bundle"), written=1.0)
    assert packs._replaces(forged) == ("old.bundle",)


def test_open_store_picks_packs_for_a_url_and_a_file_for_a_path(tmp_path: Path) -> None:
    assert isinstance(open_store(f"local://{tmp_path}/b.bundle", 30, tmp_path), PackStore)
    assert isinstance(open_store(tmp_path / "b.bundle", 30, tmp_path), LocalStore)
    local = open_store(f"file://{tmp_path}/b.bundle", 30, tmp_path)
    assert isinstance(local, LocalStore) and local.name == str(tmp_path / "b.bundle")


# --- URLs as text -----------------------------------------------------------------------------------

def test_a_url_is_told_from_a_path() -> None:
    assert is_url("s3://bucket/b.bundle") and is_url("local:///tmp/b") and is_url("memory://b.bundle")
    assert not is_url("/tmp/b.bundle") and not is_url("C:\\ci\\b.bundle") and not is_url("c://ci/b.bundle")
    assert not is_url("file:///tmp/b.bundle"), "a file:// URL is a path"


def test_a_file_url_names_a_path_on_this_machine_only() -> None:
    assert file_url_path("file:///tmp/a%20b/x.bundle") == "/tmp/a b/x.bundle"
    assert file_url_path("FILE://localhost/tmp/x.bundle") == "/tmp/x.bundle"
    assert file_url_path("s3://b/x.bundle") is None
    with pytest.raises(BundleError, match="^file://build-host/x.bundle: a file:// URL names a path on this machine"):
        file_url_path("file://build-host/x.bundle")


def test_messages_show_a_url_without_its_credentials() -> None:
    assert redacted("https://user:pw@cdn.example/b.bundle?X-Amz-Signature=abc") == "https://cdn.example/b.bundle"
    assert redacted("abfs://container@account.dfs.core.windows.net/b.bundle") == \
        "abfs://container@account.dfs.core.windows.net/b.bundle", "a name without a password is no credential"
    assert redacted("s3://bucket/b.bundle") == "s3://bucket/b.bundle"


def test_storage_options_are_a_json_object() -> None:
    assert parse_storage_options(' {"endpoint_url": "http://127.0.0.1:9000"} ') == {
        "endpoint_url": "http://127.0.0.1:9000"}
    assert parse_storage_options("  ") == {}
    for bad, said in (("[1]", "must be a JSON object, e.g."), ("{", "must be a JSON object: ")):
        with pytest.raises(ValueError, match=said):
            parse_storage_options(bad)


# --- reads by range ---------------------------------------------------------------------------------

def test_ranges_read_as_a_file_a_chunk_a_request_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranges, "CHUNK_BYTES", 10)
    data = bytes(range(256)) * 4
    asked: list[tuple[int, int]] = []

    def read(start: int, end: int) -> bytes:
        asked.append((start, end))
        return data[start:end]

    file = Ranges(read, len(data))
    assert file.seek(-24, io.SEEK_END) == 1000 and file.read(100) == data[1000:]
    assert file.read(5) == b"", "nothing past the end"
    assert file.seek(3) == 3 and file.read(25) == data[3:28] and file.tell() == 28
    assert file.read_at(500, 35) == data[500:535] and file.read_at(1020, 10) == data[1020:]
    assert max(end - start for start, end in asked) <= 10
    assert all(start < end for start, end in asked)


def test_a_range_that_cannot_be_read_is_a_file_that_cannot_be_read() -> None:
    def read(start: int, end: int) -> bytes:
        raise StoreError("s3://b/x.bundle: cannot read packs/p.bundle: connection reset")

    with pytest.raises(OSError, match="^s3://b/x.bundle: cannot read packs/p.bundle: connection reset$"):
        Ranges(read, 100).read_at(0, 10)


# --- failures, said with the URL and the reason -----------------------------------------------------

def test_a_pack_removed_while_it_is_read_is_said_with_the_url(url: str, folder: Path, tmp_path: Path) -> None:
    _store(url, tmp_path).add([_entry("x", *range(1, 30))])  # past the pack's first 64 kB, which is read at once
    bundle = _store(url, tmp_path, "reader").read(_entry("x").env)
    assert bundle is not None
    for pack in folder.iterdir():
        pack.unlink()
    members = bundle.members(bundle.entries[0])
    with pytest.raises(Exception, match=f"{url}: cannot read {PACKS}/.*: it was removed while it was read"):
        members.read(members.table[-1])


def test_plain_http_is_read_only_before_anything_is_asked(tmp_path: Path) -> None:
    store = PackStore("https://user:pw@cdn.example/b.bundle?sig=1", tmp_path, 30)
    for write in (lambda: store.add([_entry("x", 1)]), lambda: store.update(lambda current: [])):
        with pytest.raises(BundleError, match=r"^https://cdn.example/b.bundle: https:// bundles are read-only; "
                                              r"nothing was published \(publish to an object store"):
            write()
    assert store.transfer.downloaded == 0


def test_a_store_another_process_gave_up_on_is_not_asked(url: str, tmp_path: Path) -> None:
    said = f"{url}: no answer within 30 s while listing packs/; this session goes on without it"
    store = PackStore(url, tmp_path, 30, unreachable=said)
    with pytest.raises(StoreTimeout, match="^" + re.escape(said)):
        store.read()
    assert store.unreachable == said and store.describe().problem == said
    assert not (tmp_path / "store").exists()


def test_a_store_that_cannot_be_opened_is_named_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="^nosuchscheme://bucket/b.bundle: .*nosuchscheme"):
        PackStore("nosuchscheme://bucket/b.bundle", tmp_path, 30).read()


def test_a_clients_exceptions_in_words() -> None:
    assert why(FileNotFoundError(2, "No such file or directory")) == \
        "no such object or bucket (No such file or directory)"
    assert why(PermissionError("Forbidden")) == "access denied (Forbidden); check the credentials"
    assert why(ConnectionResetError("reset by peer")) == "ConnectionResetError: reset by peer"
    assert "shorter than the Content-Length" in why(type("ClientPayloadError", (Exception,), {})("cut"))
