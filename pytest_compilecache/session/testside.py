"""What a process that runs tests does: its environment, the caches of the fixtures, per-test counts."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from .. import _torchapi, misses
from ..cache import CacheKind, CompileCache
from ..environment import SavedEnv, point_cache_dirs_at
from ..report.model import REPORT_ATTR
from ..report.properties import properties_of
from ..storage.interface import BundleStore
from . import remote
from .channel import BundleAtStart
from .counting import TestCounts
from .folders import Folders, WorkerDir
from .options import Isolation, Options
from .preparation import BundlePreparation
from .progress import Progress

_FAILED = pytest.StashKey[bool]()
#: The marker that lets a test's warm_cache use torch's remote cache.
REMOTE_MARKER = "compile_cache_remote"


class TestSide:
    """What a process that runs tests does: caches for fixtures, the bundle, per-test counts."""

    def __init__(self, config: pytest.Config, options: Options, folders: Folders, process: str,
                 run: float, store: BundleStore | None, at_start: Callable[[], BundleAtStart],
                 progress: Progress | None = None, tell: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.options = options
        self.folders = folders
        self.process = process
        self._saved_env: SavedEnv | None = None
        self._worker_dir: WorkerDir | None = None
        self.counts = TestCounts(options)
        self._explaining = contextlib.ExitStack()
        self._remote_before: dict[str, str | None] | None = None
        #: The bundle this process's ``warm_cache`` tests start from.
        self.bundle = BundlePreparation(config, options, folders, process, run, store,
                                        lambda: self.session_cache if self._saved_env is not None else None,
                                        at_start, progress or Progress(None), tell)

    # --- the process's environment ---

    def configure(self, saved: SavedEnv | None) -> None:
        """Point compiles outside fixtures at a folder of this process's own, before collection.

        ``saved`` is the environment from before the first conftest was loaded, if it was taken.
        With ``--compile-cache-explain``, misses are explained in every test from now on.
        """
        if self.options.explain:
            self._explaining.enter_context(misses.explaining())
        if self.options.remote is not None:
            self._remote_before = remote.switch_on(self.options.remote)
            if _torchapi.inductor_config_loaded():
                _torchapi.remote_caches_on()
        if not self.options.session_wide:
            return
        self._saved_env = saved or SavedEnv()
        point_cache_dirs_at(str(self.session_cache))

    @property
    def session_cache(self) -> Path:
        """The cache of compiles outside fixtures: per worker and kept, or per process."""
        if self.options.isolation is Isolation.WORKER:
            if self._worker_dir is None:
                self._worker_dir = WorkerDir(self.options.home, self.process)
            return self._worker_dir.path
        return self.folders.session_cache

    def close(self) -> None:
        """Restore the environment and let go of the worker folder."""
        self._explaining.close()
        self.bundle.close()
        if self._remote_before is not None:
            remote.restore(self._remote_before)
            self._remote_before = None
        if self._saved_env is not None:
            self._saved_env.restore()
            self._saved_env = None
        if self._worker_dir is not None:
            self._worker_dir.release()
            self._worker_dir = None

    # --- caches for tests ---

    def _new_cache(self, nodeid: str, kind: CacheKind, remote: bool = False,
                   template: Path | None = None) -> CompileCache:
        return CompileCache(self.folders.for_test(nodeid), self.folders.process, self.options.headers_dir,
                            kind, explain=self.options.explain, remote=remote, template=template)

    def isolate(self, request: pytest.FixtureRequest) -> Iterator[CompileCache | None]:
        """The body of per-test isolation: an isolated cache, or ``None`` for a test that starts before
        torch is imported (see :meth:`_isolated_before_torch`)."""
        if "torch" not in sys.modules and self.options.remote is None:
            yield from self._isolated_before_torch(request)
        else:
            yield from self.open_cache(request, CacheKind.ISOLATED)

    def open_cache(self, request: pytest.FixtureRequest, kind: CacheKind) -> Iterator[CompileCache]:
        """The body of the ``cold_cache`` / ``warm_cache`` fixtures (and of per-test isolation)."""
        remote = request.node.get_closest_marker(REMOTE_MARKER) is not None and kind is CacheKind.WARM
        if request.node.get_closest_marker(REMOTE_MARKER) is not None and "cold_cache" in request.fixturenames:
            pytest.fail(f"@pytest.mark.{REMOTE_MARKER}: cold_cache never reads the remote cache (it would not be "
                        "cold); use warm_cache", pytrace=False)
        unavailable: str | None = None
        try:
            template = None
            if kind is CacheKind.WARM:
                template = self.bundle.template()
                if template is None:
                    pytest.skip(self.bundle.why_unusable())
            cache = self._new_cache(request.node.nodeid, kind, remote=remote, template=template)
            if template is not None:
                _torchapi.fill_warm_folder(template, cache.path)
            made = time.time()
            cache.__enter__()
        except _torchapi.TorchUnavailable as exc:
            unavailable = str(exc)
        if unavailable is not None:  # failed outside the handler, so that the message is not shown twice, chained
            pytest.fail(unavailable, pytrace=False)
        try:
            if kind is CacheKind.COLD:
                with _torchapi.fresh_recording():  # never reused: kept out of the bundle
                    yield cache
            else:
                yield cache
        finally:
            cache.__exit__(None, None, None)
            if kind is not CacheKind.COLD:
                self.bundle.harvest(cache.path, since=made)
            if not self._keep(request.node):
                self.folders.discard(cache.path)
            elif template is not None:
                _torchapi.complete_warm_folder(template, cache.path)  # kept to be looked at: the whole bundle

    def _isolated_before_torch(self, request: pytest.FixtureRequest) -> Iterator[None]:
        """Per-test isolation of a test that starts before torch is imported: nothing is in memory to
        reset, so only its cache folders are its own (torch reads them when it compiles); a torch the
        test imported is reset after it, as every isolated test's is."""
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
                self.folders.discard(folder)

    def _keep(self, item: pytest.Item) -> bool:
        """Keep a failed test's folder for inspection (unless ``tmp_path_retention_policy = none``)."""
        policy = "failed"
        try:
            policy = str(self.config.getini("tmp_path_retention_policy"))
        except ValueError:
            pass
        return policy != "none" and item.stash.get(_FAILED, False)

    # --- hooks shared by the roles that run tests (registered through those roles) ---

    def runtest_setup(self, item: pytest.Item) -> None:
        if "torch" in sys.modules and self.counts.counted(item):
            # Counting what torch does not count (C++ loads, FX graph saves) needs hooks in its compiler,
            # put in when it is imported: here, for tests that compile without a fixture.
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
