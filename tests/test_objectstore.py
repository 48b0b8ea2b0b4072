"""Bundles at URLs, against real servers this module starts on loopback: an S3 server (moto's server
mode, reached by s3fs over TCP), Azure Blob Storage (Azurite), Google Cloud Storage (an emulator) and
a plain static HTTP server. A bundle at a URL is a folder of packs that never change: shards that
share one, writers at once that lose nothing, a run that downloads only what it uses and uploads
only what it adds, pruning that never removes a pack a reader may still read, a server stopped
mid-run, wrong credentials, a pack deleted or corrupted while it is read, and read-only HTTP."""

from __future__ import annotations

import concurrent.futures
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
from pytest_compilecache.bundle.format import BundleError, Entry, read_manifest
from pytest_compilecache.bundle.members import Members
from pytest_compilecache.storage import packs
from pytest_compilecache.storage.interface import Written
from pytest_compilecache.storage.packs import PACKS, PackStore, read_url
from pytest_compilecache.storage.ranges import HEAD_BYTES
from servers import azurite_connection, azurite_server, free_port, gcs_options, gcs_server, s3_server, wait_for

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


@pytest.fixture(scope="module")
def gcs() -> Iterator[str]:
    """A Google Cloud Storage emulator on a free loopback port; its endpoint."""
    pytest.importorskip("gcsfs", reason="gcsfs is not installed (pip install 'pytest-compilecache[test]')")
    with gcs_server() as endpoint:
        yield endpoint


