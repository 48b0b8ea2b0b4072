"""Bundles at URLs, against real servers this module starts on loopback: an S3 server (moto's server
mode, reached by s3fs over TCP) and a plain static HTTP server. Shards that share one S3 bundle,
writers that race (a real conditional write failing and retried), a server stopped mid-run, wrong
credentials, an object deleted or corrupted while it is read, and read-only HTTP."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from pytest_compilecache import cli
from pytest_compilecache.bundle.format import Bundle, BundleError, Entry, NotABundle, read_manifest
from pytest_compilecache.storage.interface import Written
from pytest_compilecache.storage.merge import combine
from pytest_compilecache.storage.objects import UrlStore, read_url
from pytest_compilecache.storage.ranges import HEAD_BYTES, Ranges
from servers import azurite_connection, azurite_server, free_port, s3_server, wait_for

#: Real sessions against real servers and suites: left out of the fast tier (-m "not slow").
pytestmark = pytest.mark.slow

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install 'pytest-compilecache[test]')")
pytest.importorskip("moto.server", reason="moto's server is not installed (pip install 'moto[server]')")

TESTS = '''
import torch

def test_sin():
    torch.compile(lambda x: torch.sin(x) * 3 + 1, dynamic=False)(torch.randn(8))
'''
MORE = '''

def test_cos():
    torch.compile(lambda x: torch.cos(x) - 2, dynamic=False)(torch.randn(8))
'''
DATA_BUNDLE = Path(__file__).parent / "data" / "h200-torch2.11.bundle"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with s3_server() as (url, _):
        yield url


def _use(monkeypatch: pytest.MonkeyPatch, endpoint: str, key: str = "testing") -> None:
    """Credentials and endpoint as a CI runner has them: in the environment (this process and inner runs)."""
    for name, value in {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": key, "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def _bucket(endpoint: str) -> str:
    import s3fs

    name = f"bundles-{uuid.uuid4().hex[:12]}"
    fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=endpoint, skip_instance_cache=True)
    fs.call_s3("create_bucket", Bucket=name)
    return f"s3://{name}"


@pytest.fixture(scope="module")
def azurite() -> Iterator[str]:
    """Azurite's Blob service (Microsoft's Azure Storage emulator, from npm) on a free loopback port;
    its connection string."""
    if shutil.which("azurite-blob") is None:
        pytest.skip("azurite is not installed (npm install -g azurite; .ci/run installs it)")
    pytest.importorskip("adlfs", reason="adlfs is not installed (pip install 'pytest-compilecache[azure]')")
    with azurite_server() as port:
        yield azurite_connection(port)


@pytest.fixture
def az(azurite: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new, empty container on the module's Azurite, with its connection string in the environment
    (as a CI runner has it); its URL."""
    import adlfs

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite)
    name = f"bundles-{uuid.uuid4().hex[:12]}"
    adlfs.AzureBlobFileSystem(connection_string=azurite, skip_instance_cache=True).mkdir(name)
    return f"az://{name}"


@pytest.fixture(params=["s3", "az"])
def store_root(request: pytest.FixtureRequest) -> str:
    """A new, empty bucket (S3, on moto) or container (Azure Blob, on Azurite): each store with
    conditional writes."""
    return str(request.getfixturevalue(request.param))


