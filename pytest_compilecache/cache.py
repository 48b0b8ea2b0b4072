"""The CompileCache a test gets: its own cache directories, clean in-memory state, and statistics."""

from __future__ import annotations

import contextlib
import enum
from pathlib import Path
from typing import Iterator, Mapping

import pytest

from . import _torchapi, misses
from ._torchapi import layout
from .environment import SavedEnv, caches_disabled_by_env, point_cache_dirs_at
from .stats import DYNAMO_COUNTS, CacheStats, check_layer_names, stats_from_counts


class CacheKind(enum.Enum):
    """What a :class:`CompileCache` starts with, and whether its compiles go into the session's bundle."""

    #: ``cold_cache``: empty; its compiles are never saved (an empty cache is never looked up in a bundle).
    COLD = "cold"
    #: ``warm_cache``: filled from the session's bundle.
    WARM = "warm"
    #: ``--compile-cache-isolate``: empty, around a test that asked for no fixture; its compiles are saved.
    ISOLATED = "isolated"
    #: The ``pytest_compilecache_warmup`` hook's cache.
    WARMUP = "warmup"

    @property
    def starts_empty(self) -> bool:
        """Whether a miss in this cache is a miss by design."""
        return self in (CacheKind.COLD, CacheKind.ISOLATED)


_not_saved_misses: dict[str, int] = {}
_not_saved_depth = 0


def not_saved_misses() -> dict[str, int]:
    """Misses inside :meth:`CompileCache.not_saved` blocks so far in this process, by layer: misses by design."""
    return dict(_not_saved_misses)


