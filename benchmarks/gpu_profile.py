"""GPU: where a warm run's time goes, the plugin against a kept folder (see gpu_vs_kept.py for the setup).

Builds both sides, then runs each warm twice: once with ``--durations=0`` and each model's compile
profiled (cProfile, written per model), once with the whole pytest process profiled. Prints the
durations, where each model's body differs between the sides (function by function) and the plugin's own functions by cumulative time.

    python3 benchmarks/gpu_profile.py OUTDIR
"""

from __future__ import annotations

import pstats
import sys
import tempfile
from pathlib import Path

from probe.runner import pytest_run

HERE = Path(__file__).parent
QUIET = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-W", "ignore::DeprecationWarning",
         "-W", "ignore::UserWarning"]


def run(args: list[str], env: dict[str, str], profile: Path | None = None) -> tuple[float, str]:
    ran = pytest_run(args, HERE, env, timeout=900, prefix=["-m", "cProfile", "-o", str(profile)] if profile else [])
    return ran.seconds, ran.output


def top(path: Path, title: str, sort: str, count: int, pattern: str = "") -> None:
    print(f"\n### {title} (by {sort})")
    stats = pstats.Stats(str(path))
    stats.sort_stats(sort)
    if pattern:
        stats.print_stats(pattern, count)
    else:
        stats.print_stats(count)


def difference(plugin: Path, kept: Path, title: str, count: int = 35) -> None:
    """The functions whose time differs most between two profiles of one model's body: where the
    plugin's side spends what the kept folder's does not (and the reverse, at the bottom)."""
    ours, theirs = pstats.Stats(str(plugin)).stats, pstats.Stats(str(kept)).stats  # type: ignore[attr-defined]
    rows = []
    for key in set(ours) | set(theirs):
        a, b = ours.get(key, (0, 0, 0.0, 0.0, {})), theirs.get(key, (0, 0, 0.0, 0.0, {}))
        rows.append((a[3] - b[3], a[2] - b[2], a[1], b[1], a[3], b[3], key))
    total = sum(v[2] for v in ours.values()) - sum(v[2] for v in theirs.values())
    print(f"\n### {title}: plugin minus kept, all functions' own time {total:+.3f} s")
    for label, index in (("cumulative", 0), ("own time", 1)):
        print(f"by {label}: d_cum d_own calls(plugin/kept) cum(plugin/kept) function")
        rows.sort(key=lambda r: r[index], reverse=True)
        for r in rows[:count] + [None] + rows[-8:]:  # type: ignore[operator]
            if r is None:
                print("  ...")
                continue
            file, line, name = r[6]
            print(f"  {r[0]:+.3f} {r[1]:+.3f} {r[2]}/{r[3]} {r[4]:.3f}/{r[5]:.3f} {file}:{line}({name})")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-profile-"))
    bundle, kept = work / "models.bundle", work / "kept"
    plugin = ["gpu_models", *QUIET, f"--compile-cache-bundle={bundle}"]
    plain = ["gpu_models_plain", *QUIET, "-p", "no:compilecache"]
    kept_env = {"TORCHINDUCTOR_CACHE_DIR": str(kept), "TRITON_CACHE_DIR": str(kept / "triton")}
    print(f"build: plugin {run(plugin, {})[0]:.1f} s, kept {run(plain, kept_env)[0]:.1f} s", flush=True)
    for side, args, env in (("plugin", plugin, {}), ("kept", plain, kept_env)):
        bodies = out / f"bodies-{side}"
        bodies.mkdir(exist_ok=True)
        took, text = run([*args, "--durations=0", "-vv"], {**env, "GPU_MODELS_PROFILE": str(bodies)})
        print(f"\n## {side}: warm run with bodies profiled: {took:.2f} s wall")
        print(text[text.find("slowest durations"):][:3000])
        took, _ = run(args, env, profile=out / f"whole-{side}.prof")
        print(f"## {side}: warm run, whole process profiled: {took:.2f} s wall", flush=True)
    for name in ("resnet18", "bert"):
        difference(out / "bodies-plugin" / f"{name}.prof", out / "bodies-kept" / f"{name}.prof", f"{name} body")
    top(out / "whole-plugin.prof", "whole run, plugin: the plugin's functions", "cumulative", 60, "pytest_compilecache")
    top(out / "whole-plugin.prof", "whole run, plugin", "tottime", 40)
    top(out / "whole-kept.prof", "whole run, kept", "tottime", 40)


if __name__ == "__main__":
    main()