@pytest.fixture(autouse=True)
def own_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line keeps its copies in the user's cache folder: a folder of the test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def s3(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new, empty bucket on the module's S3 server, with credentials set; its URL."""
    _use(monkeypatch, endpoint)
    return _bucket(endpoint)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, shared_headers_dir: Path,
          run_session: Callable[..., subprocess.CompletedProcess[str]]) -> Path:
    """A local bundle built by one real run (its entry is this machine's)."""
    folder = tmp_path_factory.mktemp("built")
    (folder / "test_s.py").write_text(TESTS)
    (folder / "pytest.ini").write_text(f"[pytest]\ncompile_cache_headers_dir = {shared_headers_dir}\n")
    bundle = folder / "b.bundle"
    out = run_session(["-q", "-p", "no:cacheprovider", "-p", "no:randomly", f"--compile-cache-bundle={bundle}"],
                      folder, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return bundle


def _report(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text())["bundle"])


def _tagged(tag: str) -> Entry:
    """The entry of the GPU bundle in tests/data, as if made for ``cache_key_tag=tag`` (no torch needed)."""
    with read_manifest(DATA_BUNDLE) as bundle:
        bundle.read_all()
        entry = bundle.entries[0]
    return dataclasses.replace(entry, env={**entry.env, "cache_key_tag": tag})


def test_shards_share_one_s3_bundle(pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult],
                                    s3: str) -> None:
    """The first shard creates the bundle; the command line adds another machine's entry to it;
    another machine loads it, downloading only its own entry; a machine that has this version
    downloads nothing, and with nothing new it uploads nothing; a shard whose code changed adds to it."""
    url = f"{s3}/ci/suite.bundle"
    pytester.makepyfile(test_s=TESTS)

    def shard(name: str, *args: str) -> dict[str, Any]:
        report = pytester.path / f"{name}-{uuid.uuid4().hex[:6]}.json"
        result = run_inner(f"--compile-cache-bundle={url}", f"--compile-cache-report={report}", *args,
                           ini=f"compile_cache_home = {pytester.path / ('home-' + name)}")
        assert result.ret == 0, result.stdout.str()
        assert "Traceback" not in result.stdout.str()
        return _report(report)

    first = shard("one")
    assert first["saved"]["status"] == "saved"
    assert first["saved"]["artifacts"]["cpp"]["count"] > 0, "the summary counts the binaries it uploaded"
    assert first["saved"]["transfer"]["uploaded"] > 0
    assert first["at_start"] == f"{url}: missing, the session will create it"

    assert cli.main(["merge", "-o", url, url, str(DATA_BUNDLE)]) == 0
    merged = read_url(url, pytester.path / "check")
    size = merged.path.stat().st_size
    gpu = next(e for e in merged.entries if e.env["device"] != "cpu")
    gpu_bytes = gpu.size + (gpu.stored or 0) + sum((s or {}).get("size", 0) for s in (gpu.binaries_section,
                                                                                       gpu.index_section))
    assert len(merged.entries) == 2 and gpu_bytes > 0

    second = shard("two")
    process = second["processes"][0]
    assert process["status"] == "loaded", process
    assert 0 < process["downloaded_bytes"] < size - gpu_bytes + HEAD_BYTES, \
        "only this machine's entry (and the manifest's range) was downloaded"
    assert second["saved"]["status"] == "kept"

    again = shard("two")
    assert again["processes"][0]["status"] == "loaded"
    assert again["processes"][0]["downloaded_bytes"] == 0
    assert "this machine keeps a copy of this version" in again["at_start"]

    nothing_new = shard("two", "--compile-cache-update")
    assert nothing_new["saved"]["status"] == "unchanged"
    assert nothing_new["saved"]["transfer"] == {"downloaded": 0, "uploaded": 0, "conflicts": 0}, \
        "this machine's copy of its own entry showed that nothing was new: nothing moved"

    pytester.makepyfile(test_s=TESTS + MORE)
    changed = shard("three", "--compile-cache-update")
    assert changed["saved"]["status"] == "saved"
    assert changed["saved"]["transfer"]["uploaded"] > 0
    store = UrlStore(url, pytester.path / "check2", 30)
    with store.locked():
        _, whole = store.read_whole()
    assert whole is not None
    mine = [e for e in whole.entries if e.env["device"] == "cpu"]
    assert len(whole.entries) == 2 and mine[0].artifacts["inductor"]["count"] == 2, "the other entry is kept"


@pytest.mark.parametrize("exists", [True, False], ids=["update", "create"])
def test_racing_writers_both_land(store_root: str, tmp_path: Path, exists: bool) -> None:
    """Shard B writes between shard A's read and A's write (of a bundle that exists, or of a new one):
    A's conditional write (If-Match, or create-only) fails on the real server, A reads again and
    writes the union."""
    url = f"{store_root}/race.bundle"
    a = UrlStore(url, tmp_path / "a", 30)
    b = UrlStore(url, tmp_path / "b", 30)
    if exists:
        b.add([_tagged("first")])
    reads: list[int] = []

    def change(current: Any) -> list[Entry]:
        reads.append(len(current.entries) if current else 0)
        if len(reads) == 1:
            b.add([_tagged("b")])
        return combine(current, [_tagged("a")]).entries

    a.update(change)
    assert reads == ([1, 2] if exists else [0, 1]), "A read again after its first conditional write failed"
    assert a.transfer.conflicts == 1
    tags = {e.env["cache_key_tag"] for e in read_url(url, tmp_path / "check").entries}
    assert tags == ({"first", "a", "b"} if exists else {"a", "b"})


