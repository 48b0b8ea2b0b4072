"""One test's compile behaviour, as the expectations file records it, and how two records differ.
Recorded are the counts a test's own code decides (docs/expectations.md says why the others are not)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..stats import DYNAMO_COUNTS, KINDS, stats_from_counts

#: Dynamo's counts: compared on any torch and device.
DYNAMO_FIELDS: tuple[str, ...] = DYNAMO_COUNTS
#: Cache outcomes: compared only with the torch version and device the record was made with.
CACHE_FIELDS: tuple[str, ...] = tuple(f"{layer}.{kind}" for layer in ("fx_graph", "aot_autograd") for kind in KINDS)
#: Every field of a record, in the order the file writes them.
FIELDS: tuple[str, ...] = DYNAMO_FIELDS + CACHE_FIELDS

#: A record: ``{field: count}``, ``None`` for a count this torch cannot keep.
Record = Mapping[str, "int | None"]


@dataclass(frozen=True)
class Measured:
    """What a test did, as measured at the end of its call: its record, and the reasons behind its counts (sorted)."""

    record: dict[str, int | None]
    recompile_reasons: tuple[str, ...] = ()
    graph_break_reasons: tuple[str, ...] = ()
    graph_breaks_at: tuple[str, ...] = ()

    @classmethod
    def from_counts(cls, delta: Mapping[str, int], unobservable_layers: Mapping[str, str],
                    unobservable_fields: Mapping[str, str]) -> "Measured":
        """From flat counts over the test (see ``_torchapi.read_counts``); empty counts: nothing compiled."""
        stats = stats_from_counts(delta, unobservable_layers, unobservable_fields=unobservable_fields)
        dynamo = stats.dynamo
        record: dict[str, int | None] = {k: v for k, v in dynamo.to_dict().items() if k in DYNAMO_FIELDS}
        for name in CACHE_FIELDS:
            layer, kind = name.split(".")
            record[name] = stats.layer(layer).count(kind) if stats.layer(layer).observable else None
        return cls(record, *(tuple(sorted(texts)) for texts in (
            dynamo.recompile_reasons, dynamo.graph_break_reasons, dynamo.graph_breaks_at)))


@dataclass(frozen=True)
class Change:
    """One field whose count differs from its record."""

    field: str
    recorded: int
    now: int


def changes(recorded: Record, now: Record, fields: tuple[str, ...] = FIELDS) -> list[Change]:
    """The ``fields`` whose counts differ; a count unobservable on either side is not compared."""
    pairs = ((name, recorded.get(name), now.get(name)) for name in fields)
    return [Change(name, was, new) for name, was, new in pairs if was is not None and new is not None and was != new]


def describe(changed: list[Change], measured: Measured, path: str, root: str) -> str:
    """The failure message: each changed field, recorded and new, with the reasons behind Dynamo's counts
    (``root`` taken out of the paths in torch's texts)."""
    summary = ", ".join(f"{c.field} {c.recorded} -> {c.now}" for c in changed)
    lines = [f"compile behaviour differs from its record in {path}: {summary}"]
    for change in changed:
        lines.append(f"  {change.field}: recorded {change.recorded}, now {change.now}")
        if change.field == "graph_breaks" and measured.graph_breaks_at:
            lines.extend(f"    graph break at {p.replace(root, '')}" for p in measured.graph_breaks_at)
        elif change.field == "graph_breaks":
            firsts = ((r.strip().splitlines() or [""])[0] for r in measured.graph_break_reasons)
            lines.extend(f"    graph break: {first}" for first in firsts)
        elif change.field == "recompiles":
            lines.extend(f"    recompile: {r.replace(root, '')}" for r in measured.recompile_reasons)
    lines.append("if the change is intended, record it with --compile-cache-expect-update")
    return "\n".join(lines)

