"""Network faults against real servers on loopback (moto's S3 server, Azurite, http.server), measured:
how long each operation takes to give up, what is left at the URL, and whether the next writer saves.

    python benchmarks/network_faults.py [--timeout 30]

Uses the fault listener and proxy of tests/servers.py; prints a markdown table for RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.server
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from servers import Blackhole, FaultProxy, azurite_connection, azurite_server, s3_server  # noqa: E402

from pytest_compilecache.bundle.format import BundleError, Entry, read_manifest  # noqa: E402
from pytest_compilecache.storage.packs import PackStore  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "h200-torch2.11.bundle"
KEYS = {"key": "testing", "secret": "testing"}


def entry(tag: str) -> Entry:
    with read_manifest(DATA) as bundle:
        bundle.read_all()
        first = bundle.entries[0]
    return dataclasses.replace(first, env={**first.env, "cache_key_tag": tag})


def timed(action: Callable[[], Any]) -> tuple[float, str]:
    started = time.monotonic()
    try:
        action()
        outcome = "ok"
    except BundleError as exc:
        outcome = str(exc).split(": ", 1)[1][:90]
    return time.monotonic() - started, outcome


def options(kind: str, port: int) -> dict[str, Any]:
    if kind == "s3":
        return {**KEYS, "endpoint_url": f"http://127.0.0.1:{port}", "skip_instance_cache": True}
    return {"connection_string": azurite_connection(port), "skip_instance_cache": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=float, default=30.0, help="the network timeout (default 30, the plugin's)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    rows: list[str] = []
    # A listener that never answers.
    for kind in ("http", "s3", "az"):
        with Blackhole() as hole:
            url = {"http": f"http://127.0.0.1:{hole.port}/b.bundle", "s3": "s3://b/b.bundle",
                   "az": "az://c/b.bundle"}[kind]
            store = PackStore(url, work / uuid.uuid4().hex, 60, {} if kind == "http" else options(kind, hole.port),
                             network_timeout=args.timeout)
            took, said = timed(lambda: store.read({"device": "cpu"}))
            again, _ = timed(store.describe)
            rows.append(f"| never answers | {kind} | read: gave up after {took:.1f} s; the next operation "
                        f"{again:.2f} s | nothing | `{said}` |")
    # Uploads cut after 64 kB.
    with s3_server() as (s3_url, _), azurite_server() as az_port:
        s3_port = int(s3_url.rsplit(":", 1)[1])
        for kind, port in (("s3", s3_port), ("az", az_port)):
            root = f"bundles-{uuid.uuid4().hex[:8]}"
            if kind == "s3":
                import s3fs
                s3fs.S3FileSystem(**KEYS, endpoint_url=s3_url, skip_instance_cache=True).mkdir(root)
            else:
                import adlfs
                adlfs.AzureBlobFileSystem(connection_string=azurite_connection(port), skip_instance_cache=True).mkdir(root)
            url = f"{kind}://{root}/b.bundle"
            direct = PackStore(url, work / uuid.uuid4().hex, 60, options(kind, port))
            with FaultProxy(port, cut_uploads_after=64 * 1024) as cut:
                through = PackStore(url, work / uuid.uuid4().hex, 60, options(kind, cut.port),
                                   network_timeout=args.timeout)
                took_new, said = timed(lambda: through.add([entry("a")]))
                left_new = "no pack" if direct.read() is None else "A PACK"
                direct.add([entry("a")]).bundle.close()
                before = direct.client.listing("packs")
                took_old, _ = timed(lambda: through.add([entry("b")]))
                same = "the packs as they were" if direct.client.listing("packs") == before else "CHANGED"
                cuts = cut.cuts
            t_next, next_outcome = timed(lambda: direct.add([entry("b")]).bundle.close())
            rows.append(f"| upload cut after 64 kB ({cuts} cuts) | {kind} | gave up after {took_new:.1f} s "
                        f"(no object before), {took_old:.1f} s (an object before) | {left_new}; {same}; "
                        f"nothing else | next writer: {next_outcome} in {t_next:.1f} s |")
    # Slow, stalled and lying HTTP servers.
    folder = work / "served"
    folder.mkdir()
    shutil.copy(DATA, folder / "b.bundle")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = int(server.server_address[1])
    env = read_manifest(DATA).entries[0].env
    for label, proxy in (("trickle at 50 kB/s", FaultProxy(port, rate=50_000)),
                         ("stalls after 100 kB, once", FaultProxy(port, stall_after=100_000, stalls=1))):
        with proxy:
            store = PackStore(f"{proxy.url}/b.bundle", work / uuid.uuid4().hex, 60, {}, network_timeout=args.timeout)
            took, said = timed(lambda: store.read(env))
            rows.append(f"| {label} | http | {took:.1f} s for {DATA.stat().st_size // 1000} kB | nothing kept "
                        f"half-read | {said} |")
    server.shutdown()
    print(f"network timeout {args.timeout:g} s\n")
    print("| fault | store | time | left behind | outcome |\n|---|---|---|---|---|")
    print("\n".join(rows))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
