"""Measure what --compile-cache-expect costs per test: the whole protocol of a cold_cache test, on and off.

One folder with N ``cold_cache`` tests; the first compiles a small function (so torch's compiler and its
counters are loaded, as in any suite that compiles), the others compile nothing, so that the figure is
the plugin's own work. An updating run writes the expectations file first (not timed); then sessions with
expectations off and on (comparing every test with its record) alternate, each in a fresh process, and
each prints the median of its tests' setup + call + teardown time (the first test left out).

    python benchmarks/expect_overhead.py [N] [RUNS]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest



class Timer:
    """The wall time of each test's whole run protocol."""

    def __init__(self) -> None:
        self.times: list[float] = []

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        start = time.perf_counter()
        result = yield
        self.times.append(time.perf_counter() - start)
        return result


def child(folder: str, *args: str) -> None:
    from pytest_compilecache.expect.hooks import Recorder

    timer = Timer()
    measures: list[float] = []
    measure = Recorder._measure

    def timed(self: Recorder, item: pytest.Item, report: pytest.TestReport) -> None:
        start = time.perf_counter()
        measure(self, item, report)
        measures.append(time.perf_counter() - start)

    Recorder._measure = timed  # type: ignore[method-assign]
    code = pytest.main([folder, "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *args], plugins=[timer])
    assert code == 0, code
    print(f"MEDIAN {statistics.median(timer.times[1:]) * 1e3:.3f}")
    if measures:
        print(f"MEASURE {statistics.median(measures[1:]) * 1e3:.3f}")


def run(folder: Path, *args: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, __file__, "--child", str(folder), *args], capture_output=True, text=True,
                         timeout=900)
    line = next((x for x in out.stdout.splitlines() if x.startswith("MEDIAN ")), None)
    assert line is not None, out.stdout[-3000:] + out.stderr[-3000:]
    measured = next((float(x.split()[1]) for x in out.stdout.splitlines() if x.startswith("MEASURE ")), 0.0)
    return float(line.split()[1]), measured


def main(n: int = 200, runs: int = 3) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tests = ["import torch\n\n\ndef test_0(cold_cache):\n    torch.compile(lambda x: x.sin() + 1)(torch.randn(4))\n"]
        tests += [f"\ndef test_{i}(cold_cache):\n    pass\n" for i in range(1, n)]
        (folder / "test_many.py").write_text("".join(tests))
        (folder / "pytest.ini").write_text("[pytest]\n")
        expect = f"--compile-cache-expect={folder / 'exp.json'}"
        run(folder, expect, "--compile-cache-expect-update")
        off, on, own = [], [], []
        for _ in range(runs):
            off.append(run(folder)[0])
            whole, measured = run(folder, expect)
            on.append(whole)
            own.append(measured)
    print(f"{n} cold_cache tests per session, medians per test (ms): setup + call + teardown off and on, and the "
          "recorder's own work per test (measure and compare)")
    for i, (a, b, c) in enumerate(zip(off, on, own), 1):
        print(f"  run {i}: off {a:.3f}, on {b:.3f}, difference {b - a:.3f}; recorder {c:.3f}")
    print(f"median over runs: off {statistics.median(off):.3f} ms, on {statistics.median(on):.3f} ms, "
          f"recorder {statistics.median(own):.3f} ms per test")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(*sys.argv[2:])
    else:
        main(*(int(a) for a in sys.argv[1:3]))
