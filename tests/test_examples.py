"""The examples suite, as the README's main job runs it: cold with -n 2, then warm."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest

#: Real sessions against real servers and suites: left out of the fast tier (-m "not slow").
pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parent.parent / "examples"
WARMED = ("_warm", "warm_hit")


def test_examples_cold_then_warm(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], default_dir_of: Path
) -> None:
    for name in ("conftest.py", "models.py", "test_models.py"):
        shutil.copy(EXAMPLES / name, pytester.path / name)
    bundle = pytester.path / "bundle" / "examples.bundle"
    report = pytester.path / "report.json"
    args = ("-n", "2", f"--compile-cache-bundle={bundle}", f"--compile-cache-report={report}")
    cold = run_inner(*args)
    cold.assert_outcomes(passed=10)
    cold.stdout.fnmatch_lines(["*warmup ran here*", "*bundle written:*examples.bundle*"])
    warm = run_inner(*args)
    warm.assert_outcomes(passed=10)
    warm.stdout.fnmatch_lines([
        "*fx_graph: 1 miss explained: 1 config `max_fusion_size` changed*",
        "*compile time in tests:*s of wall time*C++ builds*",
        "*this session against the run that built the bundle (the same 10 tests on 2 workers): * s now, * s then (*",
        "*C++ binaries:*carried,*fit this machine*",
    ])
    document = json.loads(report.read_text())
    compared = document["totals"]["compared_with_build"]
    assert compared["tests"] == 10 and compared["processes"] == 2 and compared["built_compile_seconds"] > 0, compared
    assert set(compared) == {"tests", "processes", "session_seconds", "built_session_seconds", "compile_seconds",
                             "built_compile_seconds", "session_seconds_saved", "headers_seconds",
                             "built_headers_seconds", "headers_left_out"}
    tests = document["tests"]
    warmed = {k: v for k, v in tests.items() if any(w in k for w in WARMED + ("ordinary",))}
    assert len(warmed) == 7
    for nodeid, stats in warmed.items():
        assert stats["fx_graph"]["misses"] == 0, nodeid
        assert stats["fx_graph"]["hits"] >= 1, nodeid
        assert stats["cpp"]["misses"] == 0 and stats["cpp"]["hits"] >= 1, f"{nodeid} built a C++ kernel: {stats}"
        assert "built_compile_seconds" in stats, nodeid
    assert not default_dir_of.exists()
