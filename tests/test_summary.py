"""The terminal summary says what happened, never a silent zero, and each thing once."""

from __future__ import annotations

import json
from typing import Callable

import pytest

WARMUP_CONFTEST = """
import torch

def f(x):
    return torch.sin(x) * 2 + 1

def pytest_compilecache_warmup(cache):
    torch.compile(f)(torch.randn(8))
"""

WARM_TEST = """
import torch
from conftest import f

def test_warm(warm_cache):
    torch.compile(f)(torch.randn(8))
    warm_cache.assert_hits(fx_graph=1)

def test_cold(cold_cache):
    torch.compile(lambda x: x.cos() + 1)(torch.randn(4))
    cold_cache.assert_misses(fx_graph=1)
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "n2"])
def test_fixture_runs_without_options_summarise_real_counts(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], workers: list[str]
) -> None:
    """Only fixtures used (no bundle, isolation or report): the table holds the counts the report has."""
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=WARM_TEST)
    plain = run_inner(*workers)
    plain.assert_outcomes(passed=2)
    reported = run_inner(*workers, "--compile-cache-report=report.json")
    reported.assert_outcomes(passed=2)
    totals = json.loads((pytester.path / "report.json").read_text())["totals"]
    assert totals["fx_graph"]["hits"] == 1 and totals["fx_graph"]["misses"] == 1
    text = plain.stdout.str()
    summary = text[text.index("compilecache"):]
    plain.stdout.fnmatch_lines(["*fx_graph*1*1*", "Dynamo over all tests*"])
    assert "compile time in tests: 0.0 s" not in summary
    assert "autotune      0" not in summary  # a GPU-only layer on CPU is '-', never 0


def test_no_counted_test_prints_no_table_of_zeros(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    """A run that asked for a report but whose tests never imported torch has nothing to tabulate."""
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = run_inner("--compile-cache-report=report.json")
    result.assert_outcomes(passed=1)
    text = result.stdout.str()
    assert "per-layer totals" not in text
    result.stdout.fnmatch_lines(["*no test compiled anything*"])
