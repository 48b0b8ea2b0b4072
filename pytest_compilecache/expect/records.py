"""One test's compile behaviour, as the expectations file records it, and how two records differ.

Recorded are the counts that a test's own code decides, the same on every machine with the same torch:
Dynamo's frames, graphs, recompiles and graph breaks, and the FX graph and AOTAutograd cache outcomes
(hits, misses, bypasses) of a cache that starts empty or from the bundle. :data:`NOT_RECORDED` says why
the other counts are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ..stats import GRAPH_BREAK_PLACE, GRAPH_BREAK_REASON, RECOMPILE_REASON, CacheStats, stats_from_counts

#: Dynamo's counts: compared on any torch and device.
DYNAMO_FIELDS: tuple[str, ...] = ("frames", "graphs", "recompiles", "graph_breaks")
#: Cache outcomes: compared only with the torch version and device the record was made with.
CACHE_FIELDS: tuple[str, ...] = tuple(f"{layer}.{kind}" for layer in ("fx_graph", "aot_autograd")
                                      for kind in ("hits", "misses", "bypasses"))
#: Every field of a record, in the order the file writes them.
FIELDS: tuple[str, ...] = DYNAMO_FIELDS + CACHE_FIELDS

#: What is not recorded, and why: each varies from machine to machine or run to run for the same code.
NOT_RECORDED: dict[str, str] = {
    "cpp": "C++ builds depend on the device (GPU code builds Triton kernels instead) and on the precompiled "
           "headers already on the machine",
    "triton": "Triton kernels exist only on a GPU",
    "autotune": "autotuning runs only on a GPU, and its choices depend on timings",
    "pgo": "PGO's profiles depend on the shapes earlier compiles of the same code met, in other runs too",
    "precompile": "torch's precompile cache is experimental, off by default and absent before torch 2.8",
    "remote caches": "their outcomes depend on what the server holds",
    "saved, from_bundle": "they depend on what the loaded bundle holds and on whether saving is possible",
    "compile_seconds, explanations": "times vary from run to run; explanations name cache keys",
}

#: A record: ``{field: count}``, ``None`` for a count this torch cannot keep.
Record = Mapping[str, "int | None"]


def record_of(stats: CacheStats) -> dict[str, int | None]:
    """The record of a test whose counts are ``stats``."""
    out: dict[str, int | None] = {}
    dynamo = stats.dynamo.to_dict()
    for name in DYNAMO_FIELDS:
        out[name] = dynamo.get(name)
    for name in CACHE_FIELDS:
        layer, kind = name.split(".")
        data = stats.layer(layer).to_dict()
        out[name] = int(data[kind]) if data.get("observable", True) else None
    return out


@dataclass(frozen=True)
class Measured:
    """What a test did, as measured at the end of its call: its record, and the reasons behind its counts.

    ``graph_breaks_at`` are ``file:line: reason`` in the user's code; ``recompile_reasons`` and
    ``graph_break_reasons`` are torch's texts.
    """

    record: dict[str, int | None]
    recompile_reasons: tuple[str, ...] = ()
    graph_break_reasons: tuple[str, ...] = ()
    graph_breaks_at: tuple[str, ...] = ()

    @classmethod
    def from_counts(cls, delta: Mapping[str, int], unobservable_layers: Mapping[str, str],
                    unobservable_fields: Mapping[str, str]) -> "Measured":
        """From flat counts over the test (see ``_torchapi.read_counts``); empty counts: nothing compiled."""
        stats = stats_from_counts(delta, unobservable_layers, unobservable_fields=unobservable_fields)
        return cls(record_of(stats), _texts(delta, RECOMPILE_REASON), _texts(delta, GRAPH_BREAK_REASON),
                   _texts(delta, GRAPH_BREAK_PLACE))


def _texts(counts: Mapping[str, int], prefix: str) -> tuple[str, ...]:
    return tuple(sorted(k[len(prefix):] for k, n in counts.items() if k.startswith(prefix) and n > 0))


@dataclass(frozen=True)
class Change:
    """One field whose count differs from its record."""

    field: str
    recorded: int
    now: int


def changes(recorded: Record, now: Record, fields: tuple[str, ...] = FIELDS) -> list[Change]:
    """The ``fields`` whose counts differ; a count unobservable on either side is not compared."""
    out = []
    for name in fields:
        was, new = recorded.get(name), now.get(name)
        if was is not None and new is not None and was != new:
            out.append(Change(name, int(was), int(new)))
    return out


def describe(changed: list[Change], measured: Measured, path: str, relative: Callable[[str], str]) -> str:
    """The failure message: each changed field, recorded and new, with the reasons behind Dynamo's counts.

    ``relative`` shortens the paths in torch's texts (to the rootdir's)."""
    summary = ", ".join(f"{c.field} {c.recorded} -> {c.now}" for c in changed)
    lines = [f"compile behaviour differs from its record in {path}: {summary}"]
    for change in changed:
        lines.append(f"  {change.field}: recorded {change.recorded}, now {change.now}")
        if change.field == "graph_breaks":
            places = measured.graph_breaks_at or tuple(
                (r.strip().splitlines() or [""])[0] for r in measured.graph_break_reasons)
            lines.extend(f"    graph break at {relative(p)}" if measured.graph_breaks_at else f"    graph break: {p}"
                         for p in places)
        elif change.field == "recompiles":
            lines.extend(f"    recompile: {relative(r)}" for r in measured.recompile_reasons)
    lines.append("if the change is intended, record it with --compile-cache-expect-update")
    return "\n".join(lines)

