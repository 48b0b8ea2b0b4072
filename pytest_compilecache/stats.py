"""Per-layer compile-cache statistics (what hit, missed or was bypassed), Dynamo's counts, and how to print them."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

#: The cache layers a user can ask about, in the order they are printed.
LAYERS: tuple[str, ...] = ("fx_graph", "aot_autograd", "cpp", "autotune", "triton", "pgo", "precompile",
                           "remote_fx_graph", "remote_aot_autograd", "remote_autotune")

#: The count kinds every layer has, as named in assertions and reports.
KINDS: tuple[str, ...] = ("hits", "misses", "bypasses")
#: Every count a layer keeps, as its JSON form names them.
LAYER_COUNTS: tuple[str, ...] = (*KINDS, "saved", "from_bundle")

#: The counts of ``stats.dynamo``, as named in ``assert_compiles`` and reports.
DYNAMO_COUNTS: tuple[str, ...] = ("frames", "graphs", "recompiles", "graph_breaks")
#: The reasons ``stats.dynamo`` keeps, each a tuple of texts.
DYNAMO_REASONS: tuple[str, ...] = ("recompile_reasons", "graph_break_reasons", "graph_breaks_at")

#: Prefixes of the flat counts that carry one reason each: ``prefix + reason`` counts that reason.
RECOMPILE_REASON = "dynamo.recompile_reason/"
GRAPH_BREAK_REASON = "dynamo.graph_break_reason/"
#: ``prefix + "file:line: reason"`` counts the graph breaks at that line of the user's code.
GRAPH_BREAK_PLACE = "dynamo.graph_break_place/"
#: ``<layer>`` + these: one count per explained miss (its text), and per kind of difference it names.
EXPLANATION = ".explanation/"
MISS_KIND = ".miss_kind/"


class UnobservableLayerError(LookupError):
    """Raised when a count is read from a layer this torch build or device cannot observe."""


def _plus(a: Any, b: Any) -> Any:
    """Two values of one field summed: counts added, texts joined without repeats, the first reason kept."""
    if isinstance(a, Counter):
        return a + b
    if isinstance(a, dict):
        return {**b, **a}
    if isinstance(a, tuple):
        return tuple(dict.fromkeys(a + b))
    return a or b if isinstance(a, str) else a + b


class _Count:
    """A count read as an attribute: ``stats.hits`` is ``stats.count("hits")``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, stats: Any, owner: type) -> int:
        return int(stats.count(self.name))


