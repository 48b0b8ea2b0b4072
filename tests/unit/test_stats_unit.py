"""The counts model, in process, beside ``tests/test_stats.py``: flat counts mapped onto layers, sums that keep
reasons once, what cannot be observed never read as a number, and the tables and summaries printed from them."""

from __future__ import annotations

from collections import Counter

import pytest

from pytest_compilecache.stats import (
    LAYERS, CacheStats, DynamoStats, LayerStats, UnobservableLayerError, check_layer_names, stats_from_counts)


def test_hits_from_the_bundle_never_exceed_the_hits() -> None:
    """A ``from_bundle`` count above the layer's hits is cut to the hits."""
    stats = stats_from_counts({"fx_graph.hits": 2, "fx_graph.from_bundle": 5}, {})
    assert (stats.fx_graph.hits, stats.fx_graph.from_bundle) == (2, 2)


def test_explained_misses_are_counted_per_text_and_per_kind() -> None:
    """``layer.explanation/TEXT`` and ``layer.miss_kind/KIND`` become the layer's explanations and kinds."""
    stats = stats_from_counts({"fx_graph.explanation/config changed": 2, "fx_graph.explanation/new code": 1,
                               "fx_graph.miss_kind/config": 2, "fx_graph.miss_kind/new": 1,
                               "fx_graph.explanation/never": 0}, {})
    assert stats.fx_graph.explanations == ("config changed", "new code")
    assert stats.fx_graph.miss_kinds == Counter({"config": 2, "new": 1}) and stats.fx_graph.explained == 3
    assert stats.aot_autograd.explained == 0


@pytest.mark.parametrize("kinds, said", [
    ({"new code": 1}, "fx_graph: 1 miss explained: 1 new code"),
    ({"b": 2, "a": 2, "c": 3}, "fx_graph: 7 misses explained: 3 c, 2 a, 2 b"),
], ids=["one", "most-first-then-by-name"])
def test_the_explained_summary_lists_kinds_most_first(kinds: dict[str, int], said: str) -> None:
    """Kinds are said most frequent first, ties by name, after how many misses were explained."""
    layer = LayerStats("fx_graph", miss_kinds=Counter(kinds), explained=sum(kinds.values()))
    assert layer.explained_summary() == said


def test_a_layer_with_no_explained_miss_has_no_summary() -> None:
    """Nothing explained, nothing said."""
    assert LayerStats("fx_graph", Counter(misses=3)).explained_summary() == ""


def test_a_sum_of_layers_adds_counts_and_keeps_texts_once_in_order() -> None:
    """Counts add; bypass reasons and explanations join without repeats, first seen first."""
    a = LayerStats("fx_graph", Counter(hits=1, misses=2), bypass_reasons=("hop",), explanations=("x", "y"),
                   miss_kinds=Counter(k=1), explained=2)
    b = LayerStats("fx_graph", Counter(hits=3), bypass_reasons=("hop", "hook"), explanations=("y", "z"),
                   miss_kinds=Counter(k=2), explained=1)
    total = a + b
    assert (total.hits, total.misses) == (4, 2)
    assert total.bypass_reasons == ("hop", "hook") and total.explanations == ("x", "y", "z")
    assert total.miss_kinds == Counter(k=3) and total.explained == 3


@pytest.mark.parametrize("first_unobservable", [True, False])
def test_a_sum_with_an_unobservable_layer_is_unobservable(first_unobservable: bool) -> None:
    """Counts of a layer one span could not observe are not summed into a number that looks whole."""
    seen, unseen = LayerStats("triton", Counter(hits=4)), LayerStats("triton", reason="no GPU")
    total = unseen + seen if first_unobservable else seen + unseen
    assert not total.observable and total.reason == "no GPU"
    with pytest.raises(UnobservableLayerError, match="no GPU"):
        total.hits


def test_a_saved_count_torch_cannot_keep_is_a_dash_and_refuses_to_be_read() -> None:
    """``saved`` unobservable: the cell is ``-``, reading it raises, JSON says null and why; hits still read."""
    layer = LayerStats("autotune", Counter(hits=2, saved=9), saved_unobservable="torch does not count puts")
    assert (layer.cell("saved"), layer.cell("hits"), layer.hits) == ("-", "2", 2)
    with pytest.raises(UnobservableLayerError, match="autotune.saved cannot be observed here"):
        layer.saved
    assert layer.to_dict()["saved"] is None and layer.to_dict()["saved_unobservable"] == "torch does not count puts"


@pytest.mark.parametrize("layer", [
    LayerStats("fx_graph", Counter(hits=1, misses=2, bypasses=3, saved=4, from_bundle=1), bypass_reasons=("hop",)),
    LayerStats("aot_autograd", Counter(misses=1), explanations=("x",), miss_kinds=Counter(k=1), explained=1),
    LayerStats("autotune", Counter(hits=1), saved_unobservable="no puts"),
    LayerStats("triton", reason="no GPU"),
], ids=["counts-and-bypasses", "explained", "saved-unobservable", "unobservable"])
def test_a_layers_json_reads_back_equal(layer: LayerStats) -> None:
    """Every form a layer takes survives ``to_dict`` and ``from_dict``."""
    assert LayerStats.from_dict(layer.layer, layer.to_dict()) == layer