@pytest.fixture
def gs(gcs: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new, empty bucket on the module's GCS emulator, its options in the environment; its URL."""
    import gcsfs

    options = gcs_options(gcs)
    monkeypatch.setenv("PYTEST_COMPILE_CACHE_STORAGE_OPTIONS", json.dumps(options))
    name = f"bundles-{uuid.uuid4().hex[:12]}"
    gcsfs.GCSFileSystem(**options, skip_instance_cache=True).mkdir(name)
    return f"gs://{name}"


@pytest.fixture(params=["s3", "az", "gs"])
def store_root(request: pytest.FixtureRequest) -> str:
    """A new, empty bucket (S3 on moto, GCS on its emulator) or container (Azure Blob, on Azurite)."""
    return str(request.getfixturevalue(request.param))


def _store(url: str, folder: Path) -> PackStore:
    """The store at ``url`` with the options a session reads from the environment (the GCS emulator's)."""
    import os

    options = json.loads(os.environ.get("PYTEST_COMPILE_CACHE_STORAGE_OPTIONS") or "{}")
    return PackStore(url, folder, 30, options)


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


def _tagged(tag: str, *variants: int) -> Entry:
    """The entry of the GPU bundle in tests/data, as if made for ``cache_key_tag=tag`` (no torch needed); with
    ``variants``, it holds the same artifacts under keys of each variant's own, as other tests' compiles would."""
    with read_manifest(DATA_BUNDLE) as bundle:
        bundle.read_all()
        entry = bundle.entries[0]
        if variants:
            contents = list(bundle.members(entry).contents())
            members = Members.packed((kind, key[:-4] + f"{n:04x}", content)
                                     for n in variants for kind, key, content in contents)
            entry = entry.with_members(members, None)
    return dataclasses.replace(entry, env={**entry.env, "cache_key_tag": tag})


def _packs(store: PackStore) -> list[str]:
    return sorted(store.client.listing(PACKS))


def test_a_store_opened_after_the_endpoint_changed_reaches_the_new_one(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint and credentials come from the environment: a store opened after they changed (a later session in
    the same process, a CI step that points elsewhere) reaches the new server, not one an earlier store of the process
    reached (fsspec keeps one file system per set of arguments, and the environment is not among them)."""
    # The first server is stopped before the second starts: a store that reached it would fail, where a running
    # one might answer "no bundle" for a bucket it lacks, as the second server rightly does.
    with s3_server() as (first, _):
        _use(monkeypatch, first)
        assert _store(f"{_bucket(first)}/b.bundle", tmp_path / "one").read() is None
    with s3_server() as (second, _):
        _use(monkeypatch, second)
        url = f"{_bucket(second)}/b.bundle"
        assert _store(url, tmp_path / "two").read() is None, "the second server holds no bundle"


def test_shards_share_one_s3_bundle(pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult],
                                    s3: str) -> None:
    """The first shard creates the bundle (one pack); the command line adds another machine's entry
    (a second pack); a fresh runner loads it, downloading only what its test used; a machine that
    read it before downloads nothing; with nothing new nothing is uploaded; a shard whose code changed
    uploads one pack of what it added, not what was there."""
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
    store = _store(url, pytester.path / "check")
    (own,) = store.client.listing(PACKS).values()

    assert cli.main(["merge", "-o", url, str(DATA_BUNDLE)]) == 0
    assert len(_packs(store)) == 2, "the other machine's entry is a pack of its own"
    whole = sum(store.client.listing(PACKS).values())

    second = shard("two")
    process = second["processes"][0]
    assert process["status"] == "loaded", process
    assert 0 < process["downloaded_bytes"] <= own + HEAD_BYTES, \
        "only this machine's pack (and the other pack's first bytes) was downloaded"
    assert second["saved"]["status"] == "kept"

    nothing_new = shard("two", "--compile-cache-update")
    assert nothing_new["processes"][0]["status"] == "loaded"
    assert nothing_new["processes"][0]["downloaded_bytes"] == 0, "every part it reads was kept on this machine"
    assert nothing_new["at_start"] == f"{url}: 2 packs, {whole / 1e6:.1f} MB"
    assert nothing_new["saved"]["status"] == "unchanged"
    assert nothing_new["saved"]["transfer"] == {"downloaded": 0, "uploaded": 0}

    held = set(store.client.listing(PACKS))
    pytester.makepyfile(test_s=TESTS + MORE)
    changed = shard("three", "--compile-cache-update")
    assert changed["saved"]["status"] == "saved"
    after = store.client.listing(PACKS)
    (added,) = set(after) - held
    assert changed["saved"]["transfer"]["uploaded"] == after[added], "one pack, nothing else"
    pack = pytester.path / "added.bundle"
    pack.write_bytes(store.client.filesystem()[0].cat_file(store.client.path(f"{PACKS}/{added}")))
    with read_manifest(pack) as uploaded:
        assert [e.artifacts["inductor"]["count"] for e in uploaded.entries] == [1], \
            "what it added (test_cos's graph), not what the bundle held (test_sin's)"
    merged = read_url(url, pytester.path / "check2")
    mine = [e for e in merged.entries if e.env["device"] == "cpu"]
    assert len(merged.entries) == 2 and mine[0].artifacts["inductor"]["count"] == 2, "the other entry is kept"


def test_writers_at_once_lose_nothing(store_root: str, tmp_path: Path) -> None:
    """Four shards add to one bundle at once, on the real server: two add entries for machines of
    their own, two add other tests' artifacts to one machine's entry. Every pack lands, nothing is
    lost, and no write waits for another (no condition, no retry, no delta)."""
    url = f"{store_root}/race.bundle"
    _store(url, tmp_path / "first").add([_tagged("shared", 1)])
    jobs = [[_tagged(f"machine {n}")] for n in range(2)] + [[_tagged("shared", n)] for n in range(2, 4)]
    stores = [_store(url, tmp_path / f"shard-{n}") for n in range(len(jobs))]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        saved = list(pool.map(lambda job: job[0].add(job[1]), zip(stores, jobs)))
    assert all(s.status is Written.SAVED for s in saved)
    assert len(_packs(stores[0])) == 5
    bundle = read_url(url, tmp_path / "check", stores[0].client.storage_options)
    tags = sorted(e.env["cache_key_tag"] for e in bundle.entries)
    assert tags == ["machine 0", "machine 1", "shared"]
    shared = bundle.find(_tagged("shared").env)
    assert shared is not None
    other = bundle.find(_tagged("machine 0").env)
    assert other is not None
    per_test = len(bundle.members(other).table)
    assert len(bundle.members(shared).table) == 3 * per_test, "the artifacts of all three shards"


def test_a_folder_holds_the_same_layout_and_pruning_keeps_what_readers_read(tmp_path: Path, capsys: Any,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """local:// is the layout on this machine's disk. A file is pushed to a URL and pulled back into a
    file; prune writes one pack replacing those it read; a reader that listed the packs before still
    reads every artifact from them, and the packs it replaced go only once they were replaced longer
    ago than the grace."""
    url = f"local://{tmp_path / 'store' / 'b.bundle'}"
    store = PackStore(url, tmp_path / "copies", 30)
    store.add([_tagged("x")])
    store.add([_tagged("y")])
    assert cli.main(["merge", "-o", url, str(DATA_BUNDLE)]) == 0
    assert len(_packs(store)) == 3
    assert cli.main(["merge", "-o", str(tmp_path / "pulled.bundle"), url]) == 0
    with read_manifest(tmp_path / "pulled.bundle") as pulled:
        assert sorted(e.env.get("cache_key_tag", "") for e in pulled.entries) == ["", "x", "y"]
    capsys.readouterr()

    before = PackStore(url, tmp_path / "early-reader", 30).read(_tagged("x").env)
    assert before is not None
    assert cli.main(["prune", url, "--drop", "cache_key_tag=y"]) == 0
    assert "kept 2 of 3 environments" in capsys.readouterr().out
    assert len(_packs(store)) == 4, "the packs it replaced stay for readers that listed them"
    entry = before.find(_tagged("x").env)
    assert entry is not None
    assert [c for _, _, c in before.members(entry).contents()], "a reader from before reads every artifact"
    assert sorted(e.env.get("cache_key_tag", "") for e in read_url(url, tmp_path / "c1").entries) == ["", "x"]

    assert cli.main(["prune", url, "--drop", "cache_key_tag=x"]) == 0
    assert len(_packs(store)) == 5, "within the grace nothing goes"
    monkeypatch.setattr(packs, "GRACE_SECONDS", 0.0)
    assert cli.main(["merge", url, str(DATA_BUNDLE), "-o", url]) == 0
    assert len(_packs(store)) == 2, "the packs replaced before this write are gone once the grace passed"
    assert [e.env.get("cache_key_tag", "") for e in read_url(url, tmp_path / "c2").entries] == [""]


def test_a_pack_deleted_while_it_is_read(s3: str, tmp_path: Path) -> None:
    """A reader lists the packs and reads the tables; the pack is deleted before an artifact is read:
    that artifact cannot be used, said with the URL; a new reader finds no bundle."""
    url = f"{s3}/gone.bundle"
    store = _store(url, tmp_path / "a")
    store.add([_tagged("x", 1, 2, 3, 4)])  # past the pack's first 64 kB, which a reader reads at once
    env = _tagged("x").env
    reader = _store(url, tmp_path / "b").read(env)
    assert reader is not None
    entry = reader.find(env)
    assert entry is not None
    fs = store.client.filesystem()[0]
    for name in _packs(store):
        fs.rm_file(store.client.path(f"{PACKS}/{name}"))
    member = reader.members(entry).table[-1]
    with pytest.raises(Exception, match=f"{url}: cannot read {PACKS}/.*: it was removed while it was read"):
        reader.members(entry).read(member)
    assert _store(url, tmp_path / "c").read(env) is None


def test_a_damaged_pack_is_said_and_left_out(s3: str, built: Path, tmp_path: Path) -> None:
    """A pack whose table is damaged, or that is no bundle at all, is left out with one problem naming
    it, and the other packs are read; a damaged artifact fails its checksum when read, never reaching
    torch; no pack is ever written over."""
    url = f"{s3}/flip.bundle"
    store = _store(url, tmp_path / "a")
    store.add([_tagged("good")])
    fs = store.client.filesystem()[0]
    good = built.read_bytes()
    with read_manifest(built) as local:
        env = local.entries[0].env
        inside_table = local._start + local.entries[0].offset + 5
        inside_artifact = local._start + local.entries[0].offset + local.entries[0].size + 10
    bad = bytearray(good)
    bad[inside_table] ^= 0xFF
    fs.pipe_file(store.client.path(f"{PACKS}/table.bundle"), bytes(bad))
    fs.pipe_file(store.client.path(f"{PACKS}/junk.bundle"), b"hello, not a bundle")
    bundle = _store(url, tmp_path / "b").read()
    assert bundle is not None
    assert [e.env["cache_key_tag"] for e in bundle.entries] == ["good"]
    assert any(f"{url}/{PACKS}/table.bundle: corrupt: the table of artifacts" in p for p in bundle.problems)
    assert any(f"{url}/{PACKS}/junk.bundle: not a pytest-compilecache bundle" in p for p in bundle.problems)
    fs.rm_file(store.client.path(f"{PACKS}/table.bundle"))
    bad = bytearray(good)
    bad[inside_artifact] ^= 0xFF
    fs.pipe_file(store.client.path(f"{PACKS}/artifact.bundle"), bytes(bad))
    bundle = _store(url, tmp_path / "c").read(env)
    assert bundle is not None
    entry = bundle.find(env)
    assert entry is not None
    from pytest_compilecache.bundle.members import MemberDamaged

    with pytest.raises(MemberDamaged, match="fails its checksum|does not inflate"):
        list(bundle.members(entry).contents())
    assert fs.cat_file(store.client.path(f"{PACKS}/junk.bundle")) == b"hello, not a bundle"


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
            PackStore("gs://bundles/b.bundle", pytester.path, 30).read()


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


def test_with_the_key_set_an_unsigned_pack_is_replaced_not_kept(s3: str, built: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A pack written before signing was turned on already holds every artifact of this run: with the
    key set, the run still writes (a signed pack replacing the unsigned one), so the next run can use
    it, and then finds nothing to write."""
    from pytest_compilecache import _torchapi
    from pytest_compilecache.bundle.format import make_entry

    url = f"{s3}/signed.bundle"
    assert cli.main(["merge", "-o", url, str(built)]) == 0
    store = _store(url, tmp_path / "a")
    with read_manifest(built) as local:
        local.read_all()
        old = local.entries[0]
        payload = local.payload(old)
    monkeypatch.setenv("PYTEST_COMPILE_CACHE_KEY", "s3cret")
    assert store.add([make_entry(old.env, payload, _torchapi.describe_artifacts(payload))]).status is Written.SAVED
    bundle = read_url(url, tmp_path / "check")
    (entry,) = bundle.entries
    assert bundle.problems == [] and not bundle.signature_problem(entry, b"s3cret"), "the unsigned pack is replaced"
    saved = store.add([make_entry(old.env, payload, _torchapi.describe_artifacts(payload))])
    assert saved.status is Written.UNCHANGED, "now signed and complete: nothing to write"


def test_xdist_workers_load_the_warmup_pack(pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult],
                                            tmp_path: Path) -> None:
    """An updating session's warmup adds a pack beside what an earlier session left: every worker loads
    both, so a warm test hits what the warmup compiled and what the earlier session saved."""
    pytest.importorskip("xdist")
    url = f"local://{tmp_path / 'store' / 'b.bundle'}"
    pytester.makepyfile(test_earlier="""
import torch

def test_earlier():
    torch.compile(lambda x: torch.cos(x) - 2, dynamic=False)(torch.randn(8))
""")
    first = run_inner(f"--compile-cache-bundle={url}", ini=f"compile_cache_home = {pytester.path / 'home'}")
    assert first.ret == 0, first.stdout.str()
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
    assert result.ret == 0
    bundle = _report(report)
    assert sorted(p["status"] for p in bundle["processes"]) == ["loaded", "loaded"], bundle["processes"]
    assert all(p["reason"].startswith(f"{url}: ") for p in bundle["processes"]), bundle["processes"]
    assert len(list((tmp_path / "store" / "b.bundle" / PACKS).iterdir())) == 2
    assert "PROBLEM" not in result.stdout.str()


def test_a_plain_http_server_that_cannot_be_reached_is_not_a_missing_bundle(tmp_path: Path) -> None:
    pytest.importorskip("aiohttp", reason="aiohttp is not installed (pip install 'pytest-compilecache[http]')")
    dead = f"http://127.0.0.1:{free_port()}/suite.bundle"
    with pytest.raises(BundleError, match=f"^{dead}: cannot read it: .*(onnect|refused)"):
        PackStore(dead, tmp_path, 30).read()
    served = tmp_path / "www"
    served.mkdir()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(served),
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(port, proc, "http.server")
        assert PackStore(f"http://127.0.0.1:{port}/none.bundle", tmp_path, 30).read() is None, \
            "a 404 is a bundle that does not exist yet"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_missing_bucket_is_said_at_the_start(s3: str, tmp_path: Path) -> None:
    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/b.bundle"
    with pytest.raises(BundleError, match=f"^{url}: no such bucket"):
        PackStore(url, tmp_path, 30).read()
    assert PackStore(f"{s3}/not-yet.bundle", tmp_path, 30).read() is None


def test_urls_are_parsed_and_shown_without_credentials(tmp_path: Path, capsys: Any) -> None:
    from pytest_compilecache.storage.urls import file_url_path, is_url

    signed = PackStore("https://user:pw@cdn.example/b.bundle?X-Amz-Signature=abc", tmp_path, 30)
    assert signed.name == "https://cdn.example/b.bundle"
    azure = "abfs://container@account.dfs.core.windows.net/ci/b.bundle"
    assert PackStore(azure, tmp_path, 30).name == azure, "a container@account is no credential"
    from pytest_compilecache.storage.urls import redacted

    assert redacted("rediss://:s3cret@cache.internal:6380/0") == "rediss://cache.internal:6380/0"
    other = PackStore("https://cdn.example/b.bundle?X-Amz-Signature=other", tmp_path, 30)
    assert signed.folder == other.folder, \
        "a presigned URL that changes every run keeps one folder of kept parts"
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


def test_a_rebuild_replaces_an_unreadable_pack_and_says_so_once(s3: str, built: Path, tmp_path: Path) -> None:
    url = f"{s3}/unreadable.bundle"
    store = _store(url, tmp_path / "a")
    bad = bytearray(built.read_bytes())
    bad[40] ^= 0xFF  # in the manifest
    store.client.filesystem()[0].pipe_file(store.client.path(f"{PACKS}/old.bundle"), bytes(bad))
    saved = store.add([_tagged("fresh")], rebuild=True)
    assert len(saved.dropped) == 1 and "could not be read" in saved.dropped[0] and "old.bundle" in saved.dropped[0]
    bundle = read_url(url, tmp_path / "check")
    assert [e.env["cache_key_tag"] for e in bundle.entries] == ["fresh"] and bundle.problems == []


def test_the_command_line_takes_storage_options(s3: str, built: Path, endpoint: str, capsys: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint given only as storage options (as in an ini file) reaches the command line too:
    through --storage-options or the environment variable the plugin also reads."""
    url = f"{s3}/cli.bundle"
    assert cli.main(["merge", "-o", url, str(built)]) == 0
    assert capsys.readouterr().out == f"{url}: 1 environment from 1 bundle added\n"
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
    """Through Azure Blob (Azurite): the first shard creates the bundle (one pack), a fresh runner
    (an updating one) loads it and hits, and with nothing new it uploads nothing."""
    url = f"{az}/ci/suite.bundle"
    pytester.makepyfile(test_s=TESTS)
    reports = []
    for n, args in enumerate(((), ("--compile-cache-update",))):
        report = pytester.path / f"r{n}.json"
        result = run_inner(f"--compile-cache-bundle={url}", f"--compile-cache-report={report}", *args,
                           ini=f"compile_cache_home = {pytester.path / ('home-' + str(min(n, 1)))}")
        assert result.ret == 0 and "Traceback" not in result.stdout.str(), result.stdout.str()
        reports.append(json.loads(report.read_text()))
    first, second = reports
    assert first["bundle"]["saved"]["status"] == "saved" and first["totals"]["fx_graph"]["misses"] == 1
    assert second["bundle"]["processes"][0]["status"] == "loaded"
    assert second["bundle"]["processes"][0]["downloaded_bytes"] > 0
    assert second["totals"]["fx_graph"]["hits"] == 1 and second["totals"]["fx_graph"]["misses"] == 0
    assert second["bundle"]["saved"]["status"] == "unchanged"
    assert second["bundle"]["saved"]["transfer"]["uploaded"] == 0


def test_a_run_that_adds_nothing_reads_only_its_own_entry_and_writes_nothing(s3: str, tmp_path: Path) -> None:
    """Machine B keeps nothing of the bundle (a fresh runner): to learn that its run adds nothing it reads
    the packs' manifests and its own entry's table, downloads no artifact, and writes nothing."""
    url = f"{s3}/stale.bundle"
    a = _store(url, tmp_path / "a")
    for other in ("one", "two", "three"):
        a.add([_tagged(f"other machine {other}", 1, 2, 3)])
    a.add([_tagged("b", 1, 2, 3)])
    saved = _store(url, tmp_path / "b").add([_tagged("b", 1, 2, 3)])
    assert saved.status is Written.UNCHANGED and saved.transfer.uploaded == 0
    assert 0 < saved.transfer.downloaded < saved.size * 0.4, (saved.transfer.downloaded, saved.size)


def test_the_object_at_the_url_itself_is_read_never_replaced(s3: str, tmp_path: Path) -> None:
    """A bundle file at the URL (the layout before packs, or one served as a file) is read as one more pack;
    a compaction writes a pack beside it and replaces packs only: the file stays as it was, and is read on."""
    url = f"{s3}/suite.bundle"
    store = _store(url, tmp_path / "a")
    fs = store.client.filesystem()[0]
    fs.pipe_file(store.client.path(), DATA_BUNDLE.read_bytes())
    bundle = store.read()
    assert bundle is not None and len(bundle.entries) == 1
    assert cli.main(["merge", url, "-o", url]) == 0
    assert fs.cat_file(store.client.path()) == DATA_BUNDLE.read_bytes()
    again = _store(url, tmp_path / "b")
    bundle = again.read()
    assert bundle is not None and len(bundle.entries) == 1 and len(again._listing()) == 2
