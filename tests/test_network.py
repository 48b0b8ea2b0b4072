"""Networks that fail the way CI networks do, on loopback, in front of real servers (moto's S3 server,
Azurite, ``http.server``): a listener that never answers, an upload cut midway, a trickle, a download
that stalls, and answers that lie. No operation may hang; nothing half-sent is ever used or left (a
pack appears whole or not at all); a download asks a chunk at a time; and neither a reader nor a
writer holds the bundle whole in memory."""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import http.server
import os
import shutil
import stat
import subprocess
import threading
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from pytest_compilecache import files
from pytest_compilecache.bundle.format import BundleError, Entry, entry_of, read_manifest
from pytest_compilecache.bundle.members import Members
from pytest_compilecache.storage import client, packs, ranges
from pytest_compilecache.storage.errors import StoreTimeout
from pytest_compilecache.storage.packs import PackStore
from servers import Blackhole, FaultProxy, azurite_connection, azurite_server, s3_server

pytestmark = pytest.mark.floors

DATA_BUNDLE = Path(__file__).parent / "data" / "h200-torch2.11.bundle"
S3_KEYS = {"key": "testing", "secret": "testing"}


def _entry(tag: str) -> Entry:
    """The entry of the GPU bundle in tests/data (64 kB once written), as if made for ``cache_key_tag=tag``."""
    with read_manifest(DATA_BUNDLE) as bundle:
        bundle.read_all()
        entry = bundle.entries[0]
    return dataclasses.replace(entry, env={**entry.env, "cache_key_tag": tag})


def _large_entry(tag: str, copies: int) -> Entry:
    """An entry holding the real artifacts of the bundle in tests/data ``copies`` times over, each copy under
    keys of its own (about 64 kB a copy once written), as if made for ``cache_key_tag=tag``."""
    with read_manifest(DATA_BUNDLE) as bundle:
        entry = bundle.entries[0]
        contents = list(bundle.members(entry).contents())
    members = Members.packed((kind, f"{key}-{n}", content) for n in range(copies) for kind, key, content in contents)
    return entry_of({**entry.env, "cache_key_tag": tag}, members)


