"""A test's figures as ``(name, value)`` pairs for ``report.user_properties``: JUnit XML's ``<property>`` elements
(names stable, documented in ``docs/ci-reports.md``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..stats import CacheStats

PREFIX = "compilecache."
LAYER_COUNTS: tuple[str, ...] = ("hits", "misses", "from_bundle")
DYNAMO_PROPERTIES: tuple[str, ...] = ("graphs", "recompiles", "graph_breaks")


def properties_of(stats: Mapping[str, Any]) -> list[tuple[str, object]]:
    """The properties of one test's counts (its ``REPORT_ATTR`` dict); ``[]`` when it compiled nothing.
    A layer or a Dynamo count this machine cannot observe has no property, rather than a 0."""
    cache = CacheStats.from_dict(stats)
    seconds = float(stats.get("compile_seconds", 0.0))
    if cache.nothing_happened and not seconds:
        return []
    out: list[tuple[str, object]] = [(f"{PREFIX}{layer.layer}.{kind}", int(getattr(layer, kind)))
                                      for layer in cache if layer.observable for kind in LAYER_COUNTS]
    dynamo = cache.dynamo
    out.extend((f"{PREFIX}dynamo.{kind}", dynamo.count(kind)) for kind in DYNAMO_PROPERTIES
               if kind not in dynamo.unobservable)
    out.append((f"{PREFIX}compile_seconds", round(seconds, 3)))
    return out