@dataclass(frozen=True)
class LayerStats:
    """Counts of one cache layer over a span of time (a test, a session); see docs/fixtures.md. Reading a count of
    a layer this machine cannot observe (``reason`` says why) raises :class:`UnobservableLayerError`."""

    layer: str
    #: ``{kind: count}`` of :data:`LAYER_COUNTS`.
    counts: Counter[str] = field(default_factory=Counter)
    #: Why this machine cannot observe the layer; ``""`` where it can.
    reason: str = ""
    bypass_reasons: tuple[str, ...] = ()
    saved_unobservable: str = ""
    explanations: tuple[str, ...] = ()
    #: ``{kind of difference: misses}`` over the explained misses.
    miss_kinds: Counter[str] = field(default_factory=Counter)
    explained: int = 0

    @property
    def observable(self) -> bool:
        """Whether this machine can observe the layer."""
        return not self.reason

    hits = _Count()  #: Lookups answered from the cache.
    misses = _Count()  #: Lookups that found nothing and compiled.
    bypasses = _Count()  #: Compiles that could not use this cache at all (see ``bypass_reasons``).

    @property
    def saved(self) -> int:
        """Entries written to this layer; raises :class:`UnobservableLayerError` where torch cannot count them."""
        return self._count("saved")

    @property
    def from_bundle(self) -> int:
        """Hits answered by what the bundle (or the warmup) put in the cache."""
        return self.counts["from_bundle"]

    def count(self, kind: str) -> int:
        """The count of ``kind`` ("hits", "misses" or "bypasses")."""
        if kind not in KINDS:
            raise TypeError(f"unknown count kind {kind!r}; expected one of {', '.join(KINDS)}")
        return self._count(kind)

    def _count(self, kind: str) -> int:
        if self.reason:
            raise UnobservableLayerError(f"layer {self.layer!r} cannot be observed here: {self.reason}")
        if kind == "saved" and self.saved_unobservable:
            raise UnobservableLayerError(f"{self.layer}.saved cannot be observed here: {self.saved_unobservable}")
        return self.counts[kind]

    def cell(self, kind: str) -> str:
        """The count as printed in a table, or ``-`` when unobservable."""
        if self.reason or (kind == "saved" and self.saved_unobservable):
            return "-"
        return str(self.counts[kind])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form; unobservable layers carry ``observable: false`` and the reason."""
        if self.reason:
            return {"observable": False, "reason": self.reason}
        out: dict[str, Any] = {kind: self.counts[kind] for kind in LAYER_COUNTS}
        if self.saved_unobservable:
            out.update(saved=None, saved_unobservable=self.saved_unobservable)
        if self.bypass_reasons:
            out["bypass_reasons"] = list(self.bypass_reasons)
        if self.explanations:
            out.update(explanations=list(self.explanations), miss_kinds=dict(_most_first(self.miss_kinds)),
                       explained=self.explained)
        return out

    @classmethod
    def from_dict(cls, layer: str, data: Mapping[str, Any]) -> "LayerStats":
        """The inverse of :meth:`to_dict`."""
        if not data.get("observable", True):
            return cls(layer, reason=str(data.get("reason") or "not observable"))
        return cls(layer, Counter({kind: int(data.get(kind) or 0) for kind in LAYER_COUNTS}),
                   bypass_reasons=tuple(data.get("bypass_reasons", ())),
                   saved_unobservable=str(data.get("saved_unobservable", "")),
                   explanations=tuple(data.get("explanations", ())),
                   miss_kinds=Counter({str(k): int(n) for k, n in dict(data.get("miss_kinds", {})).items()}),
                   explained=int(data.get("explained", 0)))

    def __add__(self, other: "LayerStats") -> "LayerStats":
        if self.reason or other.reason:
            return self if self.reason else other
        return dataclasses.replace(self, **{f.name: _plus(getattr(self, f.name), getattr(other, f.name))
                                            for f in dataclasses.fields(self)})

    def explained_summary(self) -> str:
        """``fx_graph: 3 misses explained: 2 config `x` changed, 1 new code``, or ``""`` when none was."""
        if not self.explained:
            return ""
        kinds = ", ".join(f"{n} {kind}" for kind, n in _most_first(self.miss_kinds))
        return f"{self.layer}: {self.explained} miss{'es' if self.explained > 1 else ''} explained: {kinds}"


def _most_first(counts: Counter[str]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _checked(cell: str, ok: bool, expected: int) -> str:
    """A checked count's cell: ``got (ok)`` or ``got (expected N)``."""
    return f"{cell} (ok)" if ok else f"{cell} (expected {expected})"


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """``rows`` of cells as indented lines, each column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


@dataclass(frozen=True)
class DynamoStats:
    """What Dynamo did over a span of time; reading a count in :attr:`unobservable` raises
    :class:`UnobservableLayerError`."""

    #: ``{kind: count}`` of :data:`DYNAMO_COUNTS`.
    counts: Counter[str] = field(default_factory=Counter)
    recompile_reasons: tuple[str, ...] = ()
    graph_break_reasons: tuple[str, ...] = ()
    #: Where in the user's code each graph break was met, as ``file:line: reason``.
    graph_breaks_at: tuple[str, ...] = ()
    #: ``{count: reason}`` for each count this torch cannot keep.
    unobservable: dict[str, str] = field(default_factory=dict)

    def count(self, kind: str) -> int:
        """The count called ``kind`` (one of :data:`DYNAMO_COUNTS`)."""
        if kind not in DYNAMO_COUNTS:
            raise TypeError(f"unknown Dynamo count {kind!r}; the counts are {', '.join(DYNAMO_COUNTS)}")
        if kind in self.unobservable:
            raise UnobservableLayerError(f"dynamo.{kind} cannot be observed here: {self.unobservable[kind]}")
        return self.counts[kind]

    frames = _Count()  #: Frames Dynamo converted.
    graphs = _Count()  #: Graphs Dynamo compiled (handed to the backend).
    recompiles = _Count()  #: Compiles caused by failed guards of an earlier compile of the same frame.
    graph_breaks = _Count()  #: Graph breaks met while compiling.

    def cell(self, kind: str) -> str:
        """The count as printed in a table, or ``-`` when unobservable."""
        return "-" if kind in self.unobservable else str(self.counts[kind])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form: the counts (``None`` where unobservable), then reasons and unobservable ones if any."""
        out: dict[str, Any] = {k: None if k in self.unobservable else self.counts[k] for k in DYNAMO_COUNTS}
        out.update({name: list(getattr(self, name)) for name in DYNAMO_REASONS if getattr(self, name)})
        if self.unobservable:
            out["unobservable"] = dict(self.unobservable)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DynamoStats":
        """The inverse of :meth:`to_dict`; missing counts are zero."""
        reasons = [tuple(data.get(name, ())) for name in DYNAMO_REASONS]
        return cls(Counter({k: int(data.get(k) or 0) for k in DYNAMO_COUNTS}), reasons[0], reasons[1], reasons[2],
                   dict(data.get("unobservable", {})))

    def __add__(self, other: "DynamoStats") -> "DynamoStats":
        return dataclasses.replace(self, **{f.name: _plus(getattr(self, f.name), getattr(other, f.name))
                                            for f in dataclasses.fields(self)})

    def table(self, expected: Mapping[str, int] | None = None, brief: bool = False) -> str:
        """The counts side by side (checked as ``got (expected N)``), then every reason (``brief``: first lines)."""
        expected = expected or {}
        cells = [_checked(self.cell(k), k not in self.unobservable and self.count(k) == expected[k], expected[k])
                 if k in expected else self.cell(k) for k in DYNAMO_COUNTS]
        lines = _aligned([DYNAMO_COUNTS, cells])
        lines += [f"  {kind} not observable: {why}" for kind, why in self.unobservable.items()]
        lines += [f"  recompile: {r}" for r in self.recompile_reasons]
        lines += [f"  graph break at {place}" for place in self.graph_breaks_at]
        for reason in self.graph_break_reasons:
            text = reason.strip().splitlines() or [""]
            if brief and any(f": {text[0]}" in place for place in self.graph_breaks_at):
                continue  # said with its place above
            lines.append(f"  graph break: {text[0]}")
            if not brief:
                lines.extend(f"  {line}".rstrip() for line in text[1:])
        return "\n".join(lines)


