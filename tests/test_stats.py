"""The torch-free statistics model: counts, sums, tables and the JSON form."""

from __future__ import annotations

import pytest

from pytest_compilecache import CacheStats, LayerStats, UnobservableLayerError
from pytest_compilecache.stats import LAYERS, stats_from_counts


def make(**counts: int) -> CacheStats:
    return stats_from_counts(counts, {"triton": "no GPU"}, {"fx_graph": ("it has a HOP",)})


def test_counts_map_onto_layers() -> None:
    stats = make(**{"fx_graph.hits": 2, "fx_graph.misses": 1, "aot_autograd.saved": 3, "fx_graph.from_bundle": 2})
    assert (stats.fx_graph.hits, stats.fx_graph.misses, stats.fx_graph.bypasses) == (2, 1, 0)
    assert stats.fx_graph.from_bundle == 2
    assert stats.aot_autograd.saved == 3
    assert [s.layer for s in stats] == list(LAYERS)


def test_unobservable_layer_refuses_to_pretend() -> None:
    stats = make()
    assert not stats.triton.observable
    with pytest.raises(UnobservableLayerError, match="no GPU"):
        stats.triton.hits
    assert stats.to_dict()["triton"] == {"observable": False, "reason": "no GPU"}


def test_sum_and_round_trip() -> None:
    a = make(**{"fx_graph.hits": 1, "pgo.misses": 2})
    b = make(**{"fx_graph.hits": 4, "fx_graph.bypasses": 1})
    total = a + b
    assert (total.fx_graph.hits, total.fx_graph.bypasses, total.pgo.misses) == (5, 1, 2)
    assert total.fx_graph.bypass_reasons == ("it has a HOP",)
    assert CacheStats.from_dict(total.to_dict()) == total


def test_table_marks_expected_cells() -> None:
    text = make(**{"fx_graph.hits": 1}).table({"fx_graph": 2, "aot_autograd": 0}, "hits")
    assert "1 (expected 2)" in text
    assert "0 (ok)" in text
    assert "not observable: no GPU" in text
    assert "fx_graph bypassed: it has a HOP" in text


def test_unknown_layer_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="unknown cache layer 'fx'"):
        make().layer("fx")
    with pytest.raises(TypeError):
        LayerStats("fx_graph").count("hit")


def test_a_graph_break_with_its_place_is_listed_once_in_the_brief_table() -> None:
    from pytest_compilecache.stats import DynamoStats

    reason = "Failed to trace builtin operator\n  Explanation: Dynamo does not know how to trace `print`"
    dynamo = DynamoStats.from_dict({"graph_breaks": 2, "graph_break_reasons": [reason, "Unsupported: a hook"],
                                    "graph_breaks_at": ["test_gb.py:4: Failed to trace builtin operator "
                                                        "(Explanation: Dynamo does not know how to trace `print`)"]})
    brief = dynamo.table(brief=True)
    assert brief.count("Failed to trace builtin operator") == 1, brief
    assert "graph break at test_gb.py:4" in brief and "graph break: Unsupported: a hook" in brief
    assert dynamo.table().count("Failed to trace builtin operator") == 2  # an assertion's table keeps the whole reason
