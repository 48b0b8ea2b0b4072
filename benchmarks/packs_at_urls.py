"""CPU, issue 57: a bundle at a URL as packs (immutable bundle files under ``URL/packs/``, read by range when used,
one new pack per update) against one object (downloaded whole by an update, rewritten and uploaded whole).

A real suite of 60 ``warm_cache`` tests, each compiling a function of its own (``small_tests_vs_kept.py``'s
generator, 8 more functions left for new tests), is built once into a bundle; stores of 200 and 1,000 tests' worth
are that bundle padded (its artifacts, carried binaries, key records and tests copied under other keys, with the
plugin's own bundle API). Each side is the plugin from another checkout (``--side=NAME=DIR``, found first through
``PYTHONPATH``); a checkout without ``storage/packs.py`` gets the bundle put as one object at the URL, one with it
gets it pushed with ``python -m pytest_compilecache merge FILE -o URL``. Every run is a fresh CI runner (new
``compile_cache_home`` and ``TMPDIR``) against moto's S3 server on loopback, reached through a proxy that counts
the bytes the server sends (``wire``, HTTP headers and listings included). Printed, sides alternating each round:

1. one test (``-k``) of 200 and of 1,000: seconds, bytes down (the report's, and on the wire), as a % of the store;
2. the whole 60-test suite: seconds, bytes down, FX graph hits;
3. an update after one edited function (its test with ``-k`` and ``--compile-cache-update``, an empty warmup
   hook), at 60 and 1,000 tests: seconds, bytes up, the store before and after;
4. 8 shards updating at once, each one new test (a function not in the bundle), against one shard alone; then
   the store read back (``PackStore.read``) and the 8 new tests run once more: no FX graph may be lost. On S3
   for every side, and for sides with packs on Azurite too where ``azurite-blob`` is installed.

    PYTHONPATH=/tmp/new-code python benchmarks/packs_at_urls.py --side=old=/tmp/old-code --side=new=/tmp/new-code \
        [--keep=DIR] [ROUNDS]

``--keep=DIR``: the suite and its bundle are built in DIR (about 2 minutes) unless built there before.
"""

from __future__ import annotations

import base64
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
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from probe.runner import pytest_run, spread  # noqa: E402
from servers import FaultProxy, azurite_connection, azurite_server, s3_server  # noqa: E402
from small_tests_vs_kept import QUIET, WARMUP, functions  # noqa: E402
from update_vs_loading import EMPTY_WARMUP, S3  # noqa: E402

REAL, NEW, EDITED = 60, 8, 30
ONE = f"test_warm_{EDITED:03d}"


class Counted(FaultProxy):
    """A proxy with no faults that counts the bytes the server sends back."""

    down = 0

    def _send(self, client: Any, data: bytes) -> None:
        with self._lock:
            self.down += len(data)
        super()._send(client, data)


class Store:
    """An object store on loopback (``fs``: fsspec's, talking to it directly), a folder under ``root`` per bundle;
    ``env`` reaches it through ``proxy``."""

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
        """Bytes and objects under ``url`` (the object itself and its packs)."""
        self.fs.invalidate_cache()
        found = self.fs.find(url.split("://", 1)[1].rsplit("/", 1)[0], detail=True)
        return sum(int(f.get("size") or 0) for f in found.values()), len(found)

    def drop(self, url: str) -> None:
        self.fs.rm(url.split("://", 1)[1].rsplit("/", 1)[0], recursive=True)


