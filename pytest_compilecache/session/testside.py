"""What a process that runs tests does: caches for the fixtures, the bundle's preparation, per-test counts."""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Iterator

import pytest

from .. import _torchapi, files
from ..bundle.binaries import BinaryPool, drop_from
from ..bundle.format import Unreadable
from ..bundle.keyindex import KeyIndex
from ..cache import CacheKind, CompileCache
from ..environment import SavedEnv, point_cache_dirs_at
from ..report.model import REPORT_ATTR, ProcessReport
from ..report.properties import properties_of
from ..storage.interface import BundleStore
from ..storage.local import LocalStore
from . import remote
from .counting import TestCounts
from .folders import Folders, WorkerDir
from .options import Isolation, Options
from .progress import Progress
from .warmup import Preparer, WarmupFailed

_FAILED = pytest.StashKey[bool]()
#: The marker that lets a test's warm_cache use torch's remote cache.
REMOTE_MARKER = "compile_cache_remote"


def _from_hook(exc: BaseException, hook: Any) -> Any:
    """The traceback from the first frame inside a hook implementation (not pytest's or pluggy's)."""
    codes = {impl.function.__code__ for impl in hook.get_hookimpls()}
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code not in codes:
        tb = tb.tb_next
    return tb or exc.__traceback__