def test_a_store_without_conditional_writes_keeps_deltas_for_merge(tmp_path: Path, capsys: Any) -> None:
    """fsspec's local:// file system has no conditional write this plugin uses: a session's write
    leaves a delta and says so, the bundle is never written, and `merge --deltas` folds the deltas in
    (writing without a condition, with a warning) and removes them."""
    url = f"local://{tmp_path / 'store' / 'b.bundle'}"
    store = UrlStore(url, tmp_path / "copies", 30)
    saved = store.add([_tagged("x")])
    assert saved.status is Written.DELTA and saved.delta.startswith(url + ".deltas/")
    assert "offers no conditional write" in saved.note and saved.dropped == (), "by design, not a problem"
    assert saved.bundle.entries[0].env["cache_key_tag"] == "x"
    assert not (tmp_path / "store" / "b.bundle").exists(), "the bundle itself is never written without a condition"
    UrlStore(url, tmp_path / "copies-2", 30).add([_tagged("y")])
    assert len(store.list_deltas()) == 2
    assert cli.main(["merge", "--deltas", "-o", url]) == 0
    out, err = capsys.readouterr()
    assert "2 delta(s) folded in, 2 removed" in out
    assert "offers no conditional write this plugin can use; it is written without one" in err
    assert sorted(e.env["cache_key_tag"] for e in read_url(url, tmp_path / "check").entries) == ["x", "y"]
    assert store.list_deltas() == []
    assert cli.main(["merge", "--deltas", "-o", url]) == 0
    assert "no deltas wait beside it" in capsys.readouterr().out


def test_an_object_deleted_while_it_is_read(s3: str, tmp_path: Path) -> None:
    """The manifest is read by range; the object is deleted before the payload is: a clear error. (A bundle
    larger than the manifest's range: the one in tests/data, format 1.)"""
    url = f"{s3}/gone.bundle"
    store = UrlStore(url, tmp_path, 30)
    fs, path = store.client.filesystem()
    fs.put_file(str(DATA_BUNDLE), path)
    version = store.version()
    assert version is not None
    raw = Ranges(store.client.read_range, version.size)
    remote = Bundle.over(raw, tmp_path / "x", url, head=HEAD_BYTES)
    assert raw.moved <= HEAD_BYTES, "only the start of the object was read for the manifest"
    fs.rm_file(path)
    with pytest.raises(BundleError, match=f"^{url}: cannot read it: it was deleted while it was being read"):
        remote.payload(remote.entries[0])
    assert store.read(remote.entries[0].env) is None


def test_a_corrupt_object_never_replaces_a_good_copy(s3: str, built: Path, tmp_path: Path) -> None:
    url = f"{s3}/flip.bundle"
    store = UrlStore(url, tmp_path, 30)
    fs, path = store.client.filesystem()
    good = built.read_bytes()
    fs.pipe_file(path, good)
    with read_manifest(built) as local:
        env = local.entries[0].env
        inside_table = local._start + local.entries[0].offset + 5
        inside_artifact = local._start + local.entries[0].offset + local.entries[0].size + 10
    with store.read(env) as bundle:
        assert bundle.find(env) is not None
    copies = {p: p.read_bytes() for p in store.copies.folder.glob("*.bundle")}
    assert len(copies) == 1
    with read_manifest(built) as local:
        section = local.entries[0].binaries_section
        assert section is not None, "the built bundle carries C++ binaries"
        inside_binaries = local._start + section["offset"] + 10
    for where, what in ((inside_table, "table of artifacts"), (inside_artifact, "entry for"),
                        (inside_binaries, "binaries")):
        bad = bytearray(good)
        bad[where] ^= 0xFF
        fs.pipe_file(path, bytes(bad))
        with pytest.raises(BundleError, match=f"^{url}: corrupt: the {what} "):
            store.read(env)
        assert {p: p.read_bytes() for p in store.copies.folder.glob("*.bundle")} == copies, "no bad copy was kept"
    fs.pipe_file(path, b"hello, not a bundle")
    with pytest.raises(NotABundle):
        store.add([_tagged("z")])
    assert fs.cat_file(path) == b"hello, not a bundle"