@pytest.fixture(autouse=True)
def own_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AZURE_STORAGE_CONNECTION_STRING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture(scope="module")
def moto() -> Iterator[int]:
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install 'pytest-compilecache[test]')")
    pytest.importorskip("moto.server", reason="moto's server is not installed (pip install 'moto[server]')")
    with s3_server() as (url, _):
        yield int(url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def azurite() -> Iterator[int]:
    if shutil.which("azurite-blob") is None:
        pytest.skip("azurite is not installed (npm install -g azurite; .ci/run installs it)")
    pytest.importorskip("adlfs", reason="adlfs is not installed (pip install 'pytest-compilecache[azure]')")
    with azurite_server() as port:
        yield port


def _s3_bucket(port: int) -> str:
    import s3fs

    name = f"bundles-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(**S3_KEYS, endpoint_url=f"http://127.0.0.1:{port}", skip_instance_cache=True).mkdir(name)
    return name


def _az_container(port: int) -> str:
    import adlfs

    name = f"bundles-{uuid.uuid4().hex[:12]}"
    adlfs.AzureBlobFileSystem(connection_string=azurite_connection(port), skip_instance_cache=True).mkdir(name)
    return name


def _options(kind: str, port: int) -> dict[str, Any]:
    """fsspec's options that reach the store at ``port`` (the server's own, or a fault's in front of it)."""
    if kind == "s3":
        return {**S3_KEYS, "endpoint_url": f"http://127.0.0.1:{port}", "skip_instance_cache": True}
    return {"connection_string": azurite_connection(port), "skip_instance_cache": True}


def _store(url: str, folder: Path, options: dict[str, Any], timeout: float = 30.0) -> PackStore:
    return PackStore(url, folder, 60.0, options, network_timeout=timeout)


def _objects(kind: str, port: int, root: str) -> dict[str, bytes]:
    """Every object under ``root`` (a bucket or container) in the store at ``port``, by path: what a reader
    of any URL there could see."""
    import fsspec

    fs = fsspec.filesystem("s3" if kind == "s3" else "az", **_options(kind, port))
    fs.invalidate_cache()
    return {path: fs.cat_file(path) for path in fs.find(root)}


def _whole_packs(objects: dict[str, bytes]) -> bool:
    """Whether every object is a pack under ``packs/`` whose name is its content's checksum: each one was
    stored whole (a part of one would not be named so)."""
    return all(path.rsplit("/", 2)[-2] == packs.PACKS
               and path.rsplit("/", 1)[-1] == f"{hashlib.sha256(data).hexdigest()[:32]}.bundle"
               for path, data in objects.items())


# --- a store that never answers ------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["http", "s3", "az"])
def test_a_store_that_never_answers_gives_up_within_the_deadline(kind: str, tmp_path: Path) -> None:
    """Reading gives up after the network timeout with a message naming the store, what it was doing
    (asking for the object at the URL, the first request) and how long it waited; once it gave up, the
    store is not asked again in the same process: reading, writing and describing it say the same at once.
    The wait is the client's own, cancelled on fsspec's event loop: no thread of ours is left running."""
    threads = set(threading.enumerate())
    if kind == "s3":
        pytest.importorskip("s3fs")
    if kind == "az":
        pytest.importorskip("adlfs")
    with Blackhole() as hole:
        url = {"http": f"http://127.0.0.1:{hole.port}/b.bundle", "s3": "s3://bucket/b.bundle",
               "az": "az://container/b.bundle"}[kind]
        options = {} if kind == "http" else _options(kind, hole.port)
        store = _store(url, tmp_path / "copies", options, timeout=2.0)
        started = time.monotonic()
        with pytest.raises(StoreTimeout) as first:
            store.read({"device": "cpu"})
        waited = time.monotonic() - started
        assert 1.5 < waited < 15, waited
        message = str(first.value)
        assert url in message and "no answer within 2 s" in message and "asking for it" in message, message
        assert store.unreachable == message
        mine = _entry("mine")
        started = time.monotonic()
        with pytest.raises(StoreTimeout) as again:
            store.read()
        if kind != "http":
            with pytest.raises(StoreTimeout) as written:
                store.add([mine])
            assert str(written.value) == message
        assert store.describe().problem == message
        assert time.monotonic() - started < 1.0
        assert str(again.value) == message, "the same problem, said once"
        left = [t.name for t in set(threading.enumerate()) - threads
                if t.name != "fsspecIO" and not t.name.startswith("asyncio_") and not t.name.endswith("(_accept)")]
        assert not left, left


SESSION_TESTS = '''
import torch

def test_warm(warm_cache):
    torch.compile(lambda x: torch.sin(x) + 1, dynamic=False)(torch.randn(8))
    assert warm_cache.stats.fx_graph.hits == 1
'''
SESSION_WARMUP = '''
import torch

def pytest_compilecache_warmup(cache):
    torch.compile(lambda x: torch.sin(x) + 1, dynamic=False)(torch.randn(8))
'''


@pytest.mark.slow
def test_a_session_against_a_store_that_never_answers_runs_warm_without_it(
        tmp_path: Path, shared_headers_dir: Path,
        run_session: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """The whole session: the bundle's store (S3, its endpoint from the environment) never answers; the
    warmup runs locally, the warm test hits, the summary names the store, the operation and the wait;
    strict mode fails the session instead. (How each kind of store gives up is the client's, checked for
    HTTP, S3 and Azure by ``test_a_store_that_never_answers_gives_up_within_the_deadline``; what the
    session makes of it is the same for every kind.)"""
    pytest.importorskip("s3fs")
    (tmp_path / "test_model.py").write_text(SESSION_TESTS)
    (tmp_path / "conftest.py").write_text(SESSION_WARMUP)
    (tmp_path / "pytest.ini").write_text(f"[pytest]\ncompile_cache_headers_dir = {shared_headers_dir}\n")
    with Blackhole() as hole:
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"),
               "AWS_ENDPOINT_URL": f"http://127.0.0.1:{hole.port}"}
        url = "s3://bucket/b.bundle"
        args = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                f"--compile-cache-bundle={url}", "--compile-cache-network-timeout=2"]
        started = time.monotonic()
        done = run_session(args, tmp_path, env, 240)
        took = time.monotonic() - started
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        assert "1 passed" in out, out
        assert f"{url}: no answer within 2 s" in out, out
        assert out.count("no answer within") == 1, out
        assert f"{url} was neither read nor written: it gave no answer" in out, out
        assert took < 120, took
        strict = run_session([*args, "--compile-cache-strict"], tmp_path, env, 240)
        assert strict.returncode != 0, strict.stdout + strict.stderr
        assert "no answer within 2 s" in strict.stdout + strict.stderr


