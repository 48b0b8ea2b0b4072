"""CPU, issue 22: a suite of many small compiled tests, warm from a bundle against a kept cache folder.

The suite is generated: ``PLAIN`` tests that compile a small function with no fixture (as most
suites are written) and ``WARM`` tests that compile one in ``warm_cache``, each a graph of its own
(a few pointwise ops and a reduction, like kornia's or PyG's tests), each function a code object of
its own (one shared closure would hit Dynamo's recompile limit and run eagerly). Two twins of it:

- **plugin**: ``--compile-cache-bundle=PATH`` and a warmup hook compiling the ``warm_cache`` tests'
  functions; one run builds the bundle (the plain tests' compiles go into it too), the measured runs load it.
- **kept folder**: the same tests with no fixture, ``-p no:compilecache``, one kept
  ``TORCHINDUCTOR_CACHE_DIR`` (precompiled headers included); one run fills it.

The plugin's modules are byte-compiled first, as ``pip install`` leaves them (``probe/installed.py``).
Then ``ROUNDS`` warm runs of each twin, the order alternating each round, serial and ``-n 2``: pytest's wall time as a
user sees it, median and range, the ratio of medians, and the median (and range) of each round's own
ratio (its two runs seconds apart, so a slow spell of the machine weighs on both); the processor time
(user + system of pytest and its workers) the same way.

    python benchmarks/small_tests_vs_kept.py [ROUNDS] [PLAIN] [WARM]

With ``--phases``, the serial runs also sum where their time goes (``probe/phases.py``: pytest's
phases, and the garbage collector's full collections and seconds), medians per side. With
``--tmpfs=DIR`` (a RAM-backed folder, such as ``/dev/shm``), a third side runs the plugin with
pytest's ``--basetemp`` (where the plugin keeps its folders) under DIR, in the same rounds. With
``--work=DIR``, the suites, the kept folder, the bundle, the plugin's per-user folder and pytest's
temporary folders (through ``TMPDIR``) lie under DIR instead of the system's temporary folder (a mount
of another file system, to compare file systems); the third side's basetemp stays under ``--tmpfs``'s
DIR. With ``--against=NAME=DIR`` (repeatable), a side runs the plugin's suite with the package found
first in DIR (another checkout: ``git worktree add DIR COMMIT``), in the same rounds, to compare
versions of the plugin with one another and with the kept folder. Everything made is removed at the
end, a failed run's too.
"""

from __future__ import annotations

import compileall
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from probe.installed import as_installed
from probe.phase_log import print_table, read_phases
from probe.runner import pytest_run, spread

QUIET = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-W", "ignore::DeprecationWarning"]


def functions(count: int) -> str:
    """``small.py``: ``count`` small functions, each a code object of its own (a test's own graph:
    pointwise ops with its constants, then a reduction), and ``run(i)`` compiling the i-th."""
    lines = ["import torch", ""]
    for i in range(count):
        lines += [f"def f_{i}(x):", f"    y = torch.sin(x * {(i + 1) / 3!r}) + torch.cos(x) * {i % 7 + 1}",
                  f"    return (y.relu() + {i}).sum(dim=-1)", ""]
    lines += [f"FUNCTIONS = [{', '.join(f'f_{i}' for i in range(count))}]", "", "",
              "def run(i):", "    shape = (4 + i % 5, 16 + 8 * (i % 3))",
              "    out = torch.compile(FUNCTIONS[i])(torch.randn(shape))", "    assert out.shape == (shape[0],)", ""]
    return "\n".join(lines)


WARMUP = """import pytest


@pytest.hookimpl(optionalhook=True)
def pytest_compilecache_warmup(cache):
    from small import run

    for i in range({first}, {last}):
        run(i)
"""


def suite(folder: Path, plain: int, warm: int, plugin: bool) -> Path:
    folder.mkdir(parents=True)
    (folder / "small.py").write_text(functions(plain + warm))
    lines = ["from small import run", ""]
    for i in range(plain):
        lines += [f"def test_plain_{i:03d}():", f"    run({i})", ""]
    for i in range(plain, plain + warm):
        fixture = "warm_cache" if plugin else ""
        lines += [f"def test_warm_{i:03d}({fixture}):", f"    run({i})", ""]
    (folder / "test_small.py").write_text("\n".join(lines))
    (folder / "conftest.py").write_text(WARMUP.format(first=plain, last=plain + warm) if plugin else "")
    return folder


def run(folder: Path, args: list[str], env: dict[str, str], cpu: list[float] | None = None) -> float:
    """pytest's wall seconds; its processor seconds (workers included) appended to ``cpu``."""
    ran = pytest_run([*QUIET, *args], folder, env)
    if cpu is not None:
        cpu.append(ran.cpu)
    return ran.seconds