class TestSide:
    """What a process that runs tests does: caches for fixtures, the bundle, per-test counts."""

    def __init__(self, config: pytest.Config, options: Options, folders: Folders, process: str,
                 run: float, store: BundleStore | None) -> None:
        self.config = config
        self.options = options
        self.folders = folders
        self.store = store
        self.process = process
        self.run = run
        self.bundle_existed = False
        #: Why the bundle could not be read at session start ("" when it could, or is missing).
        self.bundle_problem = ""
        self._saved_env: SavedEnv | None = None
        self._worker_dir: WorkerDir | None = None
        self._preparer: Preparer | None = None
        self._prepared: bool | None = None
        self._pool: BinaryPool | None = None
        self._dropped: set[str] = set()
        self._started = time.time()
        self.counts = TestCounts(options)
        self._explaining = contextlib.ExitStack()
        self._remote_before: dict[str, str | None] | None = None
        #: The display of long work (the bundle's download, the warmup); the role that owns the terminal sets it.
        self.progress = Progress(None)

    # --- the process's environment ---

    def configure(self, saved: SavedEnv | None) -> None:
        """Point compiles outside fixtures at a folder of this process's own, before collection.

        ``saved`` is the environment from before the first conftest was loaded, if it was taken.
        With ``--compile-cache-explain``, misses are explained in every test from now on.
        """
        if self.options.explain:
            self._explaining.enter_context(_torchapi.explaining())
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
        if self._remote_before is not None:
            remote.restore(self._remote_before)
            self._remote_before = None
        if self._saved_env is not None:
            self._saved_env.restore()
            self._saved_env = None
        if self._worker_dir is not None:
            self._worker_dir.release()
            self._worker_dir = None

    # --- the bundle ---

    @property
    def process_report(self) -> ProcessReport:
        """What bundle preparation did in this process."""
        return self._preparer.report if self._preparer is not None else ProcessReport(process=self.process)

    def _needed(self, items: list[pytest.Item]) -> bool:
        if any("warm_cache" in getattr(item, "fixturenames", ()) for item in items):
            return True
        return self.options.has_bundle and "torch" in sys.modules

    def prepare_for(self, session: pytest.Session) -> str | None:
        """Before the first test: load or build the bundle if a selected test may use it.

        Returns the strict-mode failure to stop on, or ``None``.
        """
        if self._prepared is not None or not session.items or self.config.option.collectonly:
            return None
        if session.testsfailed and not self.config.option.continue_on_collection_errors:
            return None
        if not self._needed(session.items):
            return None
        try:
            with self.progress.showing():
                self.prepare()
        except _torchapi.TorchUnavailable as exc:
            self._failed_to_prepare(f"--compile-cache-bundle: {exc}")
        except Warning as exc:  # a warning filter set to "error" (-W error, filterwarnings = error)
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self._failed_to_prepare(
                f"--compile-cache-bundle: preparing the bundle stopped on a warning that this run's warning "
                f"filters turn into an error: {type(exc).__name__}: {exc} ({where.filename}:{where.lineno}); "
                f"no bundle is used (ignore it by its category and module in filterwarnings to prepare one)"
            )
        problems = self.process_report.problems
        if self.options.strict and problems:
            return "--compile-cache-strict: bundle problem at session start:\n  " + "\n  ".join(problems)
        return None

    def _failed_to_prepare(self, problem: str) -> None:
        if self._preparer is None:
            self._preparer = self._make_preparer(None)
        self._preparer.report.problems.append(problem)

    @property
    def writes_bundle(self) -> bool:
        """Whether this session writes PATH at its end (so its artifacts and binaries are worth saving)."""
        if not self.options.has_bundle:
            return False
        if self.unreadable and not (self.options.rebuild and self.process_report.bundle_unreadable_kind
                                    in (None, Unreadable.DAMAGED)):
            return False
        return self.options.update or not self.bundle_existed

    @property
    def unreadable(self) -> str:
        """Why the bundle could not be read, at session start or while preparing; "" when it could."""
        return self.bundle_problem or self.process_report.bundle_unreadable

    def _make_preparer(self, hook: Any) -> Preparer:
        source = self.store
        own = LocalStore(self.folders.shared / "session.bundle", self.options.lock_timeout)
        return Preparer(
            source=source,
            publish=source if self.writes_bundle and source is not None else own,
            fallback=own,
            update=self.options.update,
            template=self.folders.template,
            marker=self.folders.shared / "warmup-done",
            run_warmup=self._run_warmup if hook else None,
            process=self.process,
            binaries=self._pool,
            run=self.run,
            rebuild=self.options.rebuild,
        )

    def prepare(self) -> bool:
        """Load (or warm up and publish) the bundle once per process; True when it is usable."""
        if self._prepared is None:
            self._prepared = False
            _torchapi.bootstrap(str(self.folders.process))
            self._pool = BinaryPool(self.folders.shared / "binaries", _torchapi.build_identity())
            hook = self.config.hook.pytest_compilecache_warmup.get_hookimpls()
            self._preparer = self._make_preparer(hook)
            self._prepared = self._preparer.prepare(_torchapi.environment_fingerprint())
            if self._saved_env is not None and self.options.isolation is not Isolation.TEST:
                if self._prepared:
                    self._pool.seed(self.folders.template)
                    files.link_tree(self.folders.template, self.session_cache, replace=True)
                self._pool.seed(self.session_cache)
        return self._prepared

    def harvest(self, folder: Path, since: float = 0.0) -> None:
        """Pool the binaries a cache folder holds (those written since ``since``), for the next
        ``warm_cache`` test and the bundle."""
        if self._pool is not None:
            try:
                if _torchapi.compiler_loaded():
                    rejected = _torchapi.rejected_binary_names() - self._dropped
                    if rejected:
                        self._pool.drop(rejected)
                        drop_from(self.folders.template, rejected)  # seeded from the pool: its links too
                    self._dropped |= rejected
                self._pool.add_from(folder, since)
            except OSError as exc:
                self.process_report.binary_problems.append(f"{folder}: could not pool its C++ binaries: {exc}")

    def finish(self) -> ProcessReport:
        """At the end of the session: pool what compiles outside fixtures built; this process's report."""
        process = self.process_report
        if self._saved_env is not None and self.writes_bundle:
            self.harvest(self.session_cache, since=self._started)
        if _torchapi.compiler_loaded():
            source = self.options.bundle_name or "the session's warmup bundle"
            process.binary_problems.extend(f"{source}: {why}" for why in _torchapi.rejected_binaries())
        return process

    def _run_warmup(self, previous: Path | None) -> tuple[bytes | None, dict[str, Any], float]:
        hook = self.config.hook.pytest_compilecache_warmup
        kept = WorkerDir(self.options.home, "warmup") if self.options.isolation is Isolation.WORKER else None
        cache = self._new_cache("warmup", CacheKind.WARMUP, path=kept.path if kept is not None else None)
        if previous is not None:
            shutil.copytree(previous, cache.path, dirs_exist_ok=True)
        if self._pool is not None:
            self._pool.seed(cache.path)  # the loaded bundle's binaries, as a warm_cache test gets them
        start = time.perf_counter()
        try:
            with _torchapi.fresh_recording():
                with cache:
                    try:
                        with self.progress.warmup():
                            hook(cache=cache)
                    except Exception as exc:
                        where = ", ".join(
                            f"{impl.function.__code__.co_filename}:{impl.function.__code__.co_firstlineno}"
                            for impl in hook.get_hookimpls()
                        )
                        text = "".join(traceback.format_exception(type(exc), exc, _from_hook(exc, hook)))
                        raise WarmupFailed(
                            f"pytest_compilecache_warmup ({where}) raised {type(exc).__name__}: {exc}\n{text}"
                        ) from None
                data = _torchapi.save_artifacts()
        finally:
            self.harvest(cache.path)
            if kept is not None:
                kept.release()  # kept between runs, as the workers' folders: the next warmup hits
            else:
                shutil.rmtree(cache.path, ignore_errors=True)
        return data, cache.stats.to_dict(), time.perf_counter() - start

    # --- caches for tests ---

    def _new_cache(self, nodeid: str, kind: CacheKind, remote: bool = False, path: Path | None = None) -> CompileCache:
        return CompileCache(path or self.folders.for_test(nodeid), self.folders.process, self.options.headers_dir,
                            kind, explain=self.options.explain, remote=remote)

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
        cache = self._new_cache(request.node.nodeid, kind, remote=remote)
        try:
            if kind is CacheKind.WARM:
                template = self.folders.template if self.prepare() else None
                if template is None:
                    report = self.process_report
                    if report.warmup_error:
                        pytest.skip("warm_cache: the warmup hook failed (see WARMUP FAILED in the compilecache "
                                    "summary)")
                    if self.options.has_bundle and not self.config.hook.pytest_compilecache_warmup.get_hookimpls():
                        pytest.skip(
                            f"warm_cache needs a usable bundle ({report.status.value}: {report.reason}), and no "
                            "pytest_compilecache_warmup hook compiles one: define the hook in conftest.py, or let "
                            "a run's tests compile into the bundle first (what they compile outside cold_cache is saved)"
                        )
                    pytest.skip(
                        f"warm_cache needs a usable bundle ({report.status.value}: {report.reason}); get one "
                        "with --compile-cache-bundle=PATH after a run that builds it, or a "
                        "pytest_compilecache_warmup hook"
                    )
                if self._pool is not None:
                    self._pool.seed(template)  # binaries pooled since: the template's links carry them
                files.link_tree(template, cache.path)
            made = time.time()
            cache.__enter__()
        except _torchapi.TorchUnavailable as exc:
            pytest.fail(str(exc), pytrace=False)
        try:
            if kind is CacheKind.COLD:
                with _torchapi.fresh_recording():  # never reused: kept out of the bundle (torch >= 2.8)
                    yield cache
            else:
                yield cache
        finally:
            cache.__exit__(None, None, None)
            if kind is not CacheKind.COLD:
                self.harvest(cache.path, since=made)
            if not self._keep(request.node):
                self.folders.discard(cache.path)

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
                self.harvest(folder)
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

    def own_artifacts(self, report: ProcessReport) -> tuple[bytes, KeyIndex] | None:
        """This process's recorded Mega-Cache bytes (once) and what it knows of their keys, when a
        bundle path is set."""
        if not _torchapi.compiler_loaded() or not self.writes_bundle:
            return None
        try:
            data = _torchapi.save_artifacts()
            if data is None:
                return None
            if report.env is None:
                report.env = _torchapi.environment_fingerprint()
            return data, _torchapi.index_for(data)
        except Exception as exc:  # torch failing to serialize must not lose the session's results
            report.problems.append(f"could not save this process's compile artifacts: {exc}")
            return None

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
