"""Measure cold_cache's own cost: setup plus teardown around a test that compiles nothing.

Runs one pytest session with N bare tests and N cold_cache tests interleaved, times the setup and
teardown phases of each test with a hook wrapper, and prints the medians side by side.

    python benchmarks/fixture_overhead.py [N]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest

N = int(sys.argv[1]) if len(sys.argv) > 1 else 300


class Timer:
    """Collects setup + teardown seconds per test, keyed by whether the test used cold_cache."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {"bare": [], "cold_cache": []}
        self._current: dict[str, float] = {}

    def _timed(self, item: pytest.Item) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self._current[item.nodeid] = self._current.get(item.nodeid, 0.0) + time.perf_counter() - start

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        return (yield from self._timed(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        result = yield from self._timed(item)
        kind = "cold_cache" if "cold_cache" in item.fixturenames else "bare"
        self.times[kind].append(self._current.pop(item.nodeid))
        return result


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "test_overhead.py"
        body = "\n".join(
            f"def test_bare_{i}():\n    pass\n\ndef test_cold_{i}(cold_cache):\n    pass\n" for i in range(N)
        )
        path.write_text("import torch\n\n" + textwrap.dedent(body))
        timer = Timer()
        code = pytest.main([str(path), "-q", "-p", "no:cacheprovider", "-p", "no:randomly"], plugins=[timer])
        assert code == 0, code
    bare = statistics.median(timer.times["bare"]) * 1e3
    cold = statistics.median(timer.times["cold_cache"][1:]) * 1e3
    first = timer.times["cold_cache"][0] * 1e3
    print(f"tests per kind: {N}")
    print(f"median setup+teardown, bare test:       {bare:.3f} ms")
    print(f"median setup+teardown, cold_cache test: {cold:.3f} ms")
    print(f"cold_cache cost per test (difference):  {cold - bare:.3f} ms")
    print(f"first cold_cache test (imports torch's compiler stack once): {first:.0f} ms")


if __name__ == "__main__":
    main()
