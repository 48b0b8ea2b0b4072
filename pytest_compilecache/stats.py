"""Per-layer compile-cache statistics: what hit, missed or was bypassed, and how to print it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

#: The cache layers a user can ask about, in the order they are printed.
LAYERS: tuple[str, ...] = ("fx_graph", "aot_autograd", "cpp", "autotune", "triton", "pgo", "precompile")

#: The count kinds every layer has, as named in assertions and reports.
KINDS: tuple[str, ...] = ("hits", "misses", "bypasses")


class UnobservableLayerError(LookupError):
    """Raised when a count is read from a layer this torch build or device cannot observe."""


@dataclass(frozen=True)
class LayerStats:
    """Counts of one cache layer over a span of time (a test, a session).

    ``hits``, ``misses`` and ``bypasses`` are the counts assertions check. ``saved`` counts
    entries written to this layer, ``from_bundle`` counts hits whose files came from a bundle
    rather than a local compile. A layer that cannot be observed here (for example Triton on a
    machine with no GPU) has ``observable == False`` and ``reason`` says why; reading its counts
    raises :class:`UnobservableLayerError` rather than pretending they are zero.
    """

    layer: str
    _hits: int = 0
    _misses: int = 0
    _bypasses: int = 0
    _saved: int = 0
    from_bundle: int = 0
    observable: bool = True
    reason: str = ""
    bypass_reasons: tuple[str, ...] = ()
    saved_unobservable: str = ""

    @property
    def saved(self) -> int:
        """Entries written to this layer; raises :class:`UnobservableLayerError` where torch cannot count them."""
        if self.observable and self.saved_unobservable:
            raise UnobservableLayerError(f"{self.layer}.saved cannot be observed here: {self.saved_unobservable}")
        return self._count("saved")

    def _count(self, kind: str) -> int:
        if not self.observable:
            raise UnobservableLayerError(f"layer {self.layer!r} cannot be observed here: {self.reason}")
        return int(getattr(self, "_" + kind))

    @property
    def hits(self) -> int:
        """Lookups answered from the cache."""
        return self._count("hits")

    @property
    def misses(self) -> int:
        """Lookups that found nothing and compiled."""
        return self._count("misses")

    @property
    def bypasses(self) -> int:
        """Compiles that could not use this cache at all (see ``bypass_reasons``)."""
        return self._count("bypasses")

    def count(self, kind: str) -> int:
        """The count of ``kind`` ("hits", "misses" or "bypasses")."""
        if kind not in KINDS:
            raise TypeError(f"unknown count kind {kind!r}; expected one of {', '.join(KINDS)}")
        return self._count(kind)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form; unobservable layers carry ``observable: false`` and the reason."""
        if not self.observable:
            return {"observable": False, "reason": self.reason}
        out: dict[str, Any] = {
            "hits": self._hits,
            "misses": self._misses,
            "bypasses": self._bypasses,
            "saved": None if self.saved_unobservable else self._saved,
            "from_bundle": self.from_bundle,
        }
        if self.saved_unobservable:
            out["saved_unobservable"] = self.saved_unobservable
        if self.bypass_reasons:
            out["bypass_reasons"] = list(self.bypass_reasons)
        return out

    @classmethod
    def from_dict(cls, layer: str, data: Mapping[str, Any]) -> "LayerStats":
        """The inverse of :meth:`to_dict`."""
        if not data.get("observable", True):
            return cls(layer, observable=False, reason=str(data.get("reason", "")))
        return cls(
            layer,
            int(data.get("hits", 0)),
            int(data.get("misses", 0)),
            int(data.get("bypasses", 0)),
            _saved=int(data.get("saved") or 0),
            from_bundle=int(data.get("from_bundle", 0)),
            bypass_reasons=tuple(data.get("bypass_reasons", ())),
            saved_unobservable=str(data.get("saved_unobservable", "")),
        )

    def __add__(self, other: "LayerStats") -> "LayerStats":
        if not (self.observable and other.observable):
            return self if not self.observable else other
        return LayerStats(
            self.layer,
            self._hits + other._hits,
            self._misses + other._misses,
            self._bypasses + other._bypasses,
            _saved=self._saved + other._saved,
            from_bundle=self.from_bundle + other.from_bundle,
            bypass_reasons=_unique(self.bypass_reasons + other.bypass_reasons),
            saved_unobservable=self.saved_unobservable or other.saved_unobservable,
        )

    def cell(self, kind: str) -> str:
        """The count as printed in a table, or ``-`` when unobservable."""
        if not self.observable or (kind == "saved" and self.saved_unobservable):
            return "-"
        return str(getattr(self, "_" + kind if kind in (*KINDS, "saved") else kind))


