"""CPU, issue 11: what recording key details (for explained misses) costs, on the examples suite.

Side by side, REPEATS times, alternating: the README's main job (``examples/``, ``-n 2``, less the one test
that asserts an explanation, a cold run
that builds the bundle, then a warm run that loads it) with recording on (the plugin as shipped)
and off (a benchmark-only conftest marks the key wrappers as installed, so torch's key functions
are never wrapped). Reported: wall time of each run, the save time and the bundle's size from the
summary, and the size of the key index inside the bundle.

    python benchmarks/key_details.py [REPEATS]
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from probe.runner import pytest_run

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"

OFF = '''
from pytest_compilecache._torchapi import patches
# benchmark only: never wrap torch's key functions (the register installs the rest)
patches.PATCHES = tuple(p for p in patches.PATCHES if not p.wrapper.startswith("keys:"))
'''


def run(project: Path, bundle: Path, env: dict[str, str]) -> tuple[float, str]:
    """A run of the examples with ``env`` as its whole environment."""
    ran = pytest_run(["-q", "-n", "2", "-p", "no:randomly", "-k", "not explains", f"--compile-cache-bundle={bundle}"],
                     project, env, timeout=900, unset=[name for name in os.environ if name not in env])
    return ran.seconds, ran.output


def index_bytes(bundle: Path) -> int:
    from pytest_compilecache.bundle.format import read_manifest

    with read_manifest(bundle) as b:
        return sum((e.index_section or {}).get("size", 0) for e in b.entries)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    rows: dict[str, list[tuple[float, float, float, int, int]]] = {"on": [], "off": []}
    work = Path(tempfile.mkdtemp(prefix="key-details-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TORCHINDUCTOR_", "TRITON_"))}
    for i in range(repeats):
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            project = work / f"{mode}-{i}"
            shutil.copytree(EXAMPLES, project)
            if mode == "off":
                (project / "conftest.py").write_text((project / "conftest.py").read_text() + OFF)
            bundle = project / "examples.bundle"
            cold, out = run(project, bundle, env)
            saved = re.search(r"bundle saved: .*\(([0-9.]+) MB in ([0-9.]+) s\)", out)
            assert saved, out[-2000:]
            warm, _ = run(project, bundle, env)
            rows[mode].append((cold, warm, float(saved.group(2)), bundle.stat().st_size, index_bytes(bundle)))
            print(f"run {i} {mode:3}: cold {cold:5.1f} s, warm {warm:5.1f} s, save {saved.group(2)} s, "
                  f"bundle {bundle.stat().st_size:,d} bytes (key index {index_bytes(bundle):,d})", flush=True)
            shutil.rmtree(project)
    print(f"\nmedians over {repeats} runs (examples, -n 2)")
    print("recording | cold s | warm s | save s | bundle bytes | key index bytes")
    for mode, values in rows.items():
        med = [statistics.median(v[j] for v in values) for j in range(5)]
        print(f"{mode:9} | {med[0]:6.1f} | {med[1]:6.1f} | {med[2]:6.2f} | {med[3]:12,.0f} | {med[4]:15,.0f}")
    on = [statistics.median(v[j] for v in rows["on"]) for j in range(5)]
    off = [statistics.median(v[j] for v in rows["off"]) for j in range(5)]
    print(f"on/off    | {on[0] / off[0]:6.2f} | {on[1] / off[1]:6.2f} | {on[2] / max(off[2], 1e-9):6.2f} | "
          f"{on[3] / off[3]:12.3f} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
