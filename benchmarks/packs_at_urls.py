"""CPU, issue 57: a bundle at a URL as packs (bundle files under ``URL/packs/``, read by range when used, one new
pack per update) against one object (an update downloads it whole, rewrites it and uploads it whole).

A real suite of 60 ``warm_cache`` tests, each compiling its own function, is built into a bundle once; stores of 200
and 1,000 tests' worth are that bundle padded with the plugin's bundle API. A side (``--side=NAME=DIR``) is the
plugin of a checkout found first through ``PYTHONPATH``: without ``storage/packs.py``, the bundle is put at the URL
as one object; with it, pushed with ``python -m pytest_compilecache merge FILE -o URL``. Each run is a fresh CI
runner (new ``compile_cache_home`` and ``TMPDIR``) on moto's S3 on loopback, behind a proxy counting what the server
sends ("wire"). Sides alternate each round: 1. one test (``-k``) of 200 and of 1,000; 2. the whole 60-test suite; 3.
an update after one edited function (empty warmup hook) at 60 and 1,000, a fresh store each run; 4. 8 shards at
once, each one new function with ``--compile-cache-update``, against one alone, then the store read back and the 8
new tests run from it (no FX graph may be lost): on S3 for every side, on Azurite and fake-gcs-server for packs.

    PYTHONPATH=/tmp/new-code python benchmarks/packs_at_urls.py --side=old=/tmp/old-code --side=new=/tmp/new-code \
        [--keep=DIR] [ROUNDS]

(``git worktree add /tmp/old-code 4e71462``.) ``--keep=DIR``: built there once (2 minutes), reused after.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
import servers  # noqa: E402
from probe.runner import pytest_run, spread  # noqa: E402
from small_tests_vs_kept import QUIET, WARMUP, functions  # noqa: E402
from update_vs_loading import EMPTY_WARMUP, S3  # noqa: E402

REAL, NEW, EDITED = 60, 8, 30
ONE = f"test_warm_{EDITED:03d}"
OPTIONS = "PYTEST_COMPILE_CACHE_STORAGE_OPTIONS"
folder_of = lambda url: url.split("://", 1)[1].rsplit("/", 1)[0]  # noqa: E731  (a bucket's path to a URL's folder)


class Counted(servers.FaultProxy):
    """A proxy with no faults that counts the bytes the server sends back."""
    down = 0

    def _send(self, client: Any, data: bytes) -> None:
        with self._lock:
            self.down += len(data)
        super()._send(client, data)


class Store:
    """An object store on loopback (``fs``: fsspec's, direct), a folder of ``root`` per bundle; ``env`` reaches it
    through ``proxy``."""

    def __init__(self, scheme: str, fs: Any, root: str, env: dict[str, str], proxy: Counted) -> None:
        self.scheme, self.fs, self.root, self.env, self.proxy = scheme, fs, root, env, proxy

    def fresh(self, side: dict[str, Any], bundle: Path) -> str:
        """A new URL holding ``bundle`` as ``side`` reads it: one object, or one pack pushed with ``merge``."""
        url = f"{self.scheme}://{self.root}/{uuid.uuid4().hex[:10]}/suite.bundle"
        if side["packs"]:
            subprocess.run([sys.executable, "-m", "pytest_compilecache", "merge", str(bundle), "-o", url], check=True,
                           cwd=bundle.parent, env={**os.environ, **self.env, **side["env"]}, capture_output=True)
        else:
            self.fs.put_file(str(bundle), url.split("://", 1)[1])
        return url

    def size(self, url: str) -> tuple[int, int]:
        """Bytes and objects under the URL's folder (the object at the URL and its packs)."""
        self.fs.invalidate_cache()
        found = self.fs.find(folder_of(url), detail=True)
        return sum(int(f.get("size") or 0) for f in found.values()), len(found)

    def drop(self, url: str) -> None:
        self.fs.rm(folder_of(url), recursive=True)

    def fx_graphs(self, url: str) -> int:
        """FX graphs in the URL's entry, its packs read as a session reads them (``PackStore.read``)."""
        from pytest_compilecache.storage.packs import PackStore

        os.environ.update(self.env)
        read = PackStore(url, Path(tempfile.mkdtemp(prefix="read-back-")), 30, json.loads(self.env.get(OPTIONS, "{}")))
        return read.read().entries[0].artifacts["inductor"]["count"]


@contextlib.contextmanager
def store_on(kind: str) -> Iterator[Store | None]:
    """S3 (moto), Azure Blob (Azurite) or GCS (fake-gcs-server) on loopback behind a counting proxy (None: not here)."""
    if kind == "s3":
        with servers.s3_server() as (endpoint, _), Counted(int(endpoint.rsplit(":", 1)[1])) as proxy:
            s3 = S3(endpoint)
            yield Store("s3", s3.fs, s3.bucket, {**s3.env, "AWS_ENDPOINT_URL": proxy.url}, proxy)
    elif kind == "az" and shutil.which("azurite-blob"):
        import adlfs

        with servers.azurite_server() as port, Counted(port) as proxy:
            fs = adlfs.AzureBlobFileSystem(connection_string=servers.azurite_connection(port), skip_instance_cache=True)
            fs.mkdir("bench")
            yield Store("az", fs, "bench", {"AZURE_STORAGE_CONNECTION_STRING": servers.azurite_connection(proxy.port)},
                        proxy)
    elif kind == "gs" and hasattr(servers, "gcs_server"):
        with servers.gcs_server() as endpoint, Counted(int(endpoint.rsplit(":", 1)[1])) as proxy:
            import gcsfs

            fs = gcsfs.GCSFileSystem(**servers.gcs_options(endpoint), skip_instance_cache=True)
            fs.mkdir("bench")
            yield Store("gs", fs, "bench", {**servers.GCS_ENV, OPTIONS: json.dumps(servers.gcs_options(proxy.url))},
                        proxy)
    else:
        yield None


def run(side: dict[str, Any], suite: Path, store: Store, url: str, *args: str) -> dict[str, float]:
    """One pytest session as a fresh CI runner: seconds, bytes down and up (its report's; "wire": counted by the
    proxy meanwhile), FX graph hits and misses."""
    home = Path(tempfile.mkdtemp(prefix="runner-", dir=suite.parent))
    (home / "tmp").mkdir()
    report, wire = home / "report.json", store.proxy.down
    seconds = pytest_run([*QUIET, f"--compile-cache-bundle={url}", "-o", f"compile_cache_home={home}",
                          f"--compile-cache-report={report}", *args], suite,
                         {**store.env, **side["env"], "TMPDIR": str(home / "tmp")},
                         unset=[k for k in os.environ if k.startswith(("PYTEST_", "TORCHINDUCTOR_"))]).seconds
    data = json.loads(report.read_text())
    bundle, fx = data["bundle"], data["totals"]["fx_graph"]
    moved = (bundle.get("saved") or {}).get("transfer") or {}
    shutil.rmtree(home, ignore_errors=True)
    return {"seconds": seconds, "down": sum(p.get("downloaded_bytes") or 0 for p in bundle.get("processes", []))
            + moved.get("downloaded", 0), "up": moved.get("uploaded", 0), "wire": store.proxy.down - wire,
            "hits": fx["hits"], "misses": fx["misses"]}


def build(folder: Path) -> Path:
    """The suite (REAL tests, NEW more functions) in ``folder``/suite and its bundle, unless built there before."""
    suite, bundle = folder / "suite", folder / "suite.bundle"
    if not bundle.exists():
        shutil.rmtree(suite, ignore_errors=True)
        suite.mkdir(parents=True)
        (suite / "small.py").write_text(functions(REAL + NEW))
        (suite / "test_small.py").write_text("from small import run\n\n" + "".join(
            f"\ndef test_warm_{i:03d}(warm_cache):\n    run({i})\n\n" for i in range(REAL)))
        (suite / "conftest.py").write_text(WARMUP.format(first=0, last=REAL))
        took = pytest_run([*QUIET, f"--compile-cache-bundle={bundle}", "-o", f"compile_cache_home={folder / 'home'}"],
                          suite).seconds
        print(f"built {REAL} tests and their bundle in {took:.1f} s", flush=True)
    return bundle


def pad(source: Path, tests: int) -> Path:
    """``source`` grown to ``tests`` tests' worth: its artifacts, carried binaries (each copy in another hash folder),
    key records, uses and tests copied under other keys (each key's last 4 characters a counter in hex)."""
    from pytest_compilecache.bundle.binaries import CarriedBinaries
    from pytest_compilecache.bundle.format import Bundle, entry_of, read_manifest
    from pytest_compilecache.bundle.writing import write_bundle
    from pytest_compilecache.bundle.keyindex import artifact_id, binary_id
    from pytest_compilecache.bundle.members import Members

    out = source.with_name(f"padded-{tests}.bundle")
    if out.exists():
        return out
    with read_manifest(source) as bundle:
        (entry,) = bundle.entries
        real = list(bundle.members(entry).contents())
        carried, _ = bundle.carried(entry)
        index, _ = bundle.key_index(entry)
        files = sorted(carried.files.items())
        binaries = CarriedBinaries(dict(carried.builds))
        for (build_, path), file in files:
            binaries.add(build_, path, file.content())
        artifacts, used = list(real), []
        for n in range(round((tests / REAL - 1) * len(real))):
            (kind, key, content), copy = real[n % len(real)], 1 + n // len(real)
            artifacts.append((kind, key[:-4] + f"{copy:04x}", content))
            used.append(artifact_id(kind, artifacts[-1][1]))
            if key in index.keys:
                index.keys.put(artifacts[-1][1], index.keys[key])
        for n in range(round((tests / REAL - 1) * len(files))):
            ((build_, path), file), copy = files[n % len(files)], 1 + n // len(files)
            folder, _, name = path.rpartition("/")
            stem, dot, rest = name.partition(".")
            other = base64.b32encode(hashlib.sha256(f"{folder}/{copy}".encode()).digest()).decode().lower()[:2]
            binaries.add(build_, f"{other}/{stem[:-4]}{copy:04x}{dot}{rest}", file.content())
            used.append(binary_id(f"{stem[:-4]}{copy:04x}"))
        index.used.update(dict.fromkeys(used, max(index.used.values(), default=0.0)))
        padded = entry_of(entry.env, Members.packed(artifacts), entry.created, binaries, index)
        recorded = dict(entry.history.get("tests") or {})
        padded.history = {**entry.history, "tests": {**recorded, **{
            f"test_small.py::test_pad_{i:04d}": 0.1 for i in range(tests - len(recorded))}}}
        write_bundle(Bundle(out, [padded]))
    print(f"padded to {tests} tests: {len(artifacts)} artifacts, {len(binaries.files)} carried binaries, "
          f"{out.stat().st_size / 1e6:.2f} MB (the real {REAL}: {source.stat().st_size / 1e6:.2f} MB)", flush=True)
    return out


def alternate(sides: dict[str, dict[str, Any]], rounds: int, once: Any, title: str, store: dict[str, int]) -> None:
    """``once(side)``'s figures, ``rounds`` rounds, the sides' order alternating; a row per side."""
    seen: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for round_ in range(rounds):
        for name in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):
            seen[name].append(once(sides[name]))
    print(f"\n{title}\n\n| side | seconds | each round's ratio to {next(iter(seen))} | MB down (report) | "
          "MB down (wire) | % of the store (wire) | MB up | FX graph hits, misses |\n|---|---|---|---|---|---|---|---|")
    for name, runs in seen.items():
        got = {k: [r[k] for r in runs] for k in runs[0]}
        ratios = [s / r["seconds"] for s, r in zip(got["seconds"], next(iter(seen.values())))]
        mb = {k: [v / 1e6 for v in got[k]] for k in ("down", "wire", "up")}
        print(f"| {name} | {spread(got['seconds'])} | {spread(ratios, 3)}x | {spread(mb['down'], 3)}"
              f" | {spread(mb['wire'], 3)} | {spread([100 * d / store[name] for d in got['wire']], 1)}"
              f" | {spread(mb['up'], 3)} | {min(got['hits']):.0f}-{max(got['hits']):.0f}, "
              f"{min(got['misses']):.0f}-{max(got['misses']):.0f} |", flush=True)


