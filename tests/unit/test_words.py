"""How counts and artifact kinds are said in messages, in process."""

from __future__ import annotations

import pytest

from pytest_compilecache.stats import LAYERS
from pytest_compilecache.words import artifact_counts, counted, in_layer_order, layer_of, placed_counts


@pytest.mark.parametrize("n, said", [(0, "0 tests"), (1, "1 test"), (2, "2 tests"), (12345, "12,345 tests")],
                         ids=["zero", "one", "two", "thousands"])
def test_a_count_is_plural_unless_one_and_grouped_by_thousands(n: int, said: str) -> None:
    """``counted`` adds an ``s`` unless the count is 1, and groups thousands with commas."""
    assert counted(n, "test") == said


@pytest.mark.parametrize("kind, layer", [("inductor", "fx_graph"), ("aot_autograd", "aot_autograd"),
                                         ("pgo", "pgo"), ("something_new", "something_new")])
def test_an_artifact_kind_is_named_after_the_layer_it_fills(kind: str, layer: str) -> None:
    """Mega-Cache's ``inductor`` artifacts are the ``fx_graph`` layer's; other kinds keep their names."""
    assert layer_of(kind) == layer


def test_kinds_follow_the_per_layer_tables_order_unknown_ones_last_by_name() -> None:
    """Known kinds in the order of :data:`LAYERS`; kinds of no layer after them, alphabetically."""
    kinds = ["zeta", "pgo", "autotune", "inductor", "alpha", "aot_autograd"]
    ordered = in_layer_order(kinds)
    assert ordered == ["inductor", "aot_autograd", "autotune", "pgo", "alpha", "zeta"]
    known = [layer_of(k) for k in ordered[:4]]
    assert known == sorted(known, key=LAYERS.index)


def test_artifact_counts_are_said_in_layer_order_with_layer_names() -> None:
    """``{kind: count}`` reads as the per-layer table names and orders them; nothing is an empty string."""
    assert artifact_counts({"pgo": 1, "aot_autograd": 2, "inductor": 3}) == "3 fx_graph, 2 aot_autograd, 1 pgo"
    assert artifact_counts({}) == ""


def test_placed_counts_say_how_many_of_each_kind_were_asked_for() -> None:
    """Every kind the entry holds is said, with 0 where none was asked for."""
    assert placed_counts({"inductor": 2}, {"aot_autograd": 4, "inductor": 5}) == "2 of 5 fx_graph, 0 of 4 aot_autograd"
