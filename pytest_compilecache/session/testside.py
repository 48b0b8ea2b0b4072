"""What a process that runs tests does: its environment, the caches of the fixtures, per-test counts."""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from typing import Any, Callable, Iterator

import pytest

from .. import _torchapi, files, misses
from .._torchapi import defaultdir
from ..cache import CacheKind, CompileCache, not_saved_misses
from ..environment import SavedEnv, point_cache_dirs_at
from ..report.model import REPORT_ATTR
from ..report.properties import properties_of
from ..stats import stats_from_counts
from ..storage.interface import BundleStore
from . import remote
from ..channel import BundleAtStart
from .folders import Folders, WorkerDir
from .options import Isolation, Options
from .preparation import BundlePreparation

_FAILED = pytest.StashKey[bool]()
#: The marker that lets a test's warm_cache use torch's remote cache.
REMOTE_MARKER = "compile_cache_remote"


class TestSide:
    """What a process that runs tests does: caches for fixtures, the bundle, per-test counts."""

    def __init__(self, config: pytest.Config, options: Options, folders: Folders, process: str,
                 run: float, store: BundleStore | None, at_start: Callable[[], BundleAtStart],
                 tell: Callable[[str], None] | None = None) -> None:
        self.config, self.options, self.folders, self.process = config, options, folders, process
        self.counts = TestCounts(options)
        #: What :meth:`close` undoes: the environment, explaining, the worker folder's lock, the bundle's placing.
        self._undo = contextlib.ExitStack()
        #: The bundle this process's ``warm_cache`` tests start from.
        self.bundle = BundlePreparation(config, options, folders, process, run, store, at_start, self._undo,
                                        tell)

    def configure(self) -> None:
        """Before collection: point compiles outside fixtures at a folder of this process's own, turn the remote
        cache and explaining on."""
        if self.options.explain:
            self._undo.enter_context(misses.explaining())
        if self.options.remote is not None:
            self._undo.callback(remote.switch_on(self.options.remote).restore)
            if _torchapi.inductor_config_loaded():
                self._undo.enter_context(_torchapi.remote_caches(True))
        if self.options.session_wide:
            self._undo.callback(SavedEnv().restore)
            kept = WorkerDir(self.options.home, self.process) if self.options.isolation is Isolation.WORKER else None
            if kept is not None:
                self._undo.callback(kept.release)
            self.bundle.session_cache = kept.path if kept is not None else self.folders.session_cache
            point_cache_dirs_at(str(self.bundle.session_cache))
            before = defaultdir.send_to(lambda: str(self.folders.process), str(self.options.headers_dir))
            self._undo.callback(defaultdir.send_to, *before)

    def close(self) -> None:
        """Restore the environment, let go of the worker folder and remove this process's folders."""
        self._undo.close()
        self.folders.remove(keep_root=True)

    def isolate(self, request: pytest.FixtureRequest) -> Iterator[CompileCache | None]:
        """The body of per-test isolation: an isolated cache, or ``None`` for a test starting before torch's import."""
        if "torch" not in sys.modules and self.options.remote is None:
            yield from self._isolated_before_torch(request)
        else:
            yield from self.open_cache(request, CacheKind.ISOLATED)

    def open_cache(self, request: pytest.FixtureRequest, kind: CacheKind) -> Iterator[CompileCache]:
        """The body of the ``cold_cache`` / ``warm_cache`` fixtures (and of per-test isolation)."""
        marked = request.node.get_closest_marker(REMOTE_MARKER) is not None
        if marked and "cold_cache" in request.fixturenames:
            pytest.fail(f"@pytest.mark.{REMOTE_MARKER}: cold_cache never reads the remote cache (it would not be "
                        "cold); use warm_cache", pytrace=False)
        try:
            template = self.bundle.template() if kind is CacheKind.WARM else None
            if kind is CacheKind.WARM and template is None:
                pytest.skip(self.bundle.why_unusable())
            cache = CompileCache(self.folders.for_test(request.node.nodeid), self.folders.process,
                                 self.options.headers_dir, kind, explain=self.options.explain,
                                 remote=marked and kind is CacheKind.WARM, template=template,
                                 strict=self.options.strict)
            if template is not None:
                _torchapi.fill_warm_folder(template, cache.path)
            made = time.time()
            cache.__enter__()
        except _torchapi.TorchUnavailable as exc:  # said once, not chained to the error it stands for
            raise pytest.fail.Exception(str(exc), pytrace=False) from None
        try:  # a cold cache is never reused: what it compiles is kept out of the bundle
            with _torchapi.fresh_recording() if kind is CacheKind.COLD else contextlib.nullcontext():
                yield cache
        finally:
            cache.__exit__(None, None, None)
            if kind is not CacheKind.COLD:
                self.bundle.harvest(cache.path, since=made, leaving_out=cache.not_saved_binaries)
            if not self._keep(request.node):
                shutil.rmtree(cache.path, ignore_errors=True)
            elif template is not None:
                files.link_tree(template, cache.path)  # kept to be looked at: what the template holds

    def _isolated_before_torch(self, request: pytest.FixtureRequest) -> Iterator[None]:
        """Per-test isolation before torch is imported: only the cache folders are the test's own (nothing to reset)."""
        folder = self.folders.for_test(request.node.nodeid)
        saved = SavedEnv()
        point_cache_dirs_at(str(folder))
        try:
            yield None
        finally:
            saved.restore()
            if _torchapi.compiler_loaded():
                _torchapi.reset_in_memory()
                self.bundle.harvest(folder)
            if not self._keep(request.node):
                shutil.rmtree(folder, ignore_errors=True)

    def _keep(self, item: pytest.Item) -> bool:
        """Keep a failed test's folder for inspection (unless ``tmp_path_retention_policy = none``)."""
        with contextlib.suppress(ValueError):  # an ini value of pytest's tmpdir plugin (absent with -p no:tmpdir)
            if self.config.getini("tmp_path_retention_policy") == "none":
                return False
        return item.stash.get(_FAILED, False)

    def runtest_setup(self, item: pytest.Item) -> None:
        if "torch" in sys.modules and self.counts.counted(item):
            # Counting what torch does not (C++ loads, FX graph saves) needs hooks in its compiler, put in here.
            _torchapi.bootstrap(str(self.folders.process))
        self.counts.started(item)

    def makereport(self, item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
        if report.failed:
            item.stash[_FAILED] = True
        if call.when == "teardown":
            stats = self.counts.finished(item)
            if stats is not None:
                setattr(report, REPORT_ATTR, stats)
                report.user_properties.extend(properties_of(stats))


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
        start = self._start.pop(item.nodeid, None)
        if start is None or not _torchapi.compiler_loaded():
            return None
        delta = {k: v - start[0].get(k, 0) for k, v in _torchapi.read_counts().items()}
        result: dict[str, Any] = stats_from_counts(delta, _torchapi.unobservable_layers(),
                                                   unobservable_fields=_torchapi.unobservable_fields()).to_dict()
        result["compile_seconds"] = round(_torchapi.compile_seconds() - start[1], 4)
        if start[1] == 0.0 and result["compile_seconds"] > 0:
            result["first_in_process"] = True
        names = getattr(item, "fixturenames", ())
        result["cache"] = (CacheKind.WARM.value if "warm_cache" in names
                           else CacheKind.COLD.value if "cold_cache" in names
                           else CacheKind.ISOLATED.value if self.options.isolation is Isolation.TEST else None)
        left_out = {layer: max(0, n - start[2].get(layer, 0)) for layer, n in not_saved_misses().items()}
        if any(left_out.values()):
            result["misses_not_saved"] = {layer: n for layer, n in left_out.items() if n}
        if damaged := dict(misses.ran_without_damaged()[start[3]:]):
            result["ran_without_damaged"] = damaged
        return result