def loading(sides: dict[str, dict[str, Any]], s3: Store, suite: Path, bundle: Path, rounds: int) -> None:
    """1. one test of 200 and of 1,000 (padded); 2. the whole real suite."""
    for tests, source, args in ((200, pad(bundle, 200), ["-k", ONE]), (1000, pad(bundle, 1000), ["-k", ONE]),
                                (REAL, bundle, [])):
        urls = {name: s3.fresh(side, source) for name, side in sides.items()}
        store = {name: s3.size(url)[0] for name, url in urls.items()}
        alternate(sides, rounds, lambda side: run(side, suite, s3, urls[side["name"]], *args),
                  f"{f'one test (-k {ONE}) of {tests}' if args else f'the whole suite of {REAL} tests'}, "
                  f"a fresh runner each run, {rounds} rounds; store "
                  f"{', '.join(f'{n} {b / 1e6:.2f} MB' for n, b in store.items())}",
                  store)
        for url in urls.values():
            s3.drop(url)


def update(sides: dict[str, dict[str, Any]], s3: Store, suite: Path, bundle: Path, rounds: int) -> None:
    """3. an update after one edited function, a fresh store each run; the FX graphs in the store after."""
    edited = suite.parent / "edited"
    shutil.copytree(suite, edited, dirs_exist_ok=True)
    (edited / "conftest.py").write_text(EMPTY_WARMUP)
    (edited / "small.py").write_text((suite / "small.py").read_text().replace(
        f"def f_{EDITED}(x):\n    y = torch.sin(x * ", f"def f_{EDITED}(x):\n    y = torch.sin(x * 2 * "))
    for tests, source in ((REAL, bundle), (1000, pad(bundle, 1000))):
        store: dict[str, int] = {}

        def once(side: dict[str, Any]) -> dict[str, float]:
            url = s3.fresh(side, source)
            store[side["name"]] = s3.size(url)[0]
            got = run(side, edited, s3, url, "-k", ONE, "--compile-cache-update")
            (after, objects), graphs = s3.size(url), s3.fx_graphs(url)
            s3.drop(url)
            print(f"  {side['name']}, update at {tests}: {got['seconds']:.2f} s, store {store[side['name']] / 1e6:.3f} "
                  f"-> {after / 1e6:.3f} MB in {objects} object(s), {graphs} FX graphs", flush=True)
            return got

        alternate(sides, rounds, once, f"an update after one edit (-k {ONE} --compile-cache-update, empty warmup hook)"
                  f" at {tests} tests, a fresh runner and store each run, {rounds} rounds", store)


