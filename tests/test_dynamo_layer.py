"""``stats.dynamo`` and ``assert_compiles``: the torch-free model, then real compiles in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from pytest_compilecache import CacheStats, UnobservableLayerError
from pytest_compilecache.stats import GRAPH_BREAK_REASON, RECOMPILE_REASON, DynamoStats, stats_from_counts

GB_PRINT = "Failed to trace builtin operator\n  Explanation: Dynamo does not know how to trace `print`"


def make(unobservable: dict[str, str] | None = None, **counts: int) -> DynamoStats:
    flat = {f"dynamo.{k}": v for k, v in counts.items()}
    flat.update({RECOMPILE_REASON + "f (x.py:1): 0/0: tensor 'x' dtype mismatch": 1,
                 GRAPH_BREAK_REASON + GB_PRINT: 2, GRAPH_BREAK_REASON + "seen before this span": 0})
    return stats_from_counts(flat, {}, unobservable_fields=unobservable or {}).dynamo


def test_counts_and_reasons_come_from_flat_counts() -> None:
    stats = make(frames=2, graphs=3, recompiles=1, graph_breaks=2)
    assert (stats.frames, stats.graphs, stats.recompiles, stats.graph_breaks) == (2, 3, 1, 2)
    assert stats.recompile_reasons == ("f (x.py:1): 0/0: tensor 'x' dtype mismatch",)
    assert stats.graph_break_reasons == (GB_PRINT,)
    with pytest.raises(TypeError, match="unknown Dynamo count 'graph'"):
        stats.count("graph")


def test_sum_round_trip_and_the_report_form() -> None:
    a = stats_from_counts({"dynamo.graphs": 1, GRAPH_BREAK_REASON + "a": 1}, {})
    b = stats_from_counts({"dynamo.graphs": 2, "dynamo.recompiles": 1, GRAPH_BREAK_REASON + "a": 1,
                           RECOMPILE_REASON + "r": 1}, {})
    total = a + b
    assert (total.dynamo.graphs, total.dynamo.recompiles) == (3, 1)
    assert total.dynamo.graph_break_reasons == ("a",)
    assert CacheStats.from_dict(total.to_dict()) == total
    assert total.to_dict()["dynamo"] == {"frames": 0, "graphs": 3, "recompiles": 1, "graph_breaks": 0,
                                         "recompile_reasons": ["r"], "graph_break_reasons": ["a"]}
    assert CacheStats.from_dict({"fx_graph": {"hits": 1}}).dynamo == DynamoStats()
    assert "dynamo" not in [s.layer for s in total]


def test_an_unobservable_count_refuses_to_pretend() -> None:
    stats = make({"dynamo.recompiles": "no hook here"}, graphs=1)
    assert stats.graphs == 1
    with pytest.raises(UnobservableLayerError, match="no hook here"):
        stats.recompiles
    assert stats.to_dict()["recompiles"] is None
    assert DynamoStats.from_dict(stats.to_dict()) == stats
    assert "recompiles not observable: no hook here" in stats.table()


def test_table_marks_expected_counts_and_prints_reasons() -> None:
    text = make(graphs=3, graph_breaks=2).table({"graphs": 1, "graph_breaks": 2})
    assert "3 (expected 1)" in text and "2 (ok)" in text
    assert "recompile: f (x.py:1): 0/0: tensor 'x' dtype mismatch" in text
    assert "graph break: Failed to trace builtin operator\n    Explanation: Dynamo" in text
    assert "Explanation" not in make().table(brief=True)


INNER = '''
import pytest
import torch


def test_a_dtype_change_recompiles_with_the_failed_guard(cold_cache):
    def scale(x):
        return x * 2 + 1
    f = torch.compile(scale, backend="eager")
    f(torch.randn(4))
    f(torch.randn(4))
    cold_cache.assert_compiles(frames=1, graphs=1, recompiles=0, graph_breaks=0)
    f(torch.randn(4, dtype=torch.float64))
    cold_cache.assert_compiles(frames=2, graphs=2, recompiles=1, graph_breaks=0)
    (reason,) = cold_cache.stats.dynamo.recompile_reasons
    assert reason.startswith("scale (") and "test_inner.py" in reason, reason
    assert "dtype mismatch" in reason and "expected Float, actual Double" in reason, reason


def test_graph_breaks_are_counted_with_their_reasons(cold_cache):
    def explicit(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y + 1
    torch.compile(explicit, backend="eager")(torch.randn(3))
    cold_cache.assert_compiles(frames=2, graphs=2, recompiles=0, graph_breaks=1)
    (reason,) = cold_cache.stats.dynamo.graph_break_reasons
    assert "torch._dynamo.graph_break()" in reason, reason
    with pytest.raises(AssertionError) as failed:  # names the line, as compile expectations do
        cold_cache.assert_compiles(graph_breaks=0)
    line = explicit.__code__.co_firstlineno + 2
    assert f"graph break at {__file__}:{line}" in str(failed.value), str(failed.value)

    def printing(x):
        y = x.cos()
        print("side effect")
        return y * 2
    torch.compile(printing, backend="eager")(torch.randn(3))
    cold_cache.assert_compiles(graph_breaks=2)
    assert "print" in cold_cache.stats.dynamo.graph_break_reasons[1]


def test_a_data_dependent_branch_is_a_graph_break(cold_cache):
    def branch(x):
        if x.sum() > 0:
            return x + 1
        return x - 1
    torch.compile(branch, backend="eager")(torch.ones(3))
    cold_cache.assert_compiles(graph_breaks=1, recompiles=0)
    assert "Data-dependent" in cold_cache.stats.dynamo.graph_break_reasons[0]


def _helper_that_branches(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def test_a_data_dependent_branch_in_a_called_function_is_two_breaks_counted_once_each(cold_cache):
    def outer(x):
        return _helper_that_branches(x * 2) * 3
    torch.compile(outer, backend="eager")(torch.ones(3))
    # outer breaks where it calls the helper, and the helper's own frame at its branch (torch <= 2.10
    # logs the branch in both translators, and counts neither or one of them)
    cold_cache.assert_compiles(graph_breaks=2, recompiles=0)


def test_dynamic_compiles_once_for_every_size(cold_cache):
    def norm(x):
        return (x - x.mean()) / (x.std() + 1e-5)
    f = torch.compile(norm, dynamic=True)
    for n in (3, 5, 8, 13, 21):
        f(torch.randn(n))
    cold_cache.assert_compiles(graphs=1, recompiles=0, graph_breaks=0)  # frames: torch 2.7 counts 4 here
    cold_cache.assert_misses(fx_graph=1)


def test_automatic_dynamic_recompiles_once_on_a_new_size(cold_cache):
    f = torch.compile(lambda x: x * 3, backend="eager")
    for n in (3, 5, 8, 13):
        f(torch.randn(n))
    cold_cache.assert_compiles(graphs=2, recompiles=1)
    assert "size mismatch at index 0. expected 3, actual 5" in cold_cache.stats.dynamo.recompile_reasons[0]


class Doubler(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_a_module_recompile_is_located_in_the_users_code(cold_cache):
    model = torch.compile(Doubler(), backend="eager", dynamic=False)
    model(torch.randn(8))
    model(torch.randn(9))
    layers = torch.compile(torch.nn.Sequential(torch.nn.ReLU()), backend="eager", dynamic=False)
    layers(torch.randn(8))
    layers(torch.randn(9))  # a torch.nn module: Dynamo compiles a wrapper frame of its own
    cold_cache.assert_compiles(recompiles=2)
    own, builtin = cold_cache.stats.dynamo.recompile_reasons
    assert own.startswith("forward (") and "test_inner.py" in own, own
    assert builtin.startswith("Sequential.forward (called at ") and "test_inner.py:" in builtin, builtin
    assert "external_utils" not in own + builtin


def test_counts_are_per_test(cold_cache):
    def scale(x):
        return x * 2 + 1
    torch.compile(scale, backend="eager")(torch.randn(4))
    cold_cache.assert_compiles(frames=1, graphs=1, recompiles=0, graph_breaks=0)


def test_a_failure_shows_expected_actual_and_reasons(cold_cache):
    def twice(x):
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2
    f = torch.compile(twice, backend="eager")
    f(torch.randn(2))
    f(torch.randn(2, dtype=torch.float16))
    with pytest.raises(TypeError, match="needs at least one"):
        cold_cache.assert_compiles()
    with pytest.raises(TypeError, match="non-negative int"):
        cold_cache.assert_compiles(graphs=-1)
    cold_cache.assert_compiles(graphs=1, recompiles=0, graph_breaks=0)
'''


@pytest.mark.compat
@pytest.mark.core
def test_real_compiles(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], tmp_path: Path
) -> None:
    pytester.makepyfile(test_inner=INNER)
    report = tmp_path / "report.json"
    result = run_inner("-p", "no:cacheprovider", f"--compile-cache-report={report}")
    result.assert_outcomes(passed=8, failed=1)
    text = result.stdout.str()
    assert "Dynamo compile counts differ: graphs expected 1, got 4; recompiles expected 0, got 2; " \
           "graph_breaks expected 0, got 2" in text, text
    assert "4 (expected 1)  2 (expected 0)  2 (expected 0)" in text
    assert "recompile: twice (" in text and "0/0: tensor 'x' dtype mismatch. expected Float, actual Half" in text
    assert "recompile: torch_dynamo_resume_in_twice" in text
    assert "graph break: Call to `torch._dynamo.graph_break()`" in text
    assert "Explanation: User-inserted graph break" in text
    assert "Dynamo over all tests:" in text
    tests = json.loads(report.read_text())["tests"]
    dynamo = tests["test_inner.py::test_a_dtype_change_recompiles_with_the_failed_guard"]["dynamo"]
    assert (dynamo["frames"], dynamo["graphs"], dynamo["recompiles"], dynamo["graph_breaks"]) == (2, 2, 1, 0)
    assert "dtype mismatch" in dynamo["recompile_reasons"][0]
    assert tests["test_inner.py::test_counts_are_per_test"]["dynamo"] == {
        "frames": 1, "graphs": 1, "recompiles": 0, "graph_breaks": 0}
    totals = json.loads(report.read_text())["totals"]["dynamo"]
    assert (totals["recompiles"], totals["graph_breaks"]) == (6, 7)