def test_a_bundle_served_over_plain_http_is_read_only(pytester: pytest.Pytester, built: Path,
                                                      run_inner: Callable[..., pytest.RunResult]) -> None:
    pytest.importorskip("aiohttp", reason="aiohttp is not installed (pip install 'pytest-compilecache[http]')")
    served = pytester.path / "www"
    served.mkdir()
    shutil.copy(built, served / "suite.bundle")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(served),
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(port, proc, "http.server")
        pytester.makepyfile(test_s=TESTS)
        report = pytester.path / "r.json"
        url = f"http://127.0.0.1:{port}/suite.bundle"
        result = run_inner(f"--compile-cache-bundle={url}", f"--compile-cache-report={report}",
                           "--compile-cache-update", ini=f"compile_cache_home = {pytester.path / 'home'}")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert result.ret == 0, result.stdout.str()
    bundle = _report(report)
    assert bundle["processes"][0]["status"] == "loaded"
    assert bundle["processes"][0]["downloaded_bytes"] > 0
    assert bundle["saved"]["status"] == "failed"
    assert "http:// bundles are read-only" in bundle["saved"]["reason"]
    result.stdout.fnmatch_lines([f"PROBLEM: {url}: http:// bundles are read-only*"])


def test_a_server_stopped_mid_run(pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The S3 server goes away while tests run: the save fails with the URL and the reason, the
    tests' results stand, and strict mode turns it into a failed run."""
    with s3_server() as (endpoint, proc):
        _use(monkeypatch, endpoint)
        url = f"{_bucket(endpoint)}/b.bundle"
        pytester.makepyfile(test_s=TESTS + f"""

def test_stop_the_server():
    import os, signal
    os.kill({proc.pid}, signal.SIGTERM)
""")
        options = json.dumps({"config_kwargs": {"retries": {"max_attempts": 1}}})
        result = run_inner(f"--compile-cache-bundle={url}", "--compile-cache-strict",
                           ini=f"compile_cache_home = {pytester.path / 'home'}\n"
                               f"compile_cache_storage_options = {options}")
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=2)
    assert result.ret == 1
    result.stdout.fnmatch_lines([f"PROBLEM: {url}: cannot *"])


def test_wrong_credentials_and_missing_packages_are_named(pytester: pytest.Pytester,
                                                          run_inner: Callable[..., pytest.RunResult],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with s3_server(INITIAL_NO_AUTH_ACTION_COUNT="0") as (endpoint, _):
        _use(monkeypatch, endpoint, key="not-a-key")
        pytester.makepyfile(test_s=TESTS)
        result = run_inner("--compile-cache-bundle=s3://bundles/b.bundle", "--compile-cache-strict")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--compile-cache-strict: bundle problem at session start:*",
                                 "*s3://bundles/b.bundle: cannot read it: access denied*check the credentials*"])
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(BundleError, match=r"pip install 'pytest-compilecache\[gcs\]'"):
            UrlStore("gs://bundles/b.bundle", pytester.path, 30).version()