def shards(side: dict[str, Any], store: Store, suite: Path, bundle: Path) -> None:
    """4. NEW shards at once, each one new test, against one alone; the store read back, the new tests run again."""
    folder = suite.parent / "shards"
    shutil.copytree(suite, folder, dirs_exist_ok=True)
    (folder / "conftest.py").write_text(EMPTY_WARMUP)
    (folder / "test_new.py").write_text("from small import run\n\n" + "".join(
        f"\ndef test_new_{i}(warm_cache):\n    run({REAL + i})\n\n" for i in range(NEW)))
    url = store.fresh(side, bundle)
    alone = run(side, folder, store, url, "-k", "test_new_0", "--compile-cache-update")
    store.drop(url)
    url = store.fresh(side, bundle)
    (size, _), graphs = store.size(url), store.fx_graphs(url)
    begun, wire = time.perf_counter(), store.proxy.down
    with concurrent.futures.ThreadPoolExecutor(NEW) as pool:  # each a process of its own
        each = list(pool.map(lambda i: run(side, folder, store, url, "-k", f"test_new_{i}", "--compile-cache-update"),
                             range(NEW)))
    wall, wire = time.perf_counter() - begun, store.proxy.down - wire
    (after, objects), now = store.size(url), store.fx_graphs(url)
    again = run(side, folder, store, url, "-k", "test_new")
    store.drop(url)
    print(f"| {store.scheme} | {side['name']} | {wall:.1f} s ({alone['seconds']:.1f} s) | "
          f"{sum(e['up'] for e in each) / 1e6:.3f} MB ({alone['up'] / 1e6:.3f} MB) | {size / 1e6:.3f} -> "
          f"{after / 1e6:.3f} MB, {objects} object(s) | {wire / 1e6:.2f} MB | {graphs} -> {now}: "
          f"{NEW - (now - graphs)} lost | {again['hits']:.0f}, {again['misses']:.0f} |", flush=True)


