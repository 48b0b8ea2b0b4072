"""Peak disk use of the plugin's folders for N ``warm_cache`` tests (issue 8, item 5).

Builds a bundle once (a warmup compiling a transformer block and an MLP), then runs N
``warm_cache`` tests against it (each compiles the block, as a test would) while a thread samples
the size of ``--basetemp`` every 20 ms. Prints the bundle's loaded size, the peak under basetemp, and what keeping every test's copy
until the session ends (the design before this change) would have used: N copies.

    python benchmarks/disk_use.py [N]
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from probe.runner import pytest_run

CONFTEST = '''
import pytest
import torch

def block():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))

@pytest.hookimpl(optionalhook=True)
def pytest_compilecache_warmup(cache):
    torch.compile(block())(torch.randn(8, 64))
    torch.compile(lambda x: x.softmax(-1) * 2)(torch.randn(8, 64))
'''

TEST = '''
import os
import pytest
import torch
from conftest import block

@pytest.mark.parametrize("i", range({n}))
def test_warm(warm_cache, i):
    torch.compile(block())(torch.randn(8, 64))
    if i == 0:
        warm_cache.link_whole_bundle()
    size = sum(p.stat().st_size for p in warm_cache.path.rglob("*") if p.is_file())
    assert size > 0
    if i == 0:
        with open("copy-size.txt", "w") as f:
            f.write(str(size))
'''


def tree_size(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "conftest.py").write_text(CONFTEST)
        (project / "test_warm.py").write_text(TEST.format(n=n))
        bundle = project / "x.bundle"
        base = ["-q", "-p", "no:randomly", f"--compile-cache-bundle={bundle}"]
        pytest_run([*base, "-k", "warm[0]"], project)
        basetemp = project / "basetemp"
        peak = 0
        samples = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak, samples
            while not stop.is_set():
                peak = max(peak, tree_size(basetemp) if basetemp.exists() else 0)
                samples += 1
                time.sleep(0.02)

        thread = threading.Thread(target=sample)
        thread.start()
        ran = pytest_run([*base, f"--basetemp={basetemp}"], project, must_pass=False)
        stop.set()
        thread.join()
        assert ran.returncode == 0
        left = tree_size(basetemp)
        loaded = int((project / "copy-size.txt").read_text())
        print(f"{n} warm_cache tests in {ran.seconds:.1f} s; bundle {bundle.stat().st_size / 1e6:.2f} MB")
        print(f"one copy of the loaded bundle: {loaded / 1e6:.2f} MB")
        print(f"peak under basetemp during the run: {peak / 1e6:.2f} MB ({samples} samples)")
        print(f"left under basetemp after the run: {left / 1e6:.2f} MB")
        print(f"keeping every test's copy until the end would need: {(n + 2) * loaded / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
