"""CPU, issue 45: what collecting SIZE tests costs with the plugin against a kept cache folder, as SIZE grows.

The one-test benchmark (``one_test_vs_kept.py``) compares a suite whose tests request ``warm_cache`` with the
plugin loaded against the same tests with no fixture and ``-p no:compilecache``; both collect every test,
then ``-k`` deselects all but one. This measures that collection alone (``--co -k ONE``: no test runs, no
torch import), in three sides, the order alternating each round:

- **kept**: no fixture, ``-p no:compilecache`` (the kept folder's side);
- **fixture**: ``-p no:compilecache`` and a conftest fixture named ``warm_cache`` that does nothing (what
  pytest's fixture machinery costs for a test that requests one fixture);
- **plugin**: the plugin loaded and its ``warm_cache`` fixture (the plugin's side).

    python benchmarks/collection_cost.py [ROUNDS] [SIZE ...]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from probe.installed import as_installed
from probe.runner import pytest_run, spread
from small_tests_vs_kept import QUIET

SIDES = ("kept", "fixture", "plugin")


def make(folder: Path, size: int, side: str) -> Path:
    """A folder of ``size`` trivial tests, requesting ``warm_cache`` but on the kept side."""
    folder.mkdir(parents=True)
    argument = "" if side == "kept" else "warm_cache"
    (folder / "test_many.py").write_text("".join(f"def test_warm_{i:04d}({argument}):\n    pass\n\n"
                                                 for i in range(size)))
    if side == "fixture":
        (folder / "conftest.py").write_text("import pytest\n\n@pytest.fixture\ndef warm_cache():\n    return None\n")
    return folder


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    sizes = [int(a) for a in sys.argv[2:]] or [200, 1000, 3000]
    print(f"plugin byte-compiled as pip installs it: {as_installed()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="collection-")).resolve()
    try:
        for size in sizes:
            folders = {side: make(work / f"{side}-{size}", size, side) for side in SIDES}
            one = f"test_warm_{size // 2:04d}"
            times: dict[str, list[float]] = {side: [] for side in SIDES}
            for round_ in range(rounds):
                order = SIDES[round_ % 3:] + SIDES[:round_ % 3]
                for side in order:
                    own = [] if side == "plugin" else ["-p", "no:compilecache"]
                    times[side].append(pytest_run([*QUIET, *own, "--co", "-k", one], folders[side]).seconds)
            kept = times["kept"]
            print(f"{size} tests, --co -k {one}, {rounds} rounds: " + ", ".join(
                f"{side} {spread(times[side])} s (each round - kept: "
                f"{spread([t - k for t, k in zip(times[side], kept)], 3)} s)" for side in SIDES), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
