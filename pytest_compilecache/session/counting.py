"""Per-test compile counts: a reading of torch's counters at setup, the difference at teardown."""

from __future__ import annotations

from typing import Any

import pytest

from .. import _torchapi, misses
from ..cache import CacheKind, not_saved_misses
from ..stats import stats_from_counts
from .options import Isolation, Options


class TestCounts:
    """Counts every test when anything session-wide is on, else the tests that use a fixture."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, options: Options) -> None:
        self.options = options
        self._start: dict[str, tuple[dict[str, int], float, dict[str, int], int]] = {}

    def counted(self, item: pytest.Item) -> bool:
        """Whether ``item``'s compile counts are recorded."""
        names = getattr(item, "fixturenames", ())
        return self.options.active or "cold_cache" in names or "warm_cache" in names

    def started(self, item: pytest.Item) -> None:
        """Take the counters' starting point for ``item`` (if it is counted)."""
        if self.counted(item):
            self._start[item.nodeid] = (_torchapi.read_counts() if _torchapi.compiler_loaded() else {},
                                        _torchapi.compile_seconds(), not_saved_misses(),
                                        len(misses.ran_without_damaged()))

    def finished(self, item: pytest.Item) -> dict[str, Any] | None:
        """``item``'s per-layer counts, compile seconds and cache kind, or ``None`` (not counted, nothing compiled)."""
        delta = self.so_far(item)
        start = self._start.pop(item.nodeid, None)
        if start is None or delta is None:
            return None
        result: dict[str, Any] = stats_from_counts(delta, _torchapi.unobservable_layers(),
                                                   unobservable_fields=_torchapi.unobservable_fields()).to_dict()
        result["compile_seconds"] = round(_torchapi.compile_seconds() - start[1], 4)
        if start[1] == 0.0 and result["compile_seconds"] > 0:
            result["first_in_process"] = True
        result["cache"] = self.cache_kind(item)
        left_out = {layer: max(0, n - start[2].get(layer, 0)) for layer, n in not_saved_misses().items()}
        if any(left_out.values()):
            result["misses_not_saved"] = {layer: n for layer, n in left_out.items() if n}
        if damaged := dict(misses.ran_without_damaged()[start[3]:]):
            result["ran_without_damaged"] = damaged
        return result

    def so_far(self, item: pytest.Item) -> dict[str, int] | None:
        """``item``'s flat counts from its start until now, or ``None`` (not counted, or nothing compiled)."""
        start = self._start.get(item.nodeid)
        if start is None or not _torchapi.compiler_loaded():
            return None
        return {k: v - start[0].get(k, 0) for k, v in _torchapi.read_counts().items()}

    def cache_kind(self, item: pytest.Item) -> str | None:
        """The cache the test ran in (a :class:`CacheKind` value), or ``None``: a cache shared with other tests."""
        names = getattr(item, "fixturenames", ())
        for fixture, kind in (("warm_cache", CacheKind.WARM), ("cold_cache", CacheKind.COLD)):
            if fixture in names:
                return kind.value
        return CacheKind.ISOLATED.value if self.options.isolation is Isolation.TEST else None
