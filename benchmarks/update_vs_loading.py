"""CPU, issue 45 item 5: what an updating run adds to a loading run as the bundle grows.

On the suites ``one_test_vs_kept.py --keep=DIR`` built (``DIR/SIZE``: SIZE ``warm_cache`` tests, each compiling
a function of its own, and their bundle), one function is edited, and its test is run with ``-k`` in ROUNDS
alternating pairs, each from a fresh copy of the bundle: once with ``--compile-cache-update`` (the edit's new
entries merged in and the bundle written again), once without (a loading run: the same miss, compile and
explanation, nothing written). The warmup hook is left empty in both, so that neither pays for the suite's own
warmup (which compiles every function again). Printed per size: pytest's wall seconds, the peak memory of the
pytest process, the save's seconds as the summary states them, and the bundle's size before and after.

    python benchmarks/update_vs_loading.py --keep=DIR [--bundle=NAME] [ROUNDS] SIZE [SIZE ...]

``--bundle=NAME``: the bundle's file name in ``DIR/SIZE`` (``suite.bundle`` by default), to measure another
copy of it (one written by an earlier version, say).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from probe.installed import as_installed
from probe.runner import pytest_run, spread
from small_tests_vs_kept import QUIET

PEAK = Path(__file__).parent / "probe"
EMPTY_WARMUP = "def pytest_compilecache_warmup(cache):\n    pass\n"


def measure(built: Path, size: int, rounds: int, name: str = "suite.bundle") -> None:
    """Alternate updating and loading runs of one edited test on a copy of the suite built in ``built``."""
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
               "PEAK_OUT": str(peaks), "XDG_CACHE_HOME": str(work / "xdg")}
        one = f"test_warm_{size // 2:03d}"
        seen: dict[str, dict[str, list[float]]] = {"update": {}, "loading": {}}
        after = 0
        for round_ in range(rounds):
            for side in (("update", "loading") if round_ % 2 == 0 else ("loading", "update")):
                shutil.copyfile(source, bundle)
                extra = ["--compile-cache-update"] if side == "update" else []
                ran = pytest_run([*QUIET, f"--compile-cache-bundle={bundle}", f"--compile-cache-report={report}",
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
                    after = bundle.stat().st_size
        up, load = seen["update"], seen["loading"]
        print(f"\n{size} tests, bundle {source.stat().st_size / 1e6:.2f} MB -> {after / 1e6:.2f} MB after the update; "
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
    args = [a for a in sys.argv[1:] if not a.startswith(("--keep=", "--bundle="))]
    if keep is None or not args:
        raise SystemExit(__doc__)
    rounds = int(args[0]) if len(args) > 1 else 5
    print(f"plugin byte-compiled as pip installs it: {as_installed()}", flush=True)
    for size in [int(a) for a in args[1:]] or [int(args[0])]:
        measure(keep / str(size), size, rounds, name)


if __name__ == "__main__":
    main()
