"""CPU, issue 9: is a run warmed from a bundle as fast as a warm local cache? Side by side, REPEATS times.

1. **Examples, -n 2**: the README's main job (``examples/``): a cold run that builds the bundle, then a
   warm run that loads it. Wall time of each, and the summary's compile time against the tests'
   own call durations (what ``--durations`` shows), to show they agree.
2. **Plain tests, -n 2**: the same models compiled by tests that use no fixture and no warmup hook,
   as most suites are written. With the plugin: a run that builds the bundle, then the measured run
   loading it. Without it (``-p no:compilecache``): a run that fills a kept
   ``TORCHINDUCTOR_CACHE_DIR``, then the measured run on the kept folder (what CI caches do).
3. **One warm_cache test**: the transformer block compiled in a ``warm_cache`` test (from the
   examples' bundle), then, in the same test after ``reset_in_memory()``, the same compile from
   the now-warm local folder. A throwaway compile of the same model in an earlier ``cold_cache``
   test pays what a process pays once (imports, Dynamo's first trace of attention), so that neither
   measured compile pays it.

Also the size of the examples' bundle with and without its C++ binaries.

    python benchmarks/warm_vs_kept.py [REPEATS]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from probe.runner import pytest_run

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"

DURATIONS = '''
"""Records each test's call duration on the controller, as --durations reports it."""
import json, os

_calls = {}

def pytest_runtest_logreport(report):
    if report.when == "call":
        _calls[report.nodeid] = report.duration

def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):
        with open(os.environ["CALLS_LOG"], "w") as f:
            json.dump(_calls, f)
'''

PLAIN_TESTS = '''
import pytest
import torch
from models import run_dynamic, run_inference, run_mlp_no_grad, run_training_step

def test_inference():
    run_inference()

def test_training():
    run_training_step()

def test_mlp():
    run_mlp_no_grad()

def test_dynamic():
    run_dynamic(sizes=(8, 16, 24, 40))
'''

SIDE_BY_SIDE = '''
import time
import torch
from models import run_inference, tokens, transformer_block

def test_00_process_start_up(cold_cache):
    run_inference()

def test_warm_bundle_vs_warm_local(warm_cache):
    model = transformer_block().eval()
    with torch.no_grad():
        start = time.perf_counter()
        torch.compile(model)(tokens())
        from_bundle = time.perf_counter() - start
        warm_cache.reset_in_memory()
        start = time.perf_counter()
        torch.compile(model)(tokens())
        local = time.perf_counter() - start
    print(f"\\nBUNDLE_VS_LOCAL {from_bundle:.3f} {local:.3f}")
'''


def run(cwd: Path, args: list[str], env: dict[str, str]) -> tuple[float, str]:
    """A run with ``env`` as its whole environment: its wall seconds and output."""
    ran = pytest_run(["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "durations_log",
                      "-W", "ignore::DeprecationWarning", *args], cwd, env, timeout=1200,
                     unset=[name for name in os.environ if name not in env])
    return ran.seconds, ran.output


def summary_compile_seconds(out: str) -> float:
    line = next(ln for ln in out.splitlines() if ln.startswith("compile time in tests:"))
    return float(line.split(":")[1].split()[0])


def fresh(base: Path, name: str, files: dict[str, str]) -> Path:
    folder = base / name
    folder.mkdir()
    for source in ("models.py",):
        shutil.copy(EXAMPLES / source, folder / source)
    for file, text in files.items():
        (folder / file).write_text(text)
    return folder


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    rows: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        rows.setdefault(key, []).append(value)

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "durations_log.py").write_text(DURATIONS)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR", "TRITON_CACHE"))}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(base), env.get("PYTHONPATH", "")]))
        env["CALLS_LOG"] = str(base / "calls.json")
        sizes: list[str] = []
        for i in range(repeats):
            examples = fresh(base, f"examples{i}", {
                "conftest.py": (EXAMPLES / "conftest.py").read_text(),
                "test_models.py": (EXAMPLES / "test_models.py").read_text(),
            })
            bundle = examples / "examples.bundle"
            args = ["-n", "2", f"--compile-cache-bundle={bundle}"]
            cold, _ = run(examples, args, env)
            warm, out = run(examples, args, env)
            calls = json.loads((base / "calls.json").read_text())
            add("examples -n 2: cold run (s)", cold)
            add("examples -n 2: warm run (s)", warm)
            add("examples -n 2: warm / cold", warm / cold)
            add("warm run: summary compile time (s)", summary_compile_seconds(out))
            add("warm run: tests' call durations, summed (s)", sum(calls.values()))

            (examples / "test_side_by_side.py").write_text(SIDE_BY_SIDE)
            _, out = run(examples, ["-p", "no:xdist", "-s", f"--compile-cache-bundle={bundle}", "test_side_by_side.py"],
                         env)
            line = next(ln for ln in out.splitlines() if ln.startswith("BUNDLE_VS_LOCAL"))
            from_bundle, local = map(float, line.split()[1:])
            add("warm_cache transformer: from bundle (s)", from_bundle)
            add("warm_cache transformer: warm local dir (s)", local)
            add("warm_cache transformer: bundle / local", from_bundle / local)

            plain = fresh(base, f"plain{i}", {"test_plain.py": PLAIN_TESTS})
            plain_bundle = plain / "plain.bundle"
            run(plain, ["-n", "2", f"--compile-cache-bundle={plain_bundle}"], env)
            with_bundle, _ = run(plain, ["-n", "2", f"--compile-cache-bundle={plain_bundle}"], env)
            kept = {**env, "TORCHINDUCTOR_CACHE_DIR": str(plain / "kept")}
            run(plain, ["-n", "2", "-p", "no:compilecache"], kept)
            with_kept, _ = run(plain, ["-n", "2", "-p", "no:compilecache"], kept)
            add("plain tests -n 2: warm run with the bundle (s)", with_bundle)
            add("plain tests -n 2: second run, kept TORCHINDUCTOR_CACHE_DIR (s)", with_kept)
            add("plain tests -n 2: bundle / kept dir", with_bundle / with_kept)
            print(f"repeat {i}: " + "; ".join(f"{k.split(':')[-1].strip()} {v[-1]:.2f}" for k, v in rows.items()),
                  flush=True)
            if i == 0:
                sizes = bundle_sizes(bundle)

    import torch

    print(f"\ntorch {torch.__version__}, {os.cpu_count()} CPUs; medians of {repeats} repeats (each run listed)")
    for key, values in rows.items():
        print(f"  {key:62} {statistics.median(values):7.2f}   ({', '.join(f'{v:.2f}' for v in values)})")
    print("\n".join(sizes))


def bundle_sizes(path: Path) -> list[str]:
    """The bundle's size, and what it would be without its C++ binaries."""
    from pytest_compilecache.bundle.format import Bundle, make_entry, read_manifest
    from pytest_compilecache.bundle.writing import write_bundle

    with read_manifest(path) as bundle:
        bundle.read_all()
    bare = path.with_name("without-binaries.bundle")
    entries = [make_entry(e.env, bundle.payload(e), e.artifacts, e.created) for e in bundle.entries]
    write_bundle(Bundle(bare, entries))
    carried = sum((e.binaries.counts()["count"] if e.binaries else 0) for e in bundle.entries)
    return [f"examples bundle: {path.stat().st_size / 1e6:.2f} MB with {carried} C++ binaries, "
            f"{bare.stat().st_size / 1e6:.2f} MB without them"]


if __name__ == "__main__":
    main()