@dataclass(frozen=True)
class CacheStats:
    """The statistics of every layer, as attributes named after the layers."""

    fx_graph: LayerStats = field(default_factory=lambda: LayerStats("fx_graph"))
    aot_autograd: LayerStats = field(default_factory=lambda: LayerStats("aot_autograd"))
    #: Compiled C++ kernels and wrappers (``.so``): a hit loads one that existed, a miss builds it.
    cpp: LayerStats = field(default_factory=lambda: LayerStats("cpp"))
    autotune: LayerStats = field(default_factory=lambda: LayerStats("autotune"))
    triton: LayerStats = field(default_factory=lambda: LayerStats("triton"))
    pgo: LayerStats = field(default_factory=lambda: LayerStats("pgo"))
    precompile: LayerStats = field(default_factory=lambda: LayerStats("precompile"))
    #: torch's remote (Redis) caches, lookups only: ``saved`` counts puts, ``bypasses`` client errors.
    remote_fx_graph: LayerStats = field(default_factory=lambda: LayerStats("remote_fx_graph"))
    remote_aot_autograd: LayerStats = field(default_factory=lambda: LayerStats("remote_aot_autograd"))
    remote_autotune: LayerStats = field(default_factory=lambda: LayerStats("remote_autotune"))
    #: Dynamo's counts; not a cache layer, so not among the layers iterated, tabled or named in ``assert_hits``.
    dynamo: DynamoStats = field(default_factory=DynamoStats)

    @property
    def nothing_happened(self) -> bool:
        """Whether no layer counted anything and Dynamo compiled no frame (a span with no compile)."""
        counted = any(layer.counts[kind] for layer in self if layer.observable for kind in (*KINDS, "saved"))
        return not counted and not self.dynamo.counts["frames"] and not self.dynamo.counts["graphs"]

    def __iter__(self) -> Iterator[LayerStats]:
        return (getattr(self, name) for name in LAYERS)

    def layer(self, name: str) -> LayerStats:
        """The stats of the layer called ``name``; a :class:`TypeError` for an unknown name."""
        check_layer_names([name])
        return getattr(self, name)  # type: ignore[no-any-return]

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """``{layer: LayerStats.to_dict()}`` for every layer, and ``"dynamo": DynamoStats.to_dict()``."""
        return {**{s.layer: s.to_dict() for s in self}, "dynamo": self.dynamo.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> "CacheStats":
        """The inverse of :meth:`to_dict`; missing layers (and missing Dynamo counts) count zero."""
        return cls(**{name: LayerStats.from_dict(name, data.get(name, {})) for name in LAYERS},
                   dynamo=DynamoStats.from_dict(data.get("dynamo") or {}))

    def __add__(self, other: "CacheStats") -> "CacheStats":
        return CacheStats(**{a.layer: a + b for a, b in zip(self, other)}, dynamo=self.dynamo + other.dynamo)

    def table(self, expected: Mapping[str, int] | None = None, kind: str = "", source: str = "bundle") -> str:
        """All layers side by side; ``expected`` marks the checked ``kind`` cells as ``got (expected N)``."""
        expected = expected or {}
        rows = [("layer", *KINDS, "saved", f"from {source}", "")]
        for s in self:
            if s.layer.startswith("remote_") and not s.observable and s.layer not in expected:  # no remote cache
                continue
            cells = [_checked(s.cell(k), s.observable and s.count(k) == expected[s.layer], expected[s.layer])
                     if k == kind and s.layer in expected else s.cell(k) for k in KINDS]
            note = "" if s.observable else f"not observable: {s.reason}"
            rows.append((s.layer, *cells, s.cell("saved"), s.cell("from_bundle"), note))
        reasons = [f"  {s.layer} bypassed: {r}" for s in self if s.observable for r in s.bypass_reasons]
        return "\n".join(_aligned(rows) + reasons)

    def explanations(self, layers: Iterator[str] | list[str] | None = None) -> list[str]:
        """One line per explained miss of the given layers (all by default)."""
        return [f"  {s.layer} miss: {text}" for s in self if layers is None or s.layer in layers
                for text in s.explanations]


def stats_from_counts(counts: Mapping[str, int], unobservable: Mapping[str, str],
                      bypass_reasons: Mapping[str, tuple[str, ...]] | None = None,
                      unobservable_fields: Mapping[str, str] | None = None) -> CacheStats:
    """Build :class:`CacheStats` from flat ``"layer.kind"`` and ``"dynamo.kind"`` counts (``_torchapi.read_counts``)."""
    bypass_reasons, unobservable_fields = bypass_reasons or {}, unobservable_fields or {}
    layers = {}
    for name in LAYERS:
        if name in unobservable:
            layers[name] = LayerStats(name, reason=unobservable[name])
            continue
        own = Counter({kind: counts.get(f"{name}.{kind}", 0) for kind in LAYER_COUNTS})
        own["from_bundle"] = min(own["from_bundle"], own["hits"])
        explained = _counted(counts, name + EXPLANATION)
        layers[name] = LayerStats(name, own, bypass_reasons=tuple(bypass_reasons.get(name, ())),
                                  saved_unobservable=unobservable_fields.get(f"{name}.saved", ""),
                                  explanations=tuple(explained), miss_kinds=_counted(counts, name + MISS_KIND),
                                  explained=sum(explained.values()))
    dynamo = DynamoStats(Counter({kind: counts.get(f"dynamo.{kind}", 0) for kind in DYNAMO_COUNTS}),
                         tuple(_counted(counts, RECOMPILE_REASON)), tuple(_counted(counts, GRAPH_BREAK_REASON)),
                         tuple(_counted(counts, GRAPH_BREAK_PLACE)),
                         unobservable={k.removeprefix("dynamo."): why for k, why in unobservable_fields.items()
                                       if k.startswith("dynamo.") and why})
    return CacheStats(**layers, dynamo=dynamo)


def _counted(counts: Mapping[str, int], prefix: str) -> Counter[str]:
    """``{text: count}`` of the flat counts ``prefix + text`` that are above zero."""
    return Counter({k[len(prefix):]: n for k, n in counts.items() if k.startswith(prefix) and n > 0})


def check_layer_names(names: Iterator[str] | list[str] | Mapping[str, Any]) -> None:
    """Raise :class:`TypeError` naming any entry of ``names`` that is not a layer."""
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        raise TypeError(f"unknown cache layer{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                        f"the layers are {', '.join(LAYERS)}")
