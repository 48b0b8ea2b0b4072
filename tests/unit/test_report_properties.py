"""JUnit XML's properties of one test, in process: named after the layers, present only for what was observed."""

from __future__ import annotations

from typing import Any

from pytest_compilecache.report.properties import DYNAMO_PROPERTIES, LAYER_COUNTS, PREFIX, properties_of
from pytest_compilecache.stats import LAYERS, stats_from_counts


def _stats(unobservable: dict[str, str] | None = None, fields: dict[str, str] | None = None,
           seconds: float = 0.0, **counts: int) -> dict[str, Any]:
    flat = {name.replace("__", "."): n for name, n in counts.items()}
    stats = stats_from_counts(flat, unobservable or {}, unobservable_fields=fields or {}).to_dict()
    return {**stats, "compile_seconds": seconds}


def test_a_test_that_compiled_nothing_has_no_properties() -> None:
    """No counts and no compile time: no property at all, not a row of zeros."""
    assert properties_of(_stats()) == []


def test_compile_time_alone_still_gives_the_properties_rounded() -> None:
    """Seconds spent compiling with no counted lookup still report, rounded to milliseconds."""
    props = dict(properties_of(_stats(seconds=1.23456)))
    assert props[f"{PREFIX}compile_seconds"] == 1.235 and props[f"{PREFIX}fx_graph.hits"] == 0


def test_each_layers_properties_hold_its_counts() -> None:
    """Every observable layer has its hits, misses and from_bundle, with the test's figures."""
    props = dict(properties_of(_stats(fx_graph__hits=3, fx_graph__from_bundle=2, cpp__misses=5)))
    assert (props[f"{PREFIX}fx_graph.hits"], props[f"{PREFIX}fx_graph.from_bundle"]) == (3, 2)
    assert props[f"{PREFIX}cpp.misses"] == 5
    assert {name for name in props if name.count(".") == 2 and ".dynamo." not in name} == {
        f"{PREFIX}{layer}.{kind}" for layer in LAYERS for kind in LAYER_COUNTS}


def test_an_unobservable_layer_or_dynamo_count_has_no_property() -> None:
    """What this machine cannot observe is left out rather than reported as 0."""
    stats = _stats({"triton": "no GPU"}, {"dynamo.recompiles": "old torch"}, **{"fx_graph__hits": 1,
                                                                              "dynamo__graph_breaks": 2})
    names = [name for name, _ in properties_of(stats)]
    assert not any(name.startswith(f"{PREFIX}triton.") for name in names)
    assert f"{PREFIX}dynamo.recompiles" not in names
    assert dict(properties_of(stats))[f"{PREFIX}dynamo.graph_breaks"] == 2
    assert {f"{PREFIX}dynamo.{k}" for k in DYNAMO_PROPERTIES} - set(names) == {f"{PREFIX}dynamo.recompiles"}