def main() -> None:
    with_phases = "--phases" in sys.argv
    tmpfs = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--tmpfs=")), None)
    where = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--work=")), None)
    against = dict(a.split("=", 2)[1:] for a in sys.argv if a.startswith("--against="))
    argv = [a for a in sys.argv if a != "--phases" and not a.startswith(("--tmpfs=", "--work=", "--against="))]
    if any(not a.isdigit() for a in argv[1:]):
        raise SystemExit(f"unknown arguments {[a for a in argv[1:] if not a.isdigit()]}; usage: "
                         "small_tests_vs_kept.py [ROUNDS] [PLAIN] [WARM] [--phases] [--tmpfs=DIR] [--work=DIR] "
                         "[--against=NAME=DIR]")
    rounds = int(argv[1]) if len(argv) > 1 else 5
    plain = int(argv[2]) if len(argv) > 2 else 40
    warm = int(argv[3]) if len(argv) > 3 else 20
    print(f"plugin byte-compiled as pip installs it: {as_installed()}", flush=True)
    # Absolute: each run's working folder is its suite's, and a relative TMPDIR that does not exist
    # from there would send pytest's basetemp back to the system's temporary folder without a word.
    work = Path(tempfile.mkdtemp(prefix="small-tests-", dir=where)).resolve()
    in_ram = Path(tempfile.mkdtemp(prefix="small-tests-", dir=tmpfs)).resolve() if tmpfs else None
    if where is not None:
        (work / "tmp").mkdir()
        os.environ["TMPDIR"] = str(work / "tmp")  # pytest's basetemp, for both sides
    print(f"working in {work}", flush=True)
    try:
        measure(work, in_ram, rounds, plain, warm, with_phases, against)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if in_ram is not None:
            shutil.rmtree(in_ram, ignore_errors=True)


def measure(work: Path, in_ram: Path | None, rounds: int, plain: int, warm: int, with_phases: bool,
            against: dict[str, str]) -> None:
    """Build both twins in ``work``, then time ``rounds`` alternating rounds of each side and print the tables."""
    phase_log = work / "phases.log"
    probe_env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent / "probe"),
                                                             os.environ.get("PYTHONPATH", "")])),
                 "PHASES_OUT": str(phase_log)}
    sides = ("plugin", "kept", "plugin, tmpfs") if in_ram is not None else ("plugin", "kept")
    sides += tuple(f"plugin @ {name}" for name in against)
    phases: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    plugin = suite(work / "plugin", plain, warm, plugin=True)
    kept = suite(work / "kept", plain, warm, plugin=False)
    bundle = work / "small.bundle"
    plugin_args = [f"--compile-cache-bundle={bundle}"]
    kept_args = ["-p", "no:compilecache"]
    kept_env = {"TORCHINDUCTOR_CACHE_DIR": str(work / "kept-cache")}
    # The plugin's own per-user folder (precompiled headers) is private to this benchmark, as the
    # kept folder is: neither side starts from what an earlier run left.
    plugin_env = {"XDG_CACHE_HOME": str(work / "xdg")}
    setups = {"plugin": (plugin, plugin_args, plugin_env), "kept": (kept, kept_args, kept_env),
              "plugin, tmpfs": (plugin, [*plugin_args, f"--basetemp={in_ram}/basetemp"], plugin_env)}
    for name, folder in against.items():
        compileall.compile_dir(os.path.join(folder, "pytest_compilecache"), quiet=1)
        found_first = os.pathsep.join(filter(None, [str(Path(folder).resolve()), os.environ.get("PYTHONPATH", "")]))
        setups[f"plugin @ {name}"] = (plugin, plugin_args, {**plugin_env, "PYTHONPATH": found_first})
    print(f"{plain} plain tests and {warm} warm_cache tests, {rounds} alternating rounds", flush=True)
    print(f"build: plugin {run(plugin, plugin_args, plugin_env):.1f} s, "
          f"kept {run(kept, kept_args, kept_env):.1f} s", flush=True)
    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for mode, extra in (("serial", []), ("-n 2", ["-n", "2"])):
        for round_ in range(rounds):
            for side in (sides if round_ % 2 == 0 else sides[::-1]):
                probe = ["-p", "phases"] if with_phases and not extra else []
                probing = probe_env if probe else {}
                folder, args, env = setups[side]
                took = run(folder, [*args, *extra, *probe], {**env, **probing}, cpu.setdefault(f"{side} {mode}", []))
                times.setdefault(f"{side} {mode}", []).append(took)
                summed = read_phases(phase_log)
                for key, value in summed.items():
                    phases[side].setdefault(key, []).append(value)
                if "total" in summed:
                    phases[side].setdefault("interpreter start and exit (outside the probe)", []).append(
                        took - summed["total"])
            print(f"  {mode}: " + ", ".join(f"{side} {times[f'{side} {mode}'][-1]:.2f} s" for side in sides),
                  flush=True)
    for title, seconds in (("wall seconds", times), ("processor seconds (user + system)", cpu)):
        print(f"\n{title}\n\n| run | plugin, median (range) | kept folder, median (range) | ratio of medians "
              "| each round's ratio, median (range) |")
        print("|---|---|---|---|---|")
        for mode, side in [(mode, side) for side in sides if side != "kept" for mode in ("serial", "-n 2")]:
            a, b = seconds[f"{side} {mode}"], seconds[f"kept {mode}"]
            ratios = [x / y for x, y in zip(a, b)]
            print(f"| {mode}{'' if side == 'plugin' else f' ({side})'} | {spread(a, unit=' s')} | "
                  f"{spread(b, unit=' s')} | {statistics.median(a) / statistics.median(b):.3f}x | "
                  f"{spread(ratios, 3, 'x')} |")
    if with_phases:
        print_table("serial runs, where the time went (medians, seconds; probe/phases.py):", phases)
    print(f"\nbundle {bundle.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