def _unique(items: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


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

    def __iter__(self) -> Iterator[LayerStats]:
        return (getattr(self, name) for name in LAYERS)

    def layer(self, name: str) -> LayerStats:
        """The stats of the layer called ``name``; a :class:`TypeError` for an unknown name."""
        check_layer_names([name])
        return getattr(self, name)  # type: ignore[no-any-return]

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """``{layer: LayerStats.to_dict()}`` for every layer."""
        return {s.layer: s.to_dict() for s in self}

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> "CacheStats":
        """The inverse of :meth:`to_dict`; missing layers count zero."""
        return cls(**{name: LayerStats.from_dict(name, data.get(name, {})) for name in LAYERS})

    def __add__(self, other: "CacheStats") -> "CacheStats":
        return CacheStats(**{a.layer: a + b for a, b in zip(self, other)})

    def table(self, expected: Mapping[str, int] | None = None, kind: str = "") -> str:
        """All layers side by side; ``expected`` marks the checked ``kind`` cells as ``got (expected N)``."""
        expected = expected or {}
        rows = [("layer", *KINDS, "saved", "from bundle", "")]
        for s in self:
            cells = []
            for k in KINDS:
                c = s.cell(k)
                if k == kind and s.layer in expected:
                    want = expected[s.layer]
                    ok = s.observable and s.count(k) == want
                    c = f"{c} (ok)" if ok else f"{c} (expected {want})"
                cells.append(c)
            note = "" if s.observable else f"not observable: {s.reason}"
            rows.append((s.layer, *cells, s.cell("saved"), s.cell("from_bundle"), note))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        reasons = [f"  {s.layer} bypassed: {r}" for s in self if s.observable for r in s.bypass_reasons]
        return "\n".join(["  " + line for line in lines] + reasons)


def stats_from_counts(
    counts: Mapping[str, int],
    unobservable: Mapping[str, str],
    bypass_reasons: Mapping[str, tuple[str, ...]] | None = None,
    unobservable_fields: Mapping[str, str] | None = None,
) -> CacheStats:
    """Build :class:`CacheStats` from flat ``"layer.kind"`` counts (see ``_torchapi.LAYER_KEYS``)."""
    bypass_reasons = bypass_reasons or {}
    layers = {}
    for name in LAYERS:
        if name in unobservable:
            layers[name] = LayerStats(name, observable=False, reason=unobservable[name])
            continue
        layers[name] = LayerStats(
            name,
            counts.get(f"{name}.hits", 0),
            counts.get(f"{name}.misses", 0),
            counts.get(f"{name}.bypasses", 0),
            _saved=counts.get(f"{name}.saved", 0),
            from_bundle=counts.get(f"{name}.from_bundle", 0),
            bypass_reasons=tuple(bypass_reasons.get(name, ())),
            saved_unobservable=(unobservable_fields or {}).get(f"{name}.saved", ""),
        )
    return CacheStats(**layers)


def check_layer_names(names: Iterator[str] | list[str] | Mapping[str, Any]) -> None:
    """Raise :class:`TypeError` naming any entry of ``names`` that is not a layer."""
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        raise TypeError(
            f"unknown cache layer{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"the layers are {', '.join(LAYERS)}"
        )