class CompileCache:
    """Isolated torch.compile caches at :attr:`path` while active (in-memory ones reset on entry and exit, remote ones
    off unless ``remote``); :attr:`stats` count from entry; a ``template``'s entries are linked in as torch asks."""

    def __init__(self, path: Path, process_dir: Path, headers_dir: Path, kind: CacheKind = CacheKind.COLD,
                 explain: bool = False, remote: bool = False, template: Path | None = None, strict: bool = False) -> None:
        self.path, self.kind, self.remote, self.strict = Path(path), kind, remote, strict
        self.explain = explain or kind is CacheKind.WARM
        self._process_dir, self._headers_dir, self._template = process_dir, headers_dir, template
        self._stack: contextlib.ExitStack | None = None
        self._start: dict[str, int] = {}
        self._damaged_from = 0
        self._bypass: _torchapi.record_bypass_reasons | None = None
        self._final: CacheStats | None = None
        #: The binaries (paths in :attr:`path`) built inside :meth:`not_saved` blocks: kept out of the bundle too.
        self.not_saved_binaries: set[str] = set()

    def __repr__(self) -> str:
        return f"<CompileCache {self.kind.value} {str(self.path)!r}>"

    def __enter__(self) -> "CompileCache":
        _torchapi.bootstrap(str(self._process_dir))
        with contextlib.ExitStack() as stack:
            stack.callback(SavedEnv().restore)
            self.path.mkdir(parents=True, exist_ok=True)
            point_cache_dirs_at(str(self.path))
            stack.enter_context(_torchapi.redirect(str(self._process_dir)))
            stack.enter_context(_torchapi.headers_at(str(self._headers_dir)))
            if not self.remote:
                stack.enter_context(_torchapi.remote_caches(False))
            stack.callback(_torchapi.reset_in_memory)
            _torchapi.reset_in_memory()
            self._bypass = stack.enter_context(_torchapi.record_bypass_reasons())
            if self.explain:
                stack.enter_context(misses.explaining())
            if self.kind.starts_empty:
                stack.enter_context(_torchapi.empty_folder())
            stack.enter_context(_torchapi.cpu_probes_in(str(self._headers_dir / "cpu-probes"),
                                                        here=self.kind.starts_empty))
            if self._template is not None:
                stack.enter_context(_torchapi.placing_from(str(self._template), str(self.path)))
            self.restart_counting()
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stack is None:
            return
        try:
            self._final = self.stats
        finally:
            stack, self._stack = self._stack, None
            stack.close()

    def link_whole_bundle(self) -> None:
        """Link the whole bundle into :attr:`path` now, for processes the test starts (this one links on demand)."""
        if self._template is not None and self._stack is not None:
            _torchapi.link_whole()

    def restart_counting(self) -> None:
        """Count from now on; what happened before (a bundle being loaded, say) no longer counts."""
        self._start = _torchapi.read_counts()
        self._damaged_from = len(misses.ran_without_damaged())
        if self._bypass is not None:
            self._bypass.reasons.clear()

    @contextlib.contextmanager
    def not_saved(self) -> Iterator[None]:
        """Compiles inside are left out of the session's bundle (a variant compiled on purpose, to show a miss)."""
        if not _torchapi.can_leave_out():
            pytest.skip("not_saved() needs a torch whose Mega-Cache can record apart (with_fresh_cache)")
        global _not_saved_depth
        with _torchapi.fresh_recording():
            before, binaries = _torchapi.read_counts(), set(layout.find_binaries(self.path))
            _not_saved_depth += 1
            try:
                yield
            finally:
                self.not_saved_binaries.update(set(layout.find_binaries(self.path)) - binaries)
                _not_saved_depth -= 1
                if _not_saved_depth == 0:  # a block inside another is counted by the outer one
                    after = _torchapi.read_counts()
                    for layer in ("fx_graph", "aot_autograd"):
                        missed = after.get(f"{layer}.misses", 0) - before.get(f"{layer}.misses", 0)
                        _not_saved_misses[layer] = _not_saved_misses.get(layer, 0) + max(0, missed)

    def reset_in_memory(self) -> None:
        """Forget every compiled result held in memory: the next compile consults this test's on-disk caches."""
        _torchapi.reset_in_memory()

    @property
    def stats(self) -> CacheStats:
        """Per-layer counts since this cache became active (frozen once it is no longer active)."""
        if self._final is not None:
            return self._final
        now = _torchapi.read_counts()
        delta = {key: now[key] - self._start.get(key, 0) for key in now}
        reasons = self._bypass.snapshot() if self._bypass is not None else {}
        return stats_from_counts(delta, _torchapi.unobservable_layers(), reasons, _torchapi.unobservable_fields())

    def assert_hits(self, **expected: int) -> None:
        """Check the exact hit count of each named layer, e.g. ``assert_hits(fx_graph=1, aot_autograd=1)``."""
        __tracebackhide__ = True
        self._assert("hits", expected)

    def assert_misses(self, **expected: int) -> None:
        """Check the exact miss count of each named layer."""
        __tracebackhide__ = True
        self._assert("misses", expected)

    def assert_bypasses(self, **expected: int) -> None:
        """Check the exact bypass count of each named layer."""
        __tracebackhide__ = True
        self._assert("bypasses", expected)

    def _assert(self, kind: str, expected: Mapping[str, int]) -> None:
        __tracebackhide__ = True
        if not expected:
            raise TypeError(f"assert_{kind}() needs at least one layer=count argument")
        check_layer_names(expected)
        _check_counts(f"assert_{kind}", expected)
        stats = self.stats
        wrong, off_by = [], []
        for layer, want in expected.items():
            got = stats.layer(layer)
            if not got.observable:
                wrong.append(f"{layer} cannot be observed here ({got.reason})")
                off_by.append(-1)
            elif got.count(kind) != want:
                wrong.append(f"{layer} expected {want}, got {got.count(kind)}")
                off_by.append({"misses": got.count(kind) - want, "hits": want - got.count(kind)}.get(kind, -1))
        if wrong:
            lines = [f"compile cache {kind} differ: " + "; ".join(wrong), stats.table(expected, kind),
                     *stats.explanations(list(expected))]
            if disabled := caches_disabled_by_env() or _torchapi.caches_disabled_by_config():
                lines += ["  note: cache assertions are meaningless here:", *(f"    {line}" for line in disabled)]
            message = "\n".join(lines)
            ran_without = misses.ran_without_damaged()[self._damaged_from:]
            if damaged := dict(ran_without):
                why = "ran without what a damaged bundle held for it: " + "; ".join(damaged.values())
                # Skipped only where every count that is off is off the way a damaged entry makes it (more misses,
                # fewer hits; a recompile may miss more than once): a failure of another kind still fails.
                explained = all(n > 0 for n in off_by)
                if explained and not self.strict:  # a bundle problem never turns a run red where not strict
                    pytest.skip(f"warm_cache {why} (the problem is in the compilecache summary; "
                                "--compile-cache-strict fails the test instead)")
                message += f"\n  this test {why}"
            raise AssertionError(message)

    def assert_compiles(self, *, frames: int | None = None, graphs: int | None = None,
                        recompiles: int | None = None, graph_breaks: int | None = None) -> None:
        """Check Dynamo's exact counts, e.g. ``assert_compiles(graphs=1, recompiles=0)``; others are not checked."""
        __tracebackhide__ = True
        given = {"frames": frames, "graphs": graphs, "recompiles": recompiles, "graph_breaks": graph_breaks}
        expected = {kind: want for kind, want in given.items() if want is not None}
        if not expected:
            raise TypeError(f"assert_compiles() needs at least one of {', '.join(f'{k}=' for k in DYNAMO_COUNTS)}")
        _check_counts("assert_compiles", expected)
        dynamo = self.stats.dynamo
        wrong = []
        for kind, want in expected.items():
            if why := dynamo.unobservable.get(kind):
                wrong.append(f"{kind} cannot be observed here ({why})")
            elif dynamo.count(kind) != want:
                wrong.append(f"{kind} expected {want}, got {dynamo.count(kind)}")
        if wrong:
            raise AssertionError("\n".join(["Dynamo compile counts differ: " + "; ".join(wrong),
                                             dynamo.table(expected)]))


def _check_counts(call: str, expected: Mapping[str, int]) -> None:
    for name, want in expected.items():
        if isinstance(want, bool) or not isinstance(want, int) or want < 0:
            raise TypeError(f"{call}({name}=...) needs a non-negative int, got {want!r}")