def test_an_unreachable_store_still_gets_a_warm_session(pytester: pytest.Pytester,
                                                        run_inner: Callable[..., pytest.RunResult],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens at the endpoint (set through compile_cache_storage_options): every problem is
    named, the warmup still runs once, and warm_cache tests use what it compiled."""
    _use(monkeypatch, "http://127.0.0.1:1")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    dead = f"http://127.0.0.1:{free_port()}"
    pytester.makeconftest(
        "import torch\n\ndef pytest_compilecache_warmup(cache):\n"
        "    torch.compile(lambda x: torch.sin(x) * 3 + 1, dynamic=False)(torch.randn(8))\n")
    pytester.makepyfile(test_w="""
import torch

def test_warm(warm_cache):
    torch.compile(lambda x: torch.sin(x) * 3 + 1, dynamic=False)(torch.randn(8))
    warm_cache.assert_misses(fx_graph=0)
""")
    options = json.dumps({"endpoint_url": dead, "config_kwargs": {"retries": {"max_attempts": 1}}})
    result = run_inner("--compile-cache-bundle=s3://bundles/b.bundle", "--compile-cache-update",
                       ini=f"compile_cache_home = {pytester.path / 'home'}\ncompile_cache_storage_options = {options}")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "Traceback" not in out
    result.stdout.fnmatch_lines([
        "compilecache: bundle s3://bundles/b.bundle: cannot be used (see PROBLEM in the compilecache summary)",
        "warmup: ran here: * s; s3://bundles/b.bundle could not be used (see PROBLEM below): what it compiled is for "
        "this session's warm_cache tests only",
        "bundle left alone: s3://bundles/b.bundle was neither used nor written (see PROBLEM below)*",
        "PROBLEM: s3://bundles/b.bundle: cannot read it: EndpointConnectionError*",
    ])
    assert out.count("PROBLEM:") == 1, out
    assert "nothing downloaded" not in out
    assert f'Could not connect to the endpoint URL: "{dead}/bundles/b.bundle"' in out


def test_with_the_key_set_an_unsigned_entry_is_replaced_not_kept(s3: str, built: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundle written before signing was turned on already holds every artifact of this run: with
    the key set, the run still writes, so the entry becomes one that the next run can use."""
    from pytest_compilecache import _torchapi
    from pytest_compilecache.bundle.format import make_entry

    url = f"{s3}/signed.bundle"
    store = UrlStore(url, tmp_path, 30)
    fs, path = store.client.filesystem()
    fs.put_file(str(built), path)
    with read_manifest(built) as local:
        local.read_all()
        old = local.entries[0]
    payload = local.payload(old)
    monkeypatch.setenv("PYTEST_COMPILE_CACHE_KEY", "s3cret")
    assert store.add([make_entry(old.env, payload, _torchapi.describe_artifacts(payload))]).status is Written.SAVED
    (entry,) = read_url(url, tmp_path / "check").entries
    assert entry.signature and not entry.vouched(b"s3cret")
    saved = store.add([make_entry(old.env, payload, _torchapi.describe_artifacts(payload))])
    assert saved.status is Written.UNCHANGED, "now signed and complete: nothing to write"


def test_xdist_workers_load_a_warmup_kept_only_as_a_delta(pytester: pytest.Pytester,
                                                          run_inner: Callable[..., pytest.RunResult],
                                                          tmp_path: Path) -> None:
    """On a store without conditional writes an updating session's warmup goes to a delta, not to
    the bundle: every worker loads the bundle's entry with that delta folded in, so a warm test hits
    what the warmup compiled and what an earlier session left in the bundle."""
    pytest.importorskip("xdist")
    stored = tmp_path / "store" / "b.bundle"
    url = f"local://{stored}"
    pytester.makepyfile(test_earlier="""
import torch

def test_earlier():
    torch.compile(lambda x: torch.cos(x) - 2, dynamic=False)(torch.randn(8))
""")
    first = run_inner(f"--compile-cache-bundle={stored}", ini=f"compile_cache_home = {pytester.path / 'home'}")
    assert first.ret == 0 and stored.is_file(), first.stdout.str()
    (pytester.path / "test_earlier.py").unlink()
    pytester.makeconftest(
        "import torch\n\ndef pytest_compilecache_warmup(cache):\n"
        "    torch.compile(lambda x: torch.sin(x) * 3 + 1, dynamic=False)(torch.randn(8))\n")
    warm = """
import torch

def test_warm_{n}(warm_cache):
    torch.compile(lambda x: torch.sin(x) * 3 + 1, dynamic=False)(torch.randn(8))
    torch.compile(lambda x: torch.cos(x) - 2, dynamic=False)(torch.randn(8))
    warm_cache.assert_misses(fx_graph=0)
    warm_cache.assert_hits(fx_graph=2)
"""
    pytester.makepyfile(test_a=warm.format(n="a"), test_b=warm.format(n="b"))
    report = pytester.path / "r.json"
    result = run_inner(f"--compile-cache-bundle={url}", f"--compile-cache-report={report}", "-n", "2",
                       "--dist", "loadfile", "--compile-cache-strict", "--compile-cache-update",
                       ini=f"compile_cache_home = {pytester.path / 'home'}")
    result.assert_outcomes(passed=2)
    assert result.ret == 0, "a delta on a store without conditional writes is by design, not a problem"
    bundle = _report(report)
    assert sorted(p["status"] for p in bundle["processes"]) == ["loaded", "loaded"], bundle["processes"]
    # Both loaded the bundle's entry with the warmup's delta folded in, said so (not as a private file's path).
    assert all(p["reason"].startswith(f"{url} and this session's delta: ") for p in bundle["processes"]), \
        bundle["processes"]
    assert bundle["saved"]["status"] == "delta"
    result.stdout.fnmatch_lines([f"bundle written as a delta only: {url}.deltas/*offers no conditional write*"])
    assert "PROBLEM" not in result.stdout.str()


def test_a_plain_http_server_that_cannot_be_reached_is_not_a_missing_bundle(tmp_path: Path) -> None:
    pytest.importorskip("aiohttp", reason="aiohttp is not installed (pip install 'pytest-compilecache[http]')")
    dead = f"http://127.0.0.1:{free_port()}/suite.bundle"
    with pytest.raises(BundleError, match=f"^{dead}: cannot read it: .*(onnect|refused)"):
        UrlStore(dead, tmp_path, 30).version()
    served = tmp_path / "www"
    served.mkdir()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(served),
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(port, proc, "http.server")
        assert UrlStore(f"http://127.0.0.1:{port}/none.bundle", tmp_path, 30).version() is None, \
            "a 404 is a bundle that does not exist yet"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_missing_bucket_is_said_at_the_start(s3: str, tmp_path: Path) -> None:
    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/b.bundle"
    with pytest.raises(BundleError, match=f"^{url}: no such bucket"):
        UrlStore(url, tmp_path, 30).version()
    assert UrlStore(f"{s3}/not-yet.bundle", tmp_path, 30).version() is None


def test_urls_are_parsed_and_shown_without_credentials(tmp_path: Path, capsys: Any) -> None:
    from pytest_compilecache.storage.urls import file_url_path, is_url

    signed = UrlStore("https://user:pw@cdn.example/b.bundle?X-Amz-Signature=abc", tmp_path, 30)
    assert signed.name == "https://cdn.example/b.bundle"
    azure = "abfs://container@account.dfs.core.windows.net/ci/b.bundle"
    assert UrlStore(azure, tmp_path, 30).name == azure, "a container@account is no credential"
    from pytest_compilecache.storage.urls import redacted

    assert redacted("rediss://:s3cret@cache.internal:6380/0") == "rediss://cache.internal:6380/0"
    other = UrlStore("https://cdn.example/b.bundle?X-Amz-Signature=other", tmp_path, 30)
    assert signed.copies.folder == other.copies.folder, \
        "a presigned URL that changes every run keeps one folder of copies"
    assert cli.main(["--storage-options", "[1]", "inspect", "s3://b/x.bundle"]) == 2
    assert "--storage-options must be a JSON object" in capsys.readouterr().err

    assert file_url_path("file:///tmp/a%20b/x.bundle") == "/tmp/a b/x.bundle"
    assert file_url_path("file://localhost/tmp/x.bundle") == "/tmp/x.bundle"
    assert file_url_path("/tmp/x.bundle") is None
    for bad in ("file://host/x.bundle", "file://x.bundle"):
        with pytest.raises(BundleError, match="file://"):
            file_url_path(bad)
    assert not is_url("file:///tmp/x.bundle") and not is_url("C:\\x\\y.bundle") and not is_url("c://x/y.bundle")
    assert is_url("s3://b/x.bundle") and is_url("memory://x.bundle")


def test_a_conflict_retried_says_each_dropped_thing_once(s3: str, built: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebuild over an unreadable bundle whose first conditional write loses a race on the server:
    the retry reads again, and what it drops is said once, not once per attempt."""
    url = f"{s3}/unreadable.bundle"
    store = UrlStore(url, tmp_path, 30)
    fs, path = store.client.filesystem()
    with read_manifest(built) as local:
        inside_table = local._start + local.entries[0].offset + 5
    bad = bytearray(built.read_bytes())
    bad[inside_table] ^= 0xFF
    fs.pipe_file(path, bytes(bad))
    put = store.client.put

    def racing_put(source: Path, expected: Any, unconditional: bool = False) -> str:
        if not store.transfer.conflicts:
            bad[inside_table + 1] ^= 0xFF
            fs.pipe_file(path, bytes(bad))  # another writer: a new version, still unreadable
        return put(source, expected, unconditional)

    monkeypatch.setattr(store.client, "put", racing_put)
    saved = store.add([_tagged("fresh")], rebuild=True)
    assert saved.transfer.conflicts == 1
    assert [d for d in saved.dropped if "could not be read" in d] == [saved.dropped[0]] and len(saved.dropped) == 1
    assert [e.env["cache_key_tag"] for e in read_url(url, tmp_path / "check").entries] == ["fresh"]


def test_the_command_line_takes_storage_options(s3: str, built: Path, endpoint: str, capsys: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint given only as storage options (as in an ini file) reaches the command line too:
    through --storage-options or the environment variable the plugin also reads."""
    url = f"{s3}/cli.bundle"
    fs, path = UrlStore(url, Path(built).parent / "cli-copies", 30).client.filesystem()
    fs.put_file(str(built), path)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # no client made with the endpoint from the environment is reused
    options = json.dumps({"endpoint_url": endpoint})
    assert cli.main(["--storage-options", options, "inspect", "--json", url]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == url
    monkeypatch.setenv("PYTEST_COMPILE_CACHE_STORAGE_OPTIONS", options)
    assert cli.main(["verify", url]) == 0


def test_shards_share_one_azure_bundle(pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult],
                                       az: str) -> None:
    """Through Azure Blob (Azurite): the first shard creates the bundle by a conditional write, a
    fresh runner loads it and hits, and with nothing new it moves nothing."""
    url = f"{az}/ci/suite.bundle"
    pytester.makepyfile(test_s=TESTS)
    reports = []
    for n, args in enumerate(((), (), ("--compile-cache-update",))):
        report = pytester.path / f"r{n}.json"
        result = run_inner(f"--compile-cache-bundle={url}", f"--compile-cache-report={report}", *args,
                           ini=f"compile_cache_home = {pytester.path / ('home-' + str(min(n, 1)))}")
        assert result.ret == 0 and "Traceback" not in result.stdout.str(), result.stdout.str()
        reports.append(json.loads(report.read_text()))
    first, second, third = reports
    assert first["bundle"]["saved"]["status"] == "saved" and first["totals"]["fx_graph"]["misses"] == 1
    assert second["bundle"]["processes"][0]["status"] == "loaded"
    assert second["bundle"]["processes"][0]["downloaded_bytes"] > 0
    assert second["totals"]["fx_graph"]["hits"] == 1 and second["totals"]["fx_graph"]["misses"] == 0
    assert third["bundle"]["saved"]["status"] == "unchanged"
    assert third["bundle"]["saved"]["transfer"]["uploaded"] == 0


def test_a_machine_whose_copy_is_stale_finds_nothing_new_from_its_entry_alone(s3: str, tmp_path: Path) -> None:
    """Machine B keeps no copy of the bundle's current version (another shard wrote since): to learn
    that its run adds nothing it downloads its own entry only, and writes nothing."""
    url = f"{s3}/stale.bundle"
    a = UrlStore(url, tmp_path / "a", 30)
    for other in ("one", "two", "three"):  # the manifest's range (64 kB) is read whole: entries to leave out
        a.add([_tagged(f"other machine {other}")])
    a.add([_tagged("b")])
    b = UrlStore(url, tmp_path / "b", 30)
    saved = b.add([_tagged("b")])
    whole = saved.size
    assert saved.status is Written.UNCHANGED and saved.transfer.uploaded == 0
    assert 0 < saved.transfer.downloaded < whole * 0.75, (saved.transfer.downloaded, whole)