def test_missing_layers_and_dynamo_counts_read_as_zero() -> None:
    """A test's counts from a plugin that knew fewer layers read as zeros, all layers present."""
    stats = CacheStats.from_dict({"fx_graph": {"hits": 1}})
    assert [s.layer for s in stats] == list(LAYERS) and stats.pgo.misses == 0 and stats.dynamo.frames == 0


def test_an_unobservable_dynamo_count_is_a_dash_null_and_an_error_to_read() -> None:
    """A Dynamo count this torch cannot keep never reads as 0."""
    dynamo = DynamoStats(Counter(graphs=2, recompiles=5), unobservable={"recompiles": "old torch"})
    assert (dynamo.cell("recompiles"), dynamo.cell("graphs")) == ("-", "2")
    assert dynamo.to_dict()["recompiles"] is None and dynamo.to_dict()["unobservable"] == {"recompiles": "old torch"}
    with pytest.raises(UnobservableLayerError, match="dynamo.recompiles cannot be observed here: old torch"):
        dynamo.recompiles
    with pytest.raises(TypeError, match="unknown Dynamo count 'graph'"):
        dynamo.count("graph")


def test_dynamos_table_checks_expected_counts() -> None:
    """Expected counts are marked ``(ok)`` or ``(expected N)``; an unobservable one is never ok."""
    dynamo = DynamoStats(Counter(frames=1, graphs=2), unobservable={"recompiles": "old torch"})
    header, cells = dynamo.table({"graphs": 2, "frames": 3, "recompiles": 0}).splitlines()[:2]
    assert cells.split() == ["1", "(expected", "3)", "2", "(ok)", "-", "(expected", "0)", "0"]
    assert header.split() == ["frames", "graphs", "recompiles", "graph_breaks"]


def test_a_sum_of_dynamo_stats_adds_counts_and_joins_reasons() -> None:
    """Counts add; reasons are kept once each, first seen first."""
    a = DynamoStats(Counter(graphs=1), recompile_reasons=("r1",))
    b = DynamoStats(Counter(graphs=2, recompiles=1), recompile_reasons=("r1", "r2"))
    total = a + b
    assert (total.graphs, total.recompiles, total.recompile_reasons) == (3, 1, ("r1", "r2"))


@pytest.mark.parametrize("counts, nothing", [
    ({}, True),
    ({"cpp.hits": 1}, False),
    ({"pgo.saved": 1}, False),
    ({"dynamo.frames": 1}, False),
    ({"dynamo.recompiles": 1}, True),
    ({"fx_graph.from_bundle": 1}, True),
], ids=["empty", "a-hit", "a-save", "a-frame", "recompiles-alone", "from-bundle-alone"])
def test_nothing_happened_means_no_lookup_no_save_and_no_frame(counts: dict[str, int], nothing: bool) -> None:
    """A span counts as compiling where a layer looked up or saved, or Dynamo converted a frame or graph."""
    assert stats_from_counts(counts, {}).nothing_happened is nothing


def test_the_table_leaves_out_remote_layers_with_no_remote_cache() -> None:
    """Remote layers that cannot be observed (no remote cache) have no row, unless a check names them."""
    unobservable = {name: "no remote cache" for name in LAYERS if name.startswith("remote_")}
    stats = stats_from_counts({"fx_graph.hits": 1}, unobservable)
    assert "remote_" not in stats.table()
    assert "remote_fx_graph" in stats.table({"remote_fx_graph": 1}, "hits")


def test_the_tables_from_column_names_where_hits_came_from() -> None:
    """The last count column is headed after the source of hits: the bundle, or the warmup."""
    stats = stats_from_counts({"fx_graph.hits": 1}, {})
    assert "from warmup" in stats.table(source="warmup").splitlines()[0]
    assert "from bundle" in stats.table().splitlines()[0]


def test_explanations_can_be_asked_for_some_layers() -> None:
    """One line per explained miss, of the layers asked for only."""
    stats = stats_from_counts({"fx_graph.explanation/a": 1, "aot_autograd.explanation/b": 1}, {})
    assert stats.explanations() == ["  fx_graph miss: a", "  aot_autograd miss: b"]
    assert stats.explanations(["aot_autograd"]) == ["  aot_autograd miss: b"]


def test_several_unknown_layer_names_are_all_named() -> None:
    """A typo among several layer names names each wrong one, and lists the layers."""
    with pytest.raises(TypeError, match=r"^unknown cache layers 'fx', 'aot'; the layers are fx_graph, "):
        check_layer_names(["fx", "cpp", "aot"])
