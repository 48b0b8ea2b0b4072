"""A process's bundle: loaded (or warmed up) once before its first test, binaries pooled, what it adds at the end."""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Collection

import pytest

from .. import _torchapi, files, misses
from .._torchapi import patches
from ..bundle.format import Unreadable
from ..bundle.keyindex import KeyIndex
from ..cache import CacheKind, CompileCache
from ..report.model import Concern, Problem, ProcessReport
from ..storage.interface import BundleStore
from ..storage.local import LocalStore
from .folders import Folders, WorkerDir
from .options import Isolation, Options
from .pool import BinaryPool
from ..channel import BundleAtStart
from .warmup import Preparer, WarmupFailed


def _failed_in(hook: Any, exc: Exception) -> WarmupFailed:
    """The hook's failure: where it is defined, and the traceback from its own first frame on (not pluggy's)."""
    codes = [impl.function.__code__ for impl in hook.get_hookimpls()]
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code not in codes:
        tb = tb.tb_next
    where = ", ".join(f"{code.co_filename}:{code.co_firstlineno}" for code in codes)
    text = "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))
    return WarmupFailed(f"pytest_compilecache_warmup ({where}) raised {type(exc).__name__}: {exc}\n{text}")


class BundlePreparation:
    """This process's bundle, prepared once, lazily, before the first test that may use it."""

    def __init__(self, config: pytest.Config, options: Options, folders: Folders, process: str, run: float,
                 store: BundleStore | None, session_cache: Callable[[], Path | None],
                 at_start: Callable[[], BundleAtStart],
                 tell: Callable[[str], None] | None, undo: contextlib.ExitStack) -> None:
        self.config, self.options, self.folders = config, options, folders
        self.store, self.process, self.run = store, process, run
        #: The plugin's folder of compiles outside fixtures, if any (filled from the bundle, pooled from at the end).
        self._session_cache = session_cache
        #: The bundle as the session saw it before any test (the role that looked says).
        self._at_start = at_start
        #: What bundle preparation did in this process (the preparer's, once it runs).
        self.process_report = ProcessReport(process=process)
        self._prepared: bool | None = None
        #: The tests this process may run (known once the first test is about to run).
        self._selected: list[str] = []
        self._pool: BinaryPool | None = None
        self._dropped: set[str] = set()
        #: What the test side's end undoes (the session folder's filling from the bundle).
        self._undo = undo
        self._started = time.time()
        #: Where a bundle problem found while preparing is said at once (``None``: not in this process).
        self.tell = tell

    def template(self) -> Path | None:
        """The folder ``warm_cache`` tests start from, with the binaries pooled so far; ``None`` without a bundle."""
        if not self.prepare():
            return None
        if self._pool is not None:
            self._pool.seed(self.folders.template)
        return self.folders.template

    def why_unusable(self) -> str:
        """Why ``warm_cache`` tests are skipped, when :meth:`template` is ``None``."""
        report = self.process_report
        if report.warmup_error:
            return "warm_cache: the warmup hook failed (see WARMUP FAILED in the compilecache summary)"
        hooked = bool(self.config.hook.pytest_compilecache_warmup.get_hookimpls())
        if self.options.has_bundle and not hooked:
            return (f"warm_cache needs a usable bundle ({report.status.value}: {report.reason}), and no "
                    "pytest_compilecache_warmup hook compiles one: define the hook in conftest.py, or let "
                    "a run's tests compile into the bundle first (what they compile outside cold_cache is saved)")
        if hooked:
            state = f"{report.status.value}: {report.reason}" if report.reason else "the warmup hook compiled nothing"
            return f"warm_cache needs a usable bundle ({state})"
        return (f"warm_cache needs a usable bundle ({report.status.value}: {report.reason}); get one "
                "with --compile-cache-bundle=PATH after a run that builds it, or a pytest_compilecache_warmup hook")

    def prepare_for(self, session: pytest.Session) -> str | None:
        """Before the first test: load or build the bundle if a selected test may use it (one that uses ``warm_cache``,
        or any once torch is imported, with a bundle); the strict-mode failure to stop on, or ``None``."""
        option = self.config.option
        if self._prepared is not None or not session.items or option.collectonly \
                or (session.testsfailed and not option.continue_on_collection_errors):
            return None
        if not any("warm_cache" in getattr(item, "fixturenames", ()) for item in session.items) \
                and not (self.options.has_bundle and "torch" in sys.modules):
            return None
        self._selected = [item.nodeid for item in session.items]
        try:
            self.prepare()
        except _torchapi.TorchUnavailable as exc:
            self._failed_to_prepare(f"--compile-cache-bundle: {exc}")
        except Warning as exc:  # a warning filter set to "error" (-W error, filterwarnings = error)
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self._failed_to_prepare(
                f"--compile-cache-bundle: preparing the bundle stopped on a warning that this run's warning "
                f"filters turn into an error: {type(exc).__name__}: {exc} ({where.filename}:{where.lineno}); "
                f"no bundle is used (ignore it by its category and module in filterwarnings to prepare one)")
        if self.options.strict and self._prepared is not None:
            misses.unpack_bundle_index()  # a malformed key index is otherwise found at the first miss
        problems = [p for p in self.process_report.problems if p.concern is not Concern.BINARY]
        if self.options.strict and problems:
            return "--compile-cache-strict: bundle problem at session start:\n  " + "\n  ".join(map(str, problems))
        return None

    def _failed_to_prepare(self, problem: str) -> None:
        self.process_report.problems.append(Problem(Concern.BUNDLE, problem, self.options.bundle_name or ""))

    @property
    def writes_bundle(self) -> bool:
        """Whether this session writes PATH at its end (so its artifacts and binaries are worth saving)."""
        if not self.options.has_bundle:
            return False
        report = self.process_report
        if (self._at_start().problem or report.bundle_unreadable) and not (
                self.options.rebuild and report.bundle_unreadable_kind in (None, Unreadable.DAMAGED)):
            return False
        return self.options.update or not self._at_start().existed

    def prepare(self) -> bool:
        """Load (or warm up and publish) the bundle once per process; True when it is usable."""
        if self._prepared is None:
            self._prepared = False
            _torchapi.bootstrap(str(self.folders.process))
            pool = self._pool = BinaryPool(self.folders.shared / "binaries", _torchapi.build_identity())
            hook = self.config.hook.pytest_compilecache_warmup.get_hookimpls()
            own = LocalStore(self.folders.shared / "session.bundle", self.options.lock_timeout)
            preparer = Preparer(self.options, self.folders, self.store, self.writes_bundle, own,
                                self._run_warmup if hook else None, self.process, pool, self.run,
                                tell=None if self._at_start().problem else self.tell,  # the header said it
                                selected=self._selected)
            self.process_report = preparer.report
            self._prepared = preparer.prepare(_torchapi.environment_fingerprint())
            session_cache = self._session_cache()
            if session_cache is not None and self.options.isolation is not Isolation.TEST:
                self._fill_session_cache(session_cache, pool)
        return self._prepared

    def _fill_session_cache(self, folder: Path, pool: BinaryPool) -> None:
        """Give compiles outside fixtures the bundle: all of it now in a worker's kept folder, else as torch asks."""
        template = self.folders.template
        if not self._prepared:
            pool.seed(folder)
        elif self.options.isolation is Isolation.WORKER:
            pool.seed(template)
            _torchapi.make_whole(template)
            files.link_tree(template, folder, replace=True)
            pool.seed(folder)
        else:
            pool.seed(template)
            _torchapi.fill_warm_folder(template, folder)
            self._undo.enter_context(_torchapi.placing_from(str(template), str(folder)))

    def harvest(self, folder: Path, since: float = 0.0, leaving_out: Collection[str] = ()) -> None:
        """Pool the binaries a folder holds (written since ``since``, less ``leaving_out``) for later ``warm_cache``
        tests and the bundle."""
        if self._pool is not None:
            try:
                if _torchapi.compiler_loaded():
                    rejected = set(_torchapi.rejected_binaries()) - self._dropped
                    if rejected:
                        self._pool.drop(rejected, self.folders.template)
                    self._dropped |= rejected
                self._pool.add_from(folder, since, leaving_out)
            except OSError as exc:
                self.process_report.problems.append(
                    Problem(Concern.BINARY, f"{folder}: could not pool its C++ binaries: {exc}", str(folder)))

    def finish(self) -> ProcessReport:
        """At the end of the session: pool what compiles outside fixtures built; this process's report."""
        process = self.process_report
        session_cache = self._session_cache()
        if session_cache is not None and self.writes_bundle:
            self.harvest(session_cache, since=self._started)
        if self.store is not None and self.store.transfer.counted and self._prepared is not None:
            process.downloaded_bytes = self.store.transfer.downloaded  # with what tests read when torch asked
        if patches.installed():
            process.patches = patches.status()
        if _torchapi.compiler_loaded():
            process.headers_seconds = round(_torchapi.header_build_seconds(), 3)
            source = self.options.bundle_name or "the session's warmup bundle"
            process.problems.extend(Problem(Concern.BINARY, f"{source}: {why}", self.options.bundle_name or "")
                                    for why in _torchapi.rejected_binaries().values())
        return process

    def _run_warmup(self, previous: Path | None) -> bytes | None:
        hook = self.config.hook.pytest_compilecache_warmup
        kept = WorkerDir(self.options.home, "warmup") if self.options.isolation is Isolation.WORKER else None
        on_demand = previous if kept is None else None  # a folder kept between runs gets the previous entry whole
        cache = CompileCache(kept.path if kept is not None else self.folders.for_test("warmup"), self.folders.process,
                             self.options.headers_dir, CacheKind.WARMUP, explain=self.options.explain,
                             template=on_demand)
        if on_demand is not None:
            _torchapi.fill_warm_folder(on_demand, cache.path)
        elif previous is not None:
            _torchapi.make_whole(previous)
            shutil.copytree(previous, cache.path, dirs_exist_ok=True)
        if self._pool is not None:
            self._pool.seed(cache.path)  # the loaded bundle's binaries, as a warm_cache test gets them
        start = time.perf_counter()
        try:
            with _torchapi.fresh_recording():
                with cache:
                    try:
                        hook(cache=cache)
                    except Exception as exc:
                        raise _failed_in(hook, exc) from None
                recorded = _torchapi.save_artifacts()
        finally:
            self.harvest(cache.path, leaving_out=cache.not_saved_binaries)
            if kept is not None:
                kept.release()  # kept between runs, as the workers' folders: the next warmup hits
            else:
                shutil.rmtree(cache.path, ignore_errors=True)
        report = self.process_report
        report.warmup_seconds, report.warmup_stats = time.perf_counter() - start, cache.stats.to_dict()
        report.warmup_folder = str(kept.path) if kept is not None else ""
        report.not_saved.extend(why for why in recorded.not_saved if why not in report.not_saved)
        return recorded.data

    def own_artifacts(self, report: ProcessReport) -> tuple[bytes, KeyIndex] | None:
        """This process's recorded Mega-Cache bytes and what it knows of their keys, when it writes the bundle."""
        if not _torchapi.compiler_loaded() or not self.writes_bundle:
            return None
        try:
            recorded = _torchapi.save_artifacts()
            report.not_saved.extend(why for why in recorded.not_saved if why not in report.not_saved)
            data = recorded.data
            if data is None:
                return None
            if report.env is None:
                report.env = _torchapi.environment_fingerprint()
            index = misses.index_for(data)
            if _torchapi.binaries_on_demand():  # the get_path wrapper that records the asks took
                index.note_kernels(self.run, _torchapi.asked_binaries())
            return data, index
        except Exception as exc:  # torch failing to serialize must not lose the session's results
            report.problems.append(Problem(Concern.SAVING, f"could not save this process's compile artifacts: {exc}"))
            return None