def main() -> None:
    sides = {n: {"name": n, "env": {"PYTHONPATH": str(Path(d).resolve())},
                 "packs": (Path(d) / "pytest_compilecache" / "storage" / "packs.py").exists()}
             for n, d in (a[7:].split("=", 1) for a in sys.argv[1:] if a.startswith("--side="))}
    keep = next((Path(a[7:]).resolve() for a in sys.argv[1:] if a.startswith("--keep=")), None)
    args = [a for a in sys.argv[1:] if not a.startswith(("--side=", "--keep="))]
    if not sides:
        raise SystemExit(__doc__)
    rounds = int(args[0]) if args else 5
    work = keep or Path(tempfile.mkdtemp(prefix="packs-at-urls-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    for name, side in sides.items():  # found through PYTHONPATH, not the editable install (run outside the checkout)
        found = subprocess.run([sys.executable, "-c", "import pytest_compilecache as p; print(p.__file__)"], cwd=work,
                               env={**os.environ, **side["env"]}, capture_output=True, text=True).stdout
        assert found.startswith(side["env"]["PYTHONPATH"]), (name, found)
        print(f"{name}: {found.strip()} ({'packs under URL/packs/' if side['packs'] else 'one object at the URL'})")
    bundle, suite = build(work), work / "suite"
    try:
        with store_on("s3") as s3:
            loading(sides, s3, suite, bundle, rounds)
            update(sides, s3, suite, bundle, rounds)
            print(f"\n{NEW} shards updating at once, each a new function, fresh runners (one alone in brackets):\n\n"
                  "| store | side | wall | MB up, report | store | MB down, wire | FX graphs | the new tests again: "
                  "hits, misses |\n|---|---|---|---|---|---|---|---|")
            for _ in range(max(1, rounds // 2)):
                for side in sides.values():
                    shards(side, s3, suite, bundle)
        for kind in ("az", "gs"):
            with store_on(kind) as store:
                for side in (s for s in sides.values() if s["packs"] and store is not None):
                    shards(side, store, suite, bundle)
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