def run(side: dict[str, Any], suite: Path, store: Store, url: str, *args: str, start: bool = False) -> Any:
    """One pytest session as a fresh CI runner; its figures (or, with ``start``, the process and a reader of them)."""
    home = Path(tempfile.mkdtemp(prefix="runner-", dir=suite.parent))
    (home / "tmp").mkdir()
    report = home / "report.json"
    env = {**store.env, **side["env"], "TMPDIR": str(home / "tmp")}
    argv = [*QUIET, f"--compile-cache-bundle={url}", "-o", f"compile_cache_home={home}",
            f"--compile-cache-report={report}", *args]
    wire = store.proxy.down

    def figures(seconds: float) -> dict[str, float]:
        data = json.loads(report.read_text())
        bundle, fx = data["bundle"], data["totals"]["fx_graph"]
        moved = (bundle.get("saved") or {}).get("transfer") or {}
        shutil.rmtree(home, ignore_errors=True)
        return {"seconds": seconds, "down": sum(p.get("downloaded_bytes") or 0 for p in bundle.get("processes", []))
                + moved.get("downloaded", 0), "up": moved.get("uploaded", 0), "wire": store.proxy.down - wire,
                "hits": fx["hits"], "misses": fx["misses"]}

    if start:
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TORCHINDUCTOR_"))}
        proc = subprocess.Popen([sys.executable, "-m", "pytest", *argv], cwd=suite, env={**environment, **env},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return proc, figures
    return figures(pytest_run(argv, suite, env, unset=[k for k in os.environ if k.startswith("PYTEST_")]).seconds)


def build(folder: Path) -> Path:
    """The suite (REAL tests, NEW more functions for new tests) and its bundle, unless built in ``folder`` before."""
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
    """``source`` grown to ``tests`` tests' worth: its artifacts, carried binaries, key records and tests copied
    under other keys (each key's last 4 characters a counter in hex), the real ones kept as they are."""
    from pytest_compilecache.bundle.binaries import CarriedBinaries
    from pytest_compilecache.bundle.format import Bundle, entry_of, read_manifest, write_bundle
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
        copies = tests / REAL - 1

        def renamed(key: str, n: int) -> str:
            return key[:-4] + f"{n:04x}"

        artifacts = real + [(kind, renamed(key, 1 + n // len(real)), content) for n, (kind, key, content)
                            in ((n, real[n % len(real)]) for n in range(round(copies * len(real))))]
        binaries = CarriedBinaries(dict(carried.builds))
        files = sorted(carried.files.items())
        for (build_, path), file in files:
            binaries.add(build_, path, file.content())
        padded_ids = []
        for n in range(round(copies * len(files))):  # each copy in a hash folder of its own, as another key's
            (build_, path), file = files[n % len(files)]
            folder, _, name = path.rpartition("/")
            stem, dot, rest = name.partition(".")
            copy = 1 + n // len(files)
            other = base64.b32encode(hashlib.sha256(f"{folder}/{copy}".encode()).digest()).decode().lower()[:2]
            binaries.add(build_, f"{other}/{renamed(stem, copy)}{dot}{rest}", file.content())
            padded_ids.append(binary_id(renamed(stem, copy)))
        if index is not None:
            for n in range(round(copies * len(real))):
                kind, key, _ = real[n % len(real)]
                if key in index.keys:
                    index.keys.put(renamed(key, 1 + n // len(real)), index.keys[key])
                padded_ids.append(artifact_id(kind, renamed(key, 1 + n // len(real))))
            index.used.update(dict.fromkeys(padded_ids, max(index.used.values(), default=0.0)))
        history = dict(entry.history)
        recorded = dict(history.get("tests") or {})
        history["tests"] = {**recorded, **{f"test_small.py::test_pad_{i:04d}": 0.1 for i in range(tests - len(recorded))}}
        padded = entry_of(entry.env, Members.packed(artifacts), entry.created, binaries or None, index)
        padded.history = history
        write_bundle(Bundle(out, [padded]))
    print(f"padded to {tests} tests: {len(artifacts)} artifacts, {len(binaries.files)} carried binaries, "
          f"{out.stat().st_size / 1e6:.2f} MB (the real {REAL}: {source.stat().st_size / 1e6:.2f} MB)", flush=True)
    return out


def alternate(sides: dict[str, dict[str, Any]], rounds: int, once: Any) -> dict[str, list[dict[str, float]]]:
    """``once(side)``'s figures for each side, ``rounds`` rounds, the order alternating each round."""
    seen: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for round_ in range(rounds):
        for name in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):
            seen[name].append(once(sides[name]))
    return seen


def table(title: str, seen: dict[str, list[dict[str, float]]], store: dict[str, int], *, up: bool = False) -> None:
    """One row per side: seconds, MB down (report, wire), % of the store, MB up, FX graph hits/misses."""
    print(f"\n{title}\n\n| side | seconds | MB down (report) | MB down (wire) | % of the store | "
          f"{'MB up | ' if up else ''}FX graph hits/misses |\n|---|---|---|---|---|{'---|' if up else ''}---|")
    first = next(iter(seen))
    for name, runs in seen.items():
        get = lambda k: [r[k] for r in runs]  # noqa: E731
        ratio = f", {spread([a / b for a, b in zip(get('seconds'), [r['seconds'] for r in seen[first]])], 3)}x " \
                f"each round's ratio to {first}" if name != first else ""
        print(f"| {name} | {spread(get('seconds'))}{ratio} | {spread([d / 1e6 for d in get('down')], 3)} | "
              f"{spread([d / 1e6 for d in get('wire')], 3)} | {spread([100 * d / store[name] for d in get('wire')], 1)}"
              f" | {spread([u / 1e6 for u in get('up')], 3) + ' | ' if up else ''}"
              f"{'/'.join(f'{min(get(k)):.0f}-{max(get(k)):.0f}' for k in ('hits', 'misses'))} |", flush=True)


def one_test_and_suite(sides: dict[str, dict[str, Any]], s3: Store, suite: Path, bundle: Path, rounds: int) -> None:
    """1. one test of 200 and of 1,000 (padded); 2. the whole real suite."""
    for tests, source, args in ((200, pad(bundle, 200), ["-k", ONE]), (1000, pad(bundle, 1000), ["-k", ONE]),
                                (REAL, bundle, [])):
        urls = {name: s3.fresh(side, source) for name, side in sides.items()}
        store = {name: s3.size(url)[0] for name, url in urls.items()}
        seen = alternate(sides, rounds, lambda side: run(side, suite, s3, urls[side["name"]], *args))
        what = f"one test (-k {ONE}) of {tests}" if args else f"the whole suite of {REAL} tests"
        table(f"{what}, a fresh runner each run, {rounds} rounds; store: " + ", ".join(
            f"{n} {b / 1e6:.2f} MB" for n, b in store.items()), seen, store)
        for url in urls.values():
            s3.drop(url)


def update(sides: dict[str, dict[str, Any]], s3: Store, suite: Path, bundle: Path, rounds: int) -> None:
    """3. an update after one edited function, on a fresh store each run; the FX graphs in the store after."""
    edited = suite.parent / "edited"
    shutil.copytree(suite, edited, dirs_exist_ok=True)
    (edited / "conftest.py").write_text(EMPTY_WARMUP)
    small = (edited / "small.py").read_text()
    (edited / "small.py").write_text(small.replace(f"def f_{EDITED}(x):\n    y = torch.sin(x * ",
                                                   f"def f_{EDITED}(x):\n    y = torch.sin(x * 2 * "))
    os.environ.update(s3.env)  # this process reads the store too
    for tests, source in ((REAL, bundle), (1000, pad(bundle, 1000))):
        store, graphs = {}, {}

        def once(side: dict[str, Any]) -> dict[str, float]:
            url = s3.fresh(side, source)
            before, _ = s3.size(url)
            got = run(side, edited, s3, url, "-k", ONE, "--compile-cache-update")
            after, objects = s3.size(url)
            store[side["name"]] = before
            graphs.setdefault(side["name"], set()).add(fx_graphs(s3, url))
            s3.drop(url)
            print(f"  {side['name']} update at {tests}: store {before / 1e6:.3f} -> {after / 1e6:.3f} MB in "
                  f"{objects} object(s), {got}", flush=True)
            return got

        seen = alternate(sides, rounds, once)
        table(f"update after one edit (-k {ONE} --compile-cache-update, empty warmup hook) at {tests} tests, "
              f"{rounds} rounds; FX graphs in the store after: {graphs}", seen, store, up=True)


def fx_graphs(store: Store, url: str) -> int:
    """FX graphs in the store's entry, its packs read back as a reader does (``PackStore.read``)."""
    from pytest_compilecache.storage.packs import PackStore

    os.environ.update(store.env)
    read = PackStore(url, Path(tempfile.mkdtemp(prefix="read-back-")), 30).read()
    return read.entries[0].artifacts["inductor"]["count"] if read else 0


def shards(side: dict[str, Any], store: Store, suite: Path, bundle: Path, rounds: int) -> None:
    """4. NEW shards at once, each one new test with ``--compile-cache-update``, against one alone; the store read
    back, and the NEW tests run once more from it: every new FX graph must be there."""
    folder = suite.parent / "shards"
    shutil.copytree(suite, folder, dirs_exist_ok=True)
    (folder / "conftest.py").write_text(EMPTY_WARMUP)
    (folder / "test_new.py").write_text("from small import run\n\n" + "".join(
        f"\ndef test_new_{i}(warm_cache):\n    run({REAL + i})\n\n" for i in range(NEW)))
    for _ in range(rounds):
        url = store.fresh(side, bundle)
        alone = run(side, folder, store, url, "-k", "test_new_0", "--compile-cache-update")
        store.drop(url)
        url = store.fresh(side, bundle)
        (size, _), graphs = store.size(url), fx_graphs(store, url)
        started = [run(side, folder, store, url, "-k", f"test_new_{i}", "--compile-cache-update", start=True)
                   for i in range(NEW)]
        begun = time.perf_counter()
        outputs = [proc.communicate(timeout=900)[0] for proc, _ in started]
        wall = time.perf_counter() - begun
        for (proc, _), output in zip(started, outputs):
            if proc.returncode != 0:
                raise SystemExit(f"a shard failed ({proc.returncode}):\n{output[-4000:]}")
        each = [figures(wall) for _, figures in started]
        (after, objects), now = store.size(url), fx_graphs(store, url)
        again = run(side, folder, store, url, "-k", "test_new")
        store.drop(url)
        lost = NEW - (now - graphs)
        print(f"  {store.scheme}, {side['name']}: {NEW} shards at once {wall:.2f} s (one alone {alone['seconds']:.2f} s, "
              f"{alone['up'] / 1e6:.3f} MB up); up {sum(e['up'] for e in each) / 1e6:.3f} MB in all (report), store "
              f"{size / 1e6:.3f} -> {after / 1e6:.3f} MB, {objects} object(s); down {each[0]['wire'] / 1e6:.3f} MB "
              f"on the wire; FX graphs {graphs} -> {now}: {lost} lost; the {NEW} new tests again: "
              f"{again['hits']:.0f} hits, {again['misses']:.0f} misses", flush=True)


def main() -> None:
    sides = {n: {"name": n, "env": {"PYTHONPATH": str(Path(d).resolve())}, "packs": (Path(d) / "pytest_compilecache"
             / "storage" / "packs.py").exists()} for n, d in (a[7:].split("=", 1) for a in sys.argv[1:]
                                                               if a.startswith("--side="))}
    keep = next((Path(a[7:]).resolve() for a in sys.argv[1:] if a.startswith("--keep=")), None)
    args = [a for a in sys.argv[1:] if not a.startswith(("--side=", "--keep="))]
    if not sides:
        raise SystemExit(__doc__)
    rounds = int(args[0]) if args else 5
    work = keep or Path(tempfile.mkdtemp(prefix="packs-at-urls-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    for name, side in sides.items():  # each side's package is the one its PYTHONPATH names, not the editable one
        found = subprocess.run([sys.executable, "-c", "import pytest_compilecache; print(pytest_compilecache.__file__)"],
                               cwd=work, env={**os.environ, **side["env"]}, capture_output=True, text=True).stdout
        assert found.startswith(side["env"]["PYTHONPATH"]), (name, found)
        print(f"{name}: {found.strip()} ({'packs under URL/packs/' if side['packs'] else 'one object at the URL'})")
    bundle = build(work)
    try:
        with s3_server() as (endpoint, _), Counted(int(endpoint.rsplit(":", 1)[1])) as proxy:
            s3 = S3(endpoint)
            store = Store("s3", s3.fs, s3.bucket, {**s3.env, "AWS_ENDPOINT_URL": proxy.url}, proxy)
            one_test_and_suite(sides, store, work / "suite", bundle, rounds)
            update(sides, store, work / "suite", bundle, rounds)
            print(f"\n{NEW} shards updating at once, each a new function, fresh runners:")
            for side in sides.values():
                shards(side, store, work / "suite", bundle, max(1, rounds // 2))
        if shutil.which("azurite-blob"):
            import adlfs

            with azurite_server() as port, Counted(port) as proxy:
                fs = adlfs.AzureBlobFileSystem(connection_string=azurite_connection(port), skip_instance_cache=True)
                fs.mkdir("bench")
                store = Store("az", fs, "bench", {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection(proxy.port)},
                              proxy)
                for side in (s for s in sides.values() if s["packs"]):
                    shards(side, store, work / "suite", bundle, max(1, rounds // 2))
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
