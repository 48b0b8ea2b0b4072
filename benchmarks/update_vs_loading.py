"""CPU, issue 45 item 5: what an updating run adds to a loading run as the bundle grows.

On the suites ``one_test_vs_kept.py --keep=DIR`` built (``DIR/SIZE``: SIZE ``warm_cache`` tests, each compiling
a function of its own, and their bundle), one function is edited, and its test is run with ``-k`` in ROUNDS
alternating pairs, each from a fresh copy of the bundle: once with ``--compile-cache-update`` (the edit's new
entries merged in and the bundle written again), once without (a loading run: the same miss, compile and
explanation, nothing written). The warmup hook is left empty in both, so that neither pays for the suite's own
warmup (which compiles every function again). Printed per size: pytest's wall seconds, the peak memory of the
pytest process, the save's seconds as the summary states them, and the bundle's size before and after.

    python benchmarks/update_vs_loading.py --keep=DIR [--bundle=NAME] [--url=s3] [ROUNDS] SIZE [SIZE ...]

``--bundle=NAME``: the bundle's file name in ``DIR/SIZE`` (``suite.bundle`` by default), to measure another
copy of it (one written by an earlier version, say).

``--url=s3``: the bundle lies at an ``s3://`` URL (moto's S3 server on loopback), put there afresh before
each run, and each run starts as on a fresh CI runner, with no copy of it on the machine: the loading run
downloads the manifest and its entry, the updating run the whole bundle, and uploads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

from probe.installed import as_installed
from probe.runner import pytest_run, spread
from small_tests_vs_kept import QUIET

PEAK = Path(__file__).parent / "probe"
EMPTY_WARMUP = "def pytest_compilecache_warmup(cache):\n    pass\n"


class S3:
    """moto's S3 server on loopback, a bucket in it, and the environment that reaches it."""

    def __init__(self, endpoint: str) -> None:
        import s3fs

        self.env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
                    "AWS_ENDPOINT_URL": endpoint}
        self.fs = s3fs.S3FileSystem(key="bench", secret="bench", endpoint_url=endpoint, skip_instance_cache=True)
        self.bucket = f"bench-{uuid.uuid4().hex[:12]}"
        self.fs.mkdir(self.bucket)

    def put(self, bundle: Path) -> str:
        """Put ``bundle`` at the URL the runs use, replacing what was there; the URL."""
        self.fs.put_file(str(bundle), f"{self.bucket}/suite.bundle")
        return f"s3://{self.bucket}/suite.bundle"


@contextlib.contextmanager
def s3_server() -> Iterator[S3]:
    """moto's server on a free loopback port, stopped afterwards."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.1)
        yield S3(f"http://127.0.0.1:{port}")
    finally:
        server.terminate()
        server.wait(timeout=20)


def measure(built: Path, size: int, rounds: int, name: str = "suite.bundle", s3: S3 | None = None) -> None:
    """Alternate updating and loading runs of one edited test on a copy of the suite built in ``built``
    (at an ``s3://`` URL in ``s3``, each run with no copy of it on the machine, where given)."""
    source = built / name
    if not source.exists():
        raise SystemExit(f"{built}: no suite built there (run one_test_vs_kept.py --keep first)")
    work = Path(tempfile.mkdtemp(prefix=f"update-{size}-")).resolve()
    try:
        suite = work / "suite"
        shutil.copytree(built / "plugin", suite, ignore=shutil.ignore_patterns("__pycache__"))
        (suite / "conftest.py").write_text(EMPTY_WARMUP)
        small = suite / "small.py"
        edited = small.read_text().replace(f"def f_{size // 2}(x):\n    y = torch.sin(x * ",
                                           f"def f_{size // 2}(x):\n    y = torch.sin(x * 2 * ")
        assert edited != small.read_text(), "the edit applies"
        small.write_text(edited)
        peaks, bundle, report = work / "peaks", work / "suite.bundle", work / "report.json"
        peaks.mkdir()
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(PEAK), os.environ.get("PYTHONPATH", "")])),
               "PEAK_OUT": str(peaks), "XDG_CACHE_HOME": str(work / "xdg"), **(s3.env if s3 else {})}
        copies = work / "xdg" / "pytest-compilecache" / "bundle-copies"
        one = f"test_warm_{size // 2:03d}"
        seen: dict[str, dict[str, list[float]]] = {"update": {}, "loading": {}}
        after = 0
        for round_ in range(rounds):
            for side in (("update", "loading") if round_ % 2 == 0 else ("loading", "update")):
                shutil.copyfile(source, bundle)
                shutil.rmtree(copies, ignore_errors=True)
                where = s3.put(bundle) if s3 else str(bundle)
                extra = ["--compile-cache-update"] if side == "update" else []
                ran = pytest_run([*QUIET, f"--compile-cache-bundle={where}", f"--compile-cache-report={report}",
                                  "-p", "peak", "-k", one, *extra], suite, env)
                peak = max(int(p.read_text()) / 1024 for p in peaks.glob("peak-*"))
                for p in peaks.glob("peak-*"):
                    p.unlink()
                saved = json.loads(report.read_text())["bundle"].get("saved") or {}
                figures = seen[side]
                figures.setdefault("seconds", []).append(ran.seconds)
                figures.setdefault("peak", []).append(peak)
                if side == "update":
                    figures.setdefault("save", []).append(float(saved.get("seconds") or 0.0))
                    after = s3.fs.size(f"{s3.bucket}/suite.bundle") if s3 else bundle.stat().st_size
        up, load = seen["update"], seen["loading"]
        print(f"\n{size} tests{' (the bundle at an s3:// URL, no copy kept)' if s3 else ''}, bundle {source.stat().st_size / 1e6:.2f} MB -> {after / 1e6:.2f} MB after the update; "
              f"{rounds} pairs (-k {one}, the function edited, an empty warmup hook):")
        print(f"  updating run: {spread(up['seconds'])} s, peak {spread(up['peak'], 0)} MB, "
              f"its save {spread(up['save'])} s")
        print(f"  loading run:  {spread(load['seconds'])} s, peak {spread(load['peak'], 0)} MB")
        print(f"  update - loading, each pair: {spread([u - v for u, v in zip(up['seconds'], load['seconds'])])} s, "
              f"{spread([u - v for u, v in zip(up['peak'], load['peak'])], 0)} MB", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    keep = next((Path(a.split("=", 1)[1]).resolve() for a in sys.argv[1:] if a.startswith("--keep=")), None)
    name = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--bundle=")), "suite.bundle")
    url = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--url=")), "")
    args = [a for a in sys.argv[1:] if not a.startswith(("--keep=", "--bundle=", "--url="))]
    if url not in ("", "s3"):
        raise SystemExit(f"--url={url}: only s3 is measured here")
    if keep is None or not args:
        raise SystemExit(__doc__)
    rounds = int(args[0]) if len(args) > 1 else 5
    print(f"plugin byte-compiled as pip installs it: {as_installed()}", flush=True)
    with s3_server() if url else contextlib.nullcontext() as s3:
        for size in [int(a) for a in args[1:]] or [int(args[0])]:
            measure(keep / str(size), size, rounds, name, s3)


if __name__ == "__main__":
    main()
