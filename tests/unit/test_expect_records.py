"""A test's compile record, in process: what differs from its record, and the failure message that says it."""

from __future__ import annotations

import pytest

from pytest_compilecache.expect.records import CACHE_FIELDS, DYNAMO_FIELDS, FIELDS, Change, Measured, changes, describe


@pytest.mark.parametrize("recorded, now, expected", [
    ({"graphs": 1, "recompiles": 0}, {"graphs": 1, "recompiles": 0}, []),
    ({"graphs": 1, "recompiles": 0}, {"graphs": 2, "recompiles": 1},
     [Change("graphs", 1, 2), Change("recompiles", 0, 1)]),
    ({"graphs": None, "recompiles": 0}, {"graphs": 5, "recompiles": 0}, []),
    ({"graphs": 1}, {"graphs": None}, []),
    ({}, {"graphs": 3}, []),
], ids=["same", "two-changed", "unobservable-then", "unobservable-now", "absent"])
def test_only_counts_known_on_both_sides_are_compared(
        recorded: dict[str, int | None], now: dict[str, int | None], expected: list[Change]) -> None:
    """A field differs only where both the record and this run kept it, and they disagree."""
    assert changes(recorded, now) == expected


def test_only_the_fields_asked_for_are_compared() -> None:
    """On another machine only Dynamo's fields are compared: a cache outcome that differs is not a change."""
    recorded = {**{f: 0 for f in FIELDS}}
    now = {**recorded, "fx_graph.hits": 4, "graph_breaks": 1}
    assert changes(recorded, now, DYNAMO_FIELDS) == [Change("graph_breaks", 0, 1)]
    assert changes(recorded, now) == [Change("graph_breaks", 0, 1), Change("fx_graph.hits", 0, 4)]


def test_the_failure_message_names_each_change_and_the_reasons_without_the_root() -> None:
    """The first line sums the changes; each is detailed, with Dynamo's reasons and the root taken out of paths."""
    measured = Measured({}, recompile_reasons=("/root/t.py:3: size of x changed",),
                        graph_breaks_at=("/root/t.py:9: print",))
    text = describe([Change("recompiles", 0, 1), Change("graph_breaks", 0, 1)], measured, "e.json", "/root/")
    lines = text.splitlines()
    assert lines[0] == "compile behaviour differs from its record in e.json: recompiles 0 -> 1, graph_breaks 0 -> 1"
    assert lines[1:5] == ["  recompiles: recorded 0, now 1", "    recompile: t.py:3: size of x changed",
                          "  graph_breaks: recorded 0, now 1", "    graph break at t.py:9: print"]
    assert lines[-1] == "if the change is intended, record it with --compile-cache-expect-update"


def test_a_graph_break_without_its_place_gives_the_first_line_of_its_reason() -> None:
    """Where Dynamo did not say where a break was met, the reason's first line stands in."""
    measured = Measured({}, graph_break_reasons=("\n  Unsupported: a hook\n  more detail\n",))
    lines = describe([Change("graph_breaks", 0, 1)], measured, "e.json", "").splitlines()
    assert "    graph break: Unsupported: a hook" in lines and "more detail" not in "\n".join(lines)


def test_a_measurement_records_none_for_what_this_machine_cannot_observe() -> None:
    """Counts of an unobservable layer or Dynamo count are ``None`` in the record; the others are the counts."""
    measured = Measured.from_counts({"fx_graph.hits": 2, "aot_autograd.misses": 1, "dynamo.graphs": 3},
                                    {"aot_autograd": "old torch"}, {"dynamo.recompiles": "not kept"})
    assert measured.record["fx_graph.hits"] == 2 and measured.record["graphs"] == 3
    assert measured.record["recompiles"] is None
    assert [measured.record[f] for f in CACHE_FIELDS if f.startswith("aot_autograd.")] == [None, None, None]
    assert set(measured.record) == set(FIELDS)


def test_a_measurements_reasons_are_sorted() -> None:
    """Reasons are kept sorted, so that two runs of the same test say them in the same order."""
    measured = Measured.from_counts({"dynamo.recompile_reason/b": 1, "dynamo.recompile_reason/a": 2}, {}, {})
    assert measured.recompile_reasons == ("a", "b")