# --- uploads cut midway --------------------------------------------------------------------------

@pytest.mark.slow
def test_an_upload_cut_midway_leaves_no_pack(moto: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every upload to moto's S3 server reset after 16 kB: with no pack, none appears (nor anything else
    under the URL); with one, it stays, byte for byte, and is still the only object; the next writer on a
    sound network adds its pack, and both entries read back. (The deadline's allowance for a slow link is
    lifted: the store's client retries a cut upload until the deadline.) A failed upload is the same
    ``Client.put`` for every store; Azure's client after a cut is
    ``test_an_upload_cut_once_is_sent_again_from_its_first_byte[az]``."""
    monkeypatch.setattr(client, "MIN_RATE", 10**9)
    kind, port = "s3", moto
    root = _s3_bucket(port)
    url = f"{kind}://{root}/b.bundle"
    direct = _store(url, tmp_path / "direct", _options(kind, port))
    with FaultProxy(port, cut_uploads_after=16 * 1024) as cut:
        through = _store(url, tmp_path / "through", _options(kind, cut.port), timeout=3.0)
        with pytest.raises(BundleError):
            through.add([_entry("first")])
        assert cut.cuts >= 1
        assert _objects(kind, port, root) == {}
        assert direct.read() is None
        direct.add([_entry("first")]).bundle.release()
        before, cuts = _objects(kind, port, root), cut.cuts
        assert len(before) == 1 and _whole_packs(before), sorted(before)
        # a store of its own: the first one gave up on the cut store and would not even try again
        again = _store(url, tmp_path / "again", _options(kind, cut.port), timeout=3.0)
        with pytest.raises(BundleError):
            again.add([_entry("second")])
        assert cut.cuts > cuts, "the upload of a second pack was cut too"
        assert _objects(kind, port, root) == before
    saved = direct.add([_entry("second")])
    saved.bundle.release()
    after = _objects(kind, port, root)
    assert len(after) == 2 and _whole_packs(after) and set(before) < set(after), sorted(after)
    found = _store(url, tmp_path / "reader", _options(kind, port)).read()
    assert found is not None
    assert sorted(e.env["cache_key_tag"] for e in found.entries) == ["first", "second"]
    found.release()


# --- slow and stalled downloads, and answers that lie ----------------------------------------------

class _Files(http.server.SimpleHTTPRequestHandler):
    """A static file server with a few ways to lie, chosen by the path's first part."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        if not self._lie():
            super().do_HEAD()

    def do_GET(self) -> None:
        if not self._lie():
            super().do_GET()

    def _lie(self) -> bool:
        mode, _, rest = self.path.lstrip("/").partition("/")
        data = DATA_BUNDLE.read_bytes()
        if mode == "loop":
            self.send_response(302)
            self.send_header("Location", f"/loop/{rest}")
            self.end_headers()
        elif mode == "html":
            page = b"<html><body><h1>Gateway says hello</h1></body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(page)
        elif mode == "refuse" and self.command == "GET":  # it is there, but no range of it is sent
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif mode in ("short", "longer"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(data) + (1000 if mode == "longer" else 0)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(data[: len(data) // 2] if mode == "short" else data)
            self.close_connection = True
        else:
            return False
        return True


@pytest.fixture
def served(tmp_path: Path) -> Iterator[int]:
    """``http.server`` on loopback serving tests/data (its port)."""
    folder = tmp_path / "served"
    folder.mkdir()
    shutil.copy(DATA_BUNDLE, folder / "b.bundle")

    def handler(*args: Any) -> _Files:
        return _Files(*args, directory=str(folder))

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def _read(store: PackStore, env: dict[str, str] | None = None) -> int:
    """Read the entry for ``env`` (tests/data's, by default) as a session does: the packs' tables, then
    everything it holds at once (``fetch_ahead``), then every artifact, each checked; how many bytes of
    artifacts."""
    if env is None:
        with read_manifest(DATA_BUNDLE) as bundle:
            env = bundle.entries[0].env
    found = store.read(env)
    assert found is not None
    entry = found.find(env)
    assert entry is not None
    try:
        found.fetch_ahead(entry)
        return sum(len(content) for *_, content in found.members(entry).contents())
    finally:
        found.release()


@pytest.mark.parametrize("layout", ["packs", "object"])
def test_a_download_is_split_by_memory(layout: str, moto: int, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A download asks for at most CHUNK_BYTES a request (16 kB here, and a pack's first read as much),
    whether it reads packs (their heads and tables, then an entry's artifacts at once) or a bundle
    stored whole at the URL (read as one pack, by range as it is parsed)."""
    import s3fs

    chunk = 16 * 1024
    for module, name in [(ranges, "CHUNK_BYTES"), (packs, "CHUNK_BYTES"), (packs, "HEAD_BYTES")]:
        monkeypatch.setattr(module, name, chunk)
    bucket = _s3_bucket(moto)
    url = f"s3://{bucket}/b.bundle"
    with read_manifest(DATA_BUNDLE) as bundle:
        env = {**bundle.entries[0].env, "cache_key_tag": "mine"} if layout == "packs" else None
    if layout == "packs":
        _store(url, tmp_path / "maker", _options("s3", moto)).add([_entry("mine")]).bundle.release()
    else:
        s3fs.S3FileSystem(**_options("s3", moto)).pipe(f"{bucket}/b.bundle", DATA_BUNDLE.read_bytes())
    asked: list[tuple[int, int]] = []
    store = _store(url, tmp_path / "reader", _options("s3", moto))
    read = store.client.read_ranges

    def counted(spans: list[tuple[str, int, int]], whole: int = 0) -> list[bytes]:
        asked.extend((start, end) for _, start, end in spans)
        return read(spans, whole)

    monkeypatch.setattr(store.client, "read_ranges", counted)
    assert _read(store, env) > 0
    size = s3fs.S3FileSystem(**_options("s3", moto)).du(bucket)  # the pack, or the bundle at the URL
    assert len(asked) >= size // chunk, (len(asked), size)
    assert max(end - start for start, end in asked) <= chunk, sorted(end - start for start, end in asked)


def test_a_trickle_within_the_deadline_scaled_by_size_still_reads(served: int, tmp_path: Path) -> None:
    """64 kB at 16 kB/s takes about 4 s, more than the 2 s network timeout: the deadline grows with
    the size, so the bundle is read, whole and checked."""
    with FaultProxy(served, rate=16_000) as slow:
        store = _store(f"{slow.url}/b.bundle", tmp_path / "copies", {}, timeout=2.0)
        started = time.monotonic()
        payload = _read(store)
        took = time.monotonic() - started
    assert payload
    assert took > 2.0, took


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["s3", "az"])
def test_an_object_store_that_trickles_or_stalls_is_still_read_whole(kind: str, request: pytest.FixtureRequest,
                                                                    tmp_path: Path) -> None:
    """In front of moto's S3 server and Azurite, a pack of about 250 kB: answers at 50 kB/s read within
    the deadline scaled by size (beyond the 3 s network timeout: the entry's artifacts past the pack's
    first 64 kB, asked at once, take about 4 s); a download that stops after 100 kB is read again, whole,
    and every artifact checked. (The timeout leaves room for a loaded machine: asking for the URL is a
    few requests to the server within one deadline.)"""
    port = int(request.getfixturevalue({"s3": "moto", "az": "azurite"}[kind]))
    root = _s3_bucket(port) if kind == "s3" else _az_container(port)
    url = f"{kind}://{root}/b.bundle"
    entry = _large_entry("large", 4)
    artifacts = sum(m.size for m in entry._members.table)
    _store(url, tmp_path / "maker", _options(kind, port)).add([entry]).bundle.release()
    (pack,) = _objects(kind, port, root).values()
    assert 200_000 < len(pack) < 400_000, len(pack)
    with FaultProxy(port, rate=50_000) as slow:
        started = time.monotonic()
        assert _read(_store(url, tmp_path / "slow", _options(kind, slow.port), timeout=3.0), entry.env) == artifacts
        assert time.monotonic() - started > 3.0
    with FaultProxy(port, stall_after=100_000, stalls=1) as stalling:
        assert _read(_store(url, tmp_path / "stalled", _options(kind, stalling.port), timeout=3.0),
                     entry.env) == artifacts
        assert stalling.stalled == 1


def test_a_download_that_stalls_midway_is_read_again_from_the_start(served: int, tmp_path: Path) -> None:
    """The first answer stops after 30 kB and never goes on: after the network timeout the read starts
    again on a new connection, and what is used is the whole, checked object."""
    with FaultProxy(served, stall_after=30_000, stalls=1) as stalling:
        store = _store(f"{stalling.url}/b.bundle", tmp_path / "copies", {}, timeout=2.0)
        started = time.monotonic()
        payload = _read(store)
        took = time.monotonic() - started
        assert stalling.stalled == 1
    assert payload
    assert 2.0 < took < 30, took


@pytest.mark.parametrize(("mode", "said"), [
    ("html", "not a pytest-compilecache bundle: it is a web page"),
    ("short", "shorter than"),
    ("longer", "shorter than"),
    ("loop", "redirect"),
    ("refuse", "503"),
])
def test_answers_that_lie_end_in_one_message_naming_the_url(served: int, tmp_path: Path, mode: str,
                                                            said: str) -> None:
    """A web page where the bundle should be, an answer shorter or longer than its Content-Length, a
    redirect loop, a server that refuses every read of a file it says is there: reading fails within its deadline with one message that begins with the URL and says
    what was wrong, and nothing read is kept on this machine."""
    url = f"http://127.0.0.1:{served}/{mode}/b.bundle"
    store = _store(url, tmp_path / "copies", {}, timeout=5.0)
    started = time.monotonic()
    with pytest.raises(BundleError) as failed:
        _read(store)
    assert time.monotonic() - started < 20
    message = str(failed.value)
    assert message.startswith(url), message
    assert said in message.lower(), message
    assert "Traceback" not in message
    assert not [p for p in (tmp_path / "copies").rglob("*") if p.is_file() and not p.name.endswith(".lock")], \
        "nothing half-read is kept"


def test_the_network_timeout_option_is_checked(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--compile-cache-network-timeout=soon")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*compile_cache_network_timeout must be a number of seconds*"])



# --- neither a reader nor a writer holds the bundle whole ------------------------------------------

@pytest.mark.parametrize("kind", ["s3", "az"])
def test_a_bundle_at_a_url_is_read_and_added_to_without_holding_it_whole(kind: str, request: pytest.FixtureRequest,
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """From machines that keep no copy of a 6 MB bundle (one pack): a reader of its one entry (the
    packs' heads and tables: nothing else is downloaded), a reader of each of its artifacts in turn
    (each read by range when asked, 512 kB, the chunk size set here, at most a request), and a writer
    adding a small entry (a pack of only what the bundle lacks, uploaded from a file) each peak at a
    small part of its size in Python's memory. The added pack stands beside the first, which is
    untouched, and both entries read back whole; nothing half-written is left on the machines."""
    for module in (ranges, packs):
        monkeypatch.setattr(module, "CHUNK_BYTES", 512 * 1024)
    port = int(request.getfixturevalue({"s3": "moto", "az": "azurite"}[kind]))
    root = _s3_bucket(port) if kind == "s3" else _az_container(port)
    url = f"{kind}://{root}/b.bundle"
    large = _large_entry("large", 100)
    artifacts = len(large._members.table)
    _store(url, tmp_path / "maker", _options(kind, port)).add([large]).bundle.release()
    first = _objects(kind, port, root)
    (size,) = [len(data) for data in first.values()]
    assert size > 6e6, size
    addition = _entry("small")

    def peak(name: str, action: Callable[[PackStore], Any]) -> float:
        """Python's peak allocations while ``action`` runs on a store of its own, against the bundle's size
        (the store described the bundle first: its client made, the protocol's models loaded)."""
        store = _store(url, tmp_path / name, _options(kind, port))
        assert store.describe().exists
        tracemalloc.start()
        try:
            action(store)
            return tracemalloc.get_traced_memory()[1] / size
        finally:
            tracemalloc.stop()

    def read(store: PackStore) -> None:
        found = store.read(large.env)
        assert found is not None and found.find(large.env) is not None
        found.release()
        assert store.transfer.downloaded < 0.05 * size, "no artifact is downloaded before it is asked for"

    def read_each(store: PackStore) -> None:
        found = store.read(large.env)
        assert found is not None
        entry = found.find(large.env)
        assert entry is not None and sum(1 for _ in found.members(entry).contents()) == artifacts
        found.release()

    assert peak("reader", read) < 0.35
    assert peak("artifacts", read_each) < 0.35
    assert peak("writer", lambda store: store.add([addition]).bundle.release()) < 0.35
    assert not list(tmp_path.rglob("*.part")) and not list(tmp_path.rglob("*.tmp")), \
        "every pack written was uploaded and removed, every range kept or removed"
    after = _objects(kind, port, root)
    assert len(after) == 2 and {p: after[p] for p in first} == first and _whole_packs(after), sorted(after)
    whole = _store(url, tmp_path / "check", _options(kind, port)).read()
    assert whole is not None
    assert sorted(e.env["cache_key_tag"] for e in whole.entries) == ["large", "small"]
    entry = whole.find(large.env)
    assert entry is not None and sum(1 for _ in whole.members(entry).contents()) == artifacts
    whole.release()


@pytest.mark.parametrize("kind", ["s3", "az"])
def test_an_upload_cut_once_is_sent_again_from_its_first_byte(kind: str, request: pytest.FixtureRequest,
                                                               tmp_path: Path) -> None:
    """The first upload of a 2.5 MB pack is reset after 64 kB, then the network is sound: the store's
    client sends the file again from its start, not from where the cut left it (one request of the whole
    pack, under both clients' single-request size), and the one object stored is exactly the pack
    written here, named by its content."""
    port = int(request.getfixturevalue({"s3": "moto", "az": "azurite"}[kind]))
    root = _s3_bucket(port) if kind == "s3" else _az_container(port)
    url = f"{kind}://{root}/b.bundle"
    with FaultProxy(port, cut_uploads_after=64 * 1024, uploads_cut=1) as cut:
        store = _store(url, tmp_path / "through", _options(kind, cut.port))
        store.add([_large_entry("large", 40)]).bundle.release()
        assert cut.cuts == 1
    (kept,) = (tmp_path / "through").rglob("whole")
    written = kept.read_bytes()
    assert len(written) > 2e6
    stored = _objects(kind, port, root)
    assert list(stored.values()) == [written] and _whole_packs(stored), sorted(stored)


def test_an_s3_put_whose_answer_is_lost_never_leaves_part_of_a_pack(moto: int, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The first PUT of a pack reaches the server, then its answer is lost (a read timeout, as botocore
    raises once its own retries are spent): s3fs sends it again, the whole pack from its first byte, and
    the write succeeds; the store holds that one pack, whole, and it reads back."""
    from botocore.exceptions import ReadTimeoutError

    bucket = _s3_bucket(moto)
    url = f"s3://{bucket}/b.bundle"
    store = _store(url, tmp_path / "writer", _options("s3", moto))
    fs, _ = store.client.filesystem()
    client = fs.s3
    put_object = client.put_object
    sent: list[tuple[int, bytes]] = []

    @functools.wraps(put_object)  # s3fs picks the arguments it passes by the method's name
    async def answer_lost(**kwargs: Any) -> Any:
        body = kwargs["Body"]
        at = body.tell() if hasattr(body, "tell") else 0
        sent.append((at, body.read() if hasattr(body, "read") else bytes(body)))
        if hasattr(body, "seek"):
            body.seek(at)
        answer = await put_object(**kwargs)
        if len(sent) == 1:
            raise ReadTimeoutError(endpoint_url="http://127.0.0.1")
        return answer

    monkeypatch.setattr(client, "put_object", answer_lost)
    large = _large_entry("large", 20)
    store.add([large]).bundle.release()
    stored = _objects("s3", moto, bucket)
    assert len(sent) == 2 and {at for at, _ in sent} == {0}, [(at, len(data)) for at, data in sent]
    assert [data for _, data in sent] == list(stored.values()) * 2 and _whole_packs(stored), sorted(stored)
    found = _store(url, tmp_path / "reader", _options("s3", moto)).read()
    assert found is not None and found.find(large.env) is not None
    found.release()


def _disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file this process writes through :func:`files.write_atomic` fills the disk after its first 4 kB
    (``ENOSPC``, the temporary file removed by the real function, as on a full disk)."""
    write_atomic = files.write_atomic

    def full(path: Path, chunks: Any, *args: Any, **kwargs: Any) -> int:
        def written() -> Iterator[bytes]:
            yield (chunks if isinstance(chunks, bytes) else b"".join(chunks))[:4096]
            raise OSError(errno.ENOSPC, "No space left on device")

        return write_atomic(path, written(), *args, **kwargs)

    monkeypatch.setattr(files, "write_atomic", full)


@pytest.mark.parametrize("disk", ["sound", "full"])
def test_what_was_read_of_a_pack_is_kept_unless_the_disk_cannot_hold_it(disk: str, moto: int, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pack never changes, so what a machine read of it is kept: a second reader there (a later
    session) reads the entry, every artifact checked, downloading nothing, from files every user may
    read as the umask allows. When the disk cannot hold what was read, each reader reads it all from
    the store instead, as much the second time as the first, and leaves nothing behind but its locks."""
    url = f"s3://{_s3_bucket(moto)}/b.bundle"
    wanted = _entry("mine")
    _store(url, tmp_path / "maker", _options("s3", moto)).add([wanted, _entry("other")]).bundle.release()
    if disk == "full":
        _disk_full(monkeypatch)
    read, downloaded = [], []
    for _ in range(2):
        store = _store(url, tmp_path / "reader", _options("s3", moto))
        read.append(_read(store, wanted.env))
        downloaded.append(store.transfer.downloaded)
    assert read[0] > 0 and read[0] == read[1], read
    kept = [p for p in (tmp_path / "reader").rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    if disk == "sound":
        assert downloaded[0] > 0 and downloaded[1] == 0, downloaded
        assert kept and {stat.S_IMODE(p.stat().st_mode) for p in kept} == {0o666 & ~files.umask()}
    else:
        assert downloaded[0] > 0 and downloaded[1] == downloaded[0], downloaded
        assert kept == [], kept


def test_a_pack_the_disk_cannot_hold_is_a_problem_of_the_bundle(moto: int, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills while a writer writes the pack it would upload: the write fails as a problem
    naming the file and the reason (the session says so and goes on), nothing is uploaded (the
    store holds the packs it held), and no part of the pack is left on this machine."""
    bucket = _s3_bucket(moto)
    url = f"s3://{bucket}/b.bundle"
    _store(url, tmp_path / "maker", _options("s3", moto)).add([_entry("first")]).bundle.release()
    before = _objects("s3", moto, bucket)
    _disk_full(monkeypatch)
    writer = _store(url, tmp_path / "writer", _options("s3", moto))
    with pytest.raises(BundleError, match=r"^s3://.*: cannot write its new pack in .*writer.* before uploading it: No space left on device; nothing "
                                        "was uploaded$"):
        writer.add([_entry("second")])
    assert writer.transfer.uploaded == 0
    assert _objects("s3", moto, bucket) == before
    assert not [p for p in (tmp_path / "writer").rglob("*") if p.is_file() and not p.name.endswith(".lock")]
