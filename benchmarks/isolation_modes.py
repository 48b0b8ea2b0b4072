"""Isolation modes against a plain run, on one generated suite of compiling tests (issue 8, item 17).

The suite: N plain tests (no fixtures), each compiling its own small model, spread over 4 files,
run with ``-n 2``. Each repeat measures, side by side, the wall time of:

- ``plain``: no plugin option; torch's default directory in a private TMPDIR kept between the two
  runs (what a CI cache of ``/tmp/torchinductor_<user>`` gives), first run then second run;
- ``worker``: ``--compile-cache-isolate-mode=worker`` with a new ``compile_cache_home``, first then second run;
- ``test``: ``--compile-cache-isolate-mode=test`` (every test gets an empty cache), one run.

    python benchmarks/isolation_modes.py [REPEATS] [N]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from probe.runner import pytest_run

TEST_FILE = '''
import torch

def _model(i):
    torch.manual_seed(i)
    return torch.nn.Sequential(torch.nn.Linear(32 + i, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))

{tests}
'''

ONE_TEST = '''
def test_{i}():
    with torch.no_grad():
        torch.compile(_model({i}))(torch.randn(4, 32 + {i}))
'''


def make_suite(root: Path, n: int) -> None:
    for f in range(4):
        tests = "".join(ONE_TEST.format(i=i) for i in range(f, n, 4))
        (root / f"test_suite_{f}.py").write_text(TEST_FILE.format(tests=tests))


def run(root: Path, tmp: Path, *args: str) -> float:
    return pytest_run(["-q", "-n", "2", "-p", "no:randomly", "-p", "no:cacheprovider", *args], root,
                      {"TMPDIR": str(tmp)}, unset=("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTEST_ADDOPTS")).seconds


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    times: dict[str, list[float]] = {}
    for r in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            root = Path(d) / "suite"
            root.mkdir()
            make_suite(root, n)
            for mode in ("plain", "worker", "test"):
                tmp = Path(d) / f"tmp-{mode}"
                tmp.mkdir()
                home = Path(d) / f"home-{mode}"
                (root / "pytest.ini").write_text(f"[pytest]\ncompile_cache_home = {home}\n")
                args = {"plain": [], "worker": ["--compile-cache-isolate-mode=worker"],
                        "test": ["--compile-cache-isolate-mode=test"]}[mode]
                runs = ("first", "second") if mode != "test" else ("first",)
                for which in runs:
                    seconds = run(root, tmp, *args)
                    times.setdefault(f"{mode} {which}", []).append(seconds)
                    print(f"repeat {r + 1}: {mode:6} {which:6} {seconds:6.1f} s", flush=True)
    print(f"\n{n} compiling tests, -n 2, medians of {repeats}:")
    for key, values in times.items():
        print(f"  {key:14} {statistics.median(values):6.1f} s   ({', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
