"""GPU: whether a ``cpp_wrapper`` graph's C++ source names its cache folder (so its module cannot be carried to
another folder), and what building it again costs: one compile into a fresh folder, then in new processes the
same compile from that kept folder and from a copy of it at another path.

    python benchmarks/probe/cpp_wrapper_folder.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CODE = """
import time, torch
f = torch.compile(lambda x: torch.relu(x) * 2 + 1, options={"cpp_wrapper": True})
x = torch.randn(1024, device="cuda")
start = time.perf_counter()
f(x)
torch.cuda.synchronize()
print(f"compile and first call {time.perf_counter() - start:.2f} s")
"""


def run(folder: Path) -> float:
    """A new process compiling CODE with ``folder`` as torch's cache folder; its wall seconds."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CODE], env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder)},
                          capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - start
    print(f"  {folder.name}: {took:.2f} s; {done.stdout.strip()}", done.stderr[-2000:] if done.returncode else "")
    return took


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="cpp-wrapper-"))
    kept = work / "kept"
    run(kept)
    for source in sorted(kept.glob("??/*.cpp")):
        text = source.read_text(errors="replace")
        named = [line.strip()[:160] for line in text.splitlines() if str(kept) in line]
        print(f"{source.relative_to(kept)}: {len(text)} bytes; names its folder on {len(named)} lines",
              *named[:3], sep="\n    ")
    moved = work / "moved"
    for round_ in range(3):
        shutil.rmtree(moved, ignore_errors=True)
        shutil.copytree(kept, moved, symlinks=True)
        print(f"round {round_}:")
        run(kept)
        run(moved)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
