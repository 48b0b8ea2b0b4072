"""``--compile-cache-isolate-mode=worker``: kept folders, and a warmup that is warm from the second run on."""

from __future__ import annotations

import json
from typing import Callable

import pytest

from helpers import WARMUP_CONFTEST


TEST = """
import torch
from conftest import f

def test_warm(warm_cache):
    torch.compile(f)(torch.randn(8))
    warm_cache.assert_hits(fx_graph=1)
"""


@pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "2"]], ids=["serial", "n2"])
@pytest.mark.slow
def test_the_warmup_is_warm_in_a_second_run(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], workers: list[str]
) -> None:
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=TEST)
    ini = f"compile_cache_home = {pytester.path / 'home'}"
    stats = []
    for run in range(2):
        result = run_inner(*workers, "--compile-cache-isolate-mode=worker", "--compile-cache-report=r.json", ini=ini)
        result.assert_outcomes(passed=1)
        # Both runs' summaries read the same until they said whether the kept folder served (a newcomer).
        result.stdout.fnmatch_lines([f"*this run it found {run} of 1 FX graphs there*"])
        processes = json.loads((pytester.path / "r.json").read_text())["bundle"]["processes"]
        (warmup,) = [p["warmup_stats"] for p in processes if p.get("warmup_stats")]
        stats.append(warmup["fx_graph"])
    assert stats[0]["misses"] == 1 and stats[0]["hits"] == 0
    assert stats[1]["misses"] == 0 and stats[1]["hits"] == 1, stats
    # A newcomer read "what it compiled is for this session's warm_cache tests only" in worker mode,
    # whose warmup folder is kept (and hit), named nowhere; and found lock files left in the home.
    summary = result.stdout.str()[result.stdout.str().index("= compilecache ="):]
    kept = pytester.path / "home" / "workers"
    assert "for this session's warm_cache tests only" not in summary, summary
    assert "): ran here: " in summary or "warmup: ran here: " in summary, summary
    assert f"in its folder kept between runs, {kept}" in summary, summary
    assert "from warmup" in summary and "from bundle" not in summary, "no bundle was named"
    locks = [p.name for p in kept.glob("*/*.lock")]
    assert locks and all(name.startswith(".") for name in locks), f"a worker's lock files are hidden: {locks}"


PLAIN_COMPILE = """
import torch

def test_plain():
    torch.compile(lambda x: torch.sin(x) * 2 + 1)(torch.randn(8))
"""


def test_a_plain_test_is_counted_as_in_every_other_mode(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    """A test without fixture compiling in its worker's kept folder: C++ loads and FX graph saves are counted."""
    pytester.makepyfile(test_model=PLAIN_COMPILE)
    result = run_inner("-p", "no:xdist", "--compile-cache-isolate-mode=worker", "--compile-cache-report=r.json",
                       ini=f"compile_cache_home = {pytester.path / 'home'}")
    result.assert_outcomes(passed=1)
    assert "not observable: this torch has no CppCodeCache.load_async" not in result.stdout.str()
    totals = json.loads((pytester.path / "r.json").read_text())["totals"]
    assert totals["fx_graph"]["misses"] == 1 and totals["fx_graph"]["saved"] == 1, totals
    assert totals["aot_autograd"]["saved"] == 1, totals
    assert totals["cpp"]["misses"] + totals["cpp"]["hits"] >= 1, totals
