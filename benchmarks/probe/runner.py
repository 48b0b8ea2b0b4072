"""The benchmarks' one way to run pytest as a user would and time it, and to state a spread."""

from __future__ import annotations

import dataclasses
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Ran:
    """One pytest process: its wall seconds, processor seconds (user + system, workers included) and output."""

    seconds: float
    cpu: float
    output: str
    returncode: int


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def pytest_run(args: Sequence[str], cwd: Path | str, env: Mapping[str, str] | None = None, timeout: float = 1800,
               must_pass: bool = True, prefix: Sequence[str] = (), unset: Sequence[str] = ()) -> Ran:
    """``python -m pytest ARGS`` in ``cwd`` with ``env`` over this process's environment less the
    variables ``unset`` (``env`` may set one of them again; ``prefix`` goes before ``-m pytest``:
    ``-m cProfile -o FILE``, say). A failed run prints the end of its output and, with ``must_pass``,
    ends the benchmark."""
    environment = {name: value for name, value in os.environ.items() if name not in unset}
    environment.update(env or {})
    cpu_before = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *prefix, "-m", "pytest", *args], cwd=cwd, capture_output=True, text=True,
                          env=environment, timeout=timeout)
    took = time.perf_counter() - start
    ran = Ran(took, _children_cpu() - cpu_before, done.stdout + done.stderr, done.returncode)
    if done.returncode != 0:
        print(f"FAILED run ({took:.1f} s) in {cwd}: {list(args)}", done.stdout[-6000:], done.stderr[-3000:],
              sep="\n", flush=True)
        if must_pass:
            raise SystemExit(f"failed in {cwd}: {list(args)}")
    return ran


def spread(values: Sequence[float], digits: int = 2, unit: str = "", width: int = 0) -> str:
    """``median (min-max)`` with ``digits`` decimals, ``unit`` after the median (``" s"``, ``"x"``) and the
    median right-aligned in ``width`` characters; ``-`` for no values."""
    if not values:
        return "-"
    return (f"{statistics.median(values):>{width}.{digits}f}{unit} "
            f"({min(values):.{digits}f}-{max(values):.{digits}f})")
