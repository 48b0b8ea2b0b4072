"""How things are said in messages: counts (``1 environment``, ``2 environments``), and each kind of
Mega-Cache artifact by the cache layer it fills (``inductor`` artifacts are the ``fx_graph`` layer's entries)."""

from __future__ import annotations

from typing import Iterable

from .stats import LAYERS


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1."""
    return f"{n:,d} {noun}" if n == 1 else f"{n:,d} {noun}s"


def layer_of(kind: str) -> str:
    """The per-layer table's name for the Mega-Cache artifact type ``kind``."""
    return "fx_graph" if kind == "inductor" else kind


def in_layer_order(kinds: Iterable[str]) -> list[str]:
    """Mega-Cache artifact types in the order the per-layer table lists their layers."""
    def place(kind: str) -> tuple[int, str]:
        layer = layer_of(kind)
        return (LAYERS.index(layer) if layer in LAYERS else len(LAYERS), layer)

    return sorted(kinds, key=place)


def artifact_counts(counts: dict[str, int]) -> str:
    """``{artifact type: count}`` as ``2 fx_graph, 1 aot_autograd``, named and ordered as the per-layer table."""
    return ", ".join(f"{counts[kind]} {layer_of(kind)}" for kind in in_layer_order(counts))


def placed_counts(placed: dict[str, int], held: dict[str, int]) -> str:
    """How many of the entry's artifacts torch asked for, as ``1 of 3 fx_graph, 1 of 3 aot_autograd``."""
    return ", ".join(f"{placed.get(kind, 0)} of {held[kind]} {layer_of(kind)}" for kind in in_layer_order(held))
