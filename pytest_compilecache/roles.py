"""One plugin object per pytest process role, chosen once, each registering only the hooks it needs.

- :class:`SingleProcess`: a run without xdist; runs tests, loads or builds the bundle, saves, reports.
- :class:`Worker`: an xdist worker; runs tests, hands its artifacts and bundle story to the controller.
- :class:`Controller`: the xdist controller; checks PATH before workers start, merges once, reports.

They share small components: :class:`TestSide` (caches for tests, bundle preparation, per-test
counts), :class:`Saver` (the end-of-session write to PATH) and :class:`Collector` (per-test counts
from the reports and the terminal summary, registered beside the single process and the controller).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Generator, Iterator

import pytest

from . import _torchapi, files, remote, signing
from .binaries import BinaryPool, CarriedBinaries, pooled
from .bundle import Bundle, BundleError, Entry, NotABundle, make_entry
from .cache import CacheKind, CompileCache
from .capture import warnings_to_pytest
from .environment import SavedEnv, caches_disabled_by_env, point_cache_dirs_at
from .folders import Folders, WorkerDir
from .keyindex import KeyIndex, KeyIndexError
from .options import Isolation, Options
from .report import ProcessReport, SaveResult, SaveStatus, SessionReport, Status, summary_lines
from .stats import stats_from_counts
from .storage.interface import BundleStore, Written
from .storage.local import LocalStore
from .storage.merge import env_id
from .storage.stores import open_store
from .storage.urls import redacted
from .warmup import Preparer, WarmupFailed, died_in_warmup

WORKER_OUTPUT_KEY = "compilecache"
REPORT_ATTR = "compilecache"
_FAILED = pytest.StashKey[bool]()
_FIXTURES = ("cold_cache", "warm_cache")
#: The marker that lets a test's warm_cache use torch's remote cache.
REMOTE_MARKER = "compile_cache_remote"


def _open_store(options: Options) -> BundleStore | None:
    """The session's bundle store, opened once by each process that needs it (``None`` without a bundle)."""
    where = options.bundle_url or options.bundle
    if where is None:
        return None
    return open_store(where, options.lock_timeout, options.home / "bundle-copies", options.storage_options)


def _describe(store: BundleStore | None) -> tuple[str, bool, str]:
    """How the bundle looks now, without torch: (description, whether it exists, problem or "").

    A bundle at a URL is asked for its version only (one request, nothing downloaded)."""
    if store is None:
        return "", False, ""
    look = store.describe()
    if look.problem:  # the reason is said once, as a PROBLEM in the summary
        return f"{store.name}: cannot be used (see PROBLEM in the compilecache summary)", look.exists, look.problem
    return look.text, look.exists, look.problem


def _header(options: Options, report: SessionReport, process: ProcessReport | None) -> list[str]:
    mode = {Isolation.OFF: "off", Isolation.TEST: "a cache per test",
            Isolation.WORKER: "a kept cache per worker"}[options.isolation]
    lines = [f"compilecache: isolation: {mode}"]
    if options.remote is not None:
        state = f"UNREACHABLE: {report.remote_problem}" if report.remote_problem else "reachable"
        lines.append(f"compilecache: remote cache {redacted(options.remote)} (FX graph, AOTAutograd, autotune): {state}")
    if options.has_bundle:
        lines.append(f"compilecache: bundle {report.bundle_at_start}")
        lines.append(f"compilecache: bundles are signed and checked with {signing.KEY_ENV}" if signing.key()
                     else f"compilecache: bundles are unsigned (set {signing.KEY_ENV} to sign and check them)")
        if process is not None and process.status is not Status.UNUSED:
            lines.append(f"compilecache: bundle {process.status.value}: {process.reason}")
    lines.extend(
        f"compilecache: WARNING: {line}; cache assertions are meaningless" for line in caches_disabled_by_env()
    )
    return lines


def _entry_problems(store: BundleStore, process_dir: Path, report: SessionReport) -> list[str]:
    """Strict mode's check before any test: PATH has an intact entry for this machine. What it
    downloads from a bundle URL is noted in ``report``."""
    before = store.transfer
    try:
        return _problems_of(store, process_dir)
    finally:
        report.checked_downloaded = store.transfer.since(before).downloaded


def _problems_of(store: BundleStore, process_dir: Path) -> list[str]:
    try:
        _torchapi.bootstrap(str(process_dir))
        here = _torchapi.environment_fingerprint()
        bundle = store.read(here)
        if bundle is None:
            return []
        with bundle:
            entry = bundle.find(here)
            if entry is None:
                return [bundle.mismatch(here)]
            secret = signing.key()
            refused = bundle.signature_problem(entry, secret) if secret else ""
            if refused:
                return [refused]
            bundle.payload(entry)
    except (BundleError, _torchapi.TorchUnavailable) as exc:
        return [str(exc)]
    return []


def _check_remote(options: Options, report: SessionReport) -> None:
    """Ask the remote cache's server for a PING before any test: torch hides a server it cannot reach."""
    if options.remote is None:
        return
    why = remote.unreachable(options.remote)
    if why:
        report.remote_problem = why
        report.problems.append(f"remote cache {redacted(options.remote)} is unreachable ({why}); torch switches its remote "
                               "cache off in silence, so every remote lookup misses")
    _strict_failure(options, report.problems[-1:] if why else [], "at session start", "remote cache")


def _check_at_start(options: Options, store: BundleStore | None, start_problem: str, existed: bool,
                    process_dir: Path, report: SessionReport) -> None:
    """In strict mode, stop before any test when PATH is unreadable or has no intact entry for here
    (unless the session rebuilds it)."""
    if not options.strict or store is None or options.rebuild:
        return
    problems = [start_problem] if start_problem else []
    if not problems and existed:
        problems = _entry_problems(store, process_dir, report)
    _strict_failure(options, problems, "at session start")


def _strict_failure(options: Options, problems: list[str], when: str, what: str = "bundle") -> None:
    if options.strict and problems:
        raise pytest.UsageError(f"--compile-cache-strict: {what} problem {when}:\n  " + "\n  ".join(problems))


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
        self._test_start: dict[str, tuple[dict[str, int], float]] = {}
        self._explaining = contextlib.ExitStack()
        self._remote_before: dict[str, str | None] | None = None

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
            if "torch._inductor.config" in sys.modules:
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
            self.prepare()
        except _torchapi.TorchUnavailable as exc:
            message = f"--compile-cache-bundle: {exc}"
            if self._preparer is None:
                self._preparer = self._make_preparer(None)
            self._preparer.report.problems.append(message)
        problems = self.process_report.problems
        if self.options.strict and problems:
            return "--compile-cache-strict: bundle problem at session start:\n  " + "\n  ".join(problems)
        return None

    @property
    def writes_bundle(self) -> bool:
        """Whether this session writes PATH at its end (so its artifacts and binaries are worth saving)."""
        if not self.options.has_bundle or (self.unreadable and not self.options.rebuild):
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
                    shutil.copytree(self.folders.template, self.session_cache, dirs_exist_ok=True)
                self._pool.seed(self.session_cache)
        return self._prepared

    def harvest(self, folder: Path, since: float = 0.0) -> None:
        """Pool the binaries a cache folder holds (those written since ``since``), for the next
        ``warm_cache`` test and the bundle."""
        if self._pool is not None:
            try:
                if "torch._dynamo" in sys.modules:
                    rejected = _torchapi.rejected_binary_names() - self._dropped
                    self._pool.drop(rejected)
                    self._dropped |= rejected
                self._pool.add_from(folder, since)
            except OSError as exc:
                self.process_report.binary_problems.append(f"{folder}: could not pool its C++ binaries: {exc}")

    def finish(self) -> ProcessReport:
        """At the end of the session: pool what compiles outside fixtures built; this process's report."""
        process = self.process_report
        if self._saved_env is not None and self.writes_bundle:
            self.harvest(self.session_cache, since=self._started)
        if "torch._dynamo" in sys.modules:
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
                    pytest.skip(
                        f"warm_cache needs a usable bundle ({report.status.value}: {report.reason}); get one "
                        "with --compile-cache-bundle=PATH after a run that builds it, or a "
                        "pytest_compilecache_warmup hook"
                    )
                shutil.copytree(template, cache.path, dirs_exist_ok=True)
                if self._pool is not None:
                    self._pool.seed(cache.path)
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
                self.harvest(cache.path)
            if not self._keep(request.node):
                shutil.rmtree(cache.path, ignore_errors=True)

    def _keep(self, item: pytest.Item) -> bool:
        """Keep a failed test's folder for inspection (unless ``tmp_path_retention_policy = none``)."""
        policy = "failed"
        try:
            policy = str(self.config.getini("tmp_path_retention_policy"))
        except ValueError:
            pass
        return policy != "none" and item.stash.get(_FAILED, False)

    # --- per-test counts ---

    def test_started(self, nodeid: str) -> None:
        """Take the counters' starting point for a test."""
        loaded = "torch._dynamo.utils" in sys.modules
        self._test_start[nodeid] = (_torchapi.read_counts() if loaded else {}, _torchapi.compile_seconds())

    def test_finished(self, nodeid: str) -> dict[str, Any] | None:
        """This test's per-layer counts and compile seconds, or ``None`` if torch's compiler never loaded."""
        start = self._test_start.pop(nodeid, None)
        if start is None or "torch._dynamo.utils" not in sys.modules:
            return None
        counts, seconds = start
        now = _torchapi.read_counts()
        delta = {k: v - counts.get(k, 0) for k, v in now.items()}
        stats = stats_from_counts(delta, _torchapi.unobservable_layers(),
                                  unobservable_fields=_torchapi.unobservable_fields())
        result: dict[str, Any] = stats.to_dict()
        result["compile_seconds"] = round(_torchapi.compile_seconds() - seconds, 4)
        return result

    def own_artifacts(self, report: ProcessReport) -> tuple[bytes, KeyIndex] | None:
        """This process's recorded Mega-Cache bytes (once) and what it knows of their keys, when a
        bundle path is set."""
        if "torch._dynamo" not in sys.modules or not self.writes_bundle:
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

    def _cache_kind(self, item: pytest.Item) -> str | None:
        """The cache the test ran in (a :class:`CacheKind` value), or ``None``: a cache shared with other tests."""
        names = getattr(item, "fixturenames", ())
        if "warm_cache" in names:
            return CacheKind.WARM.value
        if "cold_cache" in names:
            return CacheKind.COLD.value
        return CacheKind.ISOLATED.value if self.options.isolation is Isolation.TEST else None

    # --- hooks shared by the roles that run tests (registered through those roles) ---

    def counts(self, item: pytest.Item) -> bool:
        """Whether ``item``'s compile counts are recorded: every test when anything session-wide is on,
        else the tests that use a fixture."""
        return self.options.active or any(name in _FIXTURES for name in getattr(item, "fixturenames", ()))

    def runtest_setup(self, item: pytest.Item) -> None:
        if self.counts(item):
            self.test_started(item.nodeid)

    def makereport(self, item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
        if report.failed:
            item.stash[_FAILED] = True
        if call.when == "teardown":
            stats = self.test_finished(item.nodeid)
            if stats is not None:
                stats["cache"] = self._cache_kind(item)
                setattr(report, REPORT_ATTR, stats)


class Saver:
    """The end of the session: merge every process's artifacts into PATH, once, under its lock."""

    def __init__(self, store: BundleStore | None, options: Options, bundle_existed: bool, run: float,
                 pools: Path | None = None, bundle_problem: str = "") -> None:
        self.store = store
        self.options = options
        self.bundle_existed = bundle_existed
        self.bundle_problem = bundle_problem
        self.run = run
        self.pools = pools

    def save(self, report: SessionReport, blobs: list[tuple[dict[str, str], bytes, KeyIndex | None]]) -> None:
        """Fill ``report.saved``; every problem names PATH. The pooled binaries go with every entry."""
        store = self.store
        if store is None:
            return
        path = store.name
        unreadable = self.bundle_problem or next((p.bundle_unreadable for p in report.processes
                                                  if p.bundle_unreadable), "")
        if unreadable and not self.options.rebuild:
            report.saved = SaveResult(SaveStatus.LEFT_ALONE, f"{path} was neither used nor written (see PROBLEM "
                                      "below): move the file away or name another path; --compile-cache-rebuild "
                                      "writes a fresh bundle over a damaged one")
            return
        if not (self.options.update or not self.bundle_existed):
            report.saved = SaveResult(SaveStatus.KEPT, f"{path} existed; add --compile-cache-update to merge this "
                                      "session's artifacts into it")
            return
        if not blobs:
            wrote = any(p.wrote_bundle for p in report.processes)
            report.saved = SaveResult(SaveStatus.NOTHING, f"the warmup wrote {path} during the session, and the tests "
                                      "compiled nothing to add" if wrote else
                                      "nothing was compiled or used outside cold_cache tests")
            return
        start = time.perf_counter()
        binaries = pooled(self.pools) if self.pools is not None else None
        history = {
            "built_compile_seconds": round(report.compile_seconds + report.warmup_seconds, 3),
            "tests": {nodeid: stats.get("compile_seconds", 0.0) for nodeid, stats in report.tests.items()},
        }
        before = store.transfer
        try:
            additions = [make_entry(env, blob, _torchapi.describe_artifacts(blob), binaries=binaries, index=index)
                         for env, blob, index in blobs]
            saved = store.add(additions, history, run=self.run, max_unused_runs=self.options.max_unused_runs,
                              rebuild=self.options.rebuild)
            merged = saved.bundle
            report.problems.extend(f"{path}: {why}" for why in saved.dropped)
            envs = {env_id(env): env for env, _, _ in blobs}
            artifacts: dict[str, dict[str, int]] = {}
            for entry in (merged.find(env) for env in envs.values()):
                kinds = dict(entry.artifacts) if entry else {}
                carried = _carried(merged, entry) if entry is not None else None
                if carried:
                    kinds["cpp"] = carried.counts()
                    if carried.triton_counts()["count"]:
                        kinds["triton_cache"] = carried.triton_counts()
                for kind, counts in kinds.items():
                    total = artifacts.setdefault(kind, {"count": 0, "bytes": 0})
                    total["count"] += counts["count"]
                    total["bytes"] += counts["bytes"]
        except NotABundle as exc:
            self._problem(report, f"{exc}; it was left alone")
            return
        except (BundleError, _torchapi.MegaCacheError, _torchapi.TorchUnavailable) as exc:
            self._problem(report, str(exc) if str(path) in str(exc) else f"{path}: {exc}")
            report.saved.transfer = store.transfer.since(before).to_json()
            return
        merged.close()
        report.saved = SaveResult(_SAVE_STATUS[saved.status], saved.note, path=saved.delta or path,
                                  artifacts=artifacts, bytes=saved.size, seconds=round(time.perf_counter() - start, 3),
                                  dropped_unused=dict(saved.unused), transfer=saved.transfer.to_json())

    @staticmethod
    def _problem(report: SessionReport, message: str) -> None:
        report.saved = SaveResult(SaveStatus.FAILED, message)
        report.problems.append(message)


def _carried(bundle: Bundle, entry: Entry) -> CarriedBinaries | None:
    """The binaries an entry just written carries (read back from the file where they are not in memory)."""
    try:
        return entry.binaries or bundle.carried(entry)[0]
    except BundleError:
        return None


_SAVE_STATUS = {Written.SAVED: SaveStatus.SAVED, Written.UNCHANGED: SaveStatus.UNCHANGED,
                Written.DELTA: SaveStatus.DELTA}


def _exit_status(options: Options, report: SessionReport, session: pytest.Session) -> None:
    """A warmup failure, or a strict-mode problem, makes the exit status non-zero (never 0 or 5)."""
    bad = report.warmup_failed or (options.strict and (report.all_problems() or report.binary_problems()))
    if bad and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _write_json(path: Path | None, report: SessionReport) -> None:
    if path is None:
        return
    import json

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_atomic(path, json.dumps(report.to_json(), indent=1, sort_keys=True).encode(), fsync=False)
    except OSError as exc:
        blocked = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        why = f"{blocked} is a file, not a folder" if blocked is not None else (exc.strerror or str(exc))
        report.problems.append(f"{path}: cannot write the report: {why}")


class _RunsTests:
    """The hooks of the roles that run tests; each role adds its own beginning and end."""

    def __init__(self, config: pytest.Config, options: Options, side: TestSide) -> None:
        self.config = config
        self.options = options
        self.side = side

    def configure(self, saved: SavedEnv | None) -> None:
        """Before collection: point compiles outside fixtures at this process's own folder."""
        self.side.configure(saved)

    def close(self) -> None:
        """Restore the environment and remove this process's folders."""
        self.side.close()
        self.side.folders.remove(keep_root=True)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.side.runtest_setup(item)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report = yield
        self.side.makereport(item, call, report)
        return report


class SingleProcess(_RunsTests):
    """A pytest run without xdist."""

    def __init__(self, config: pytest.Config, options: Options) -> None:
        self.run = time.time()
        self.store = _open_store(options)
        super().__init__(config, options, TestSide(config, options, Folders(config), "main", self.run, self.store))
        self.report = SessionReport(bundle_path=options.bundle_name)
        self.collector = Collector(options, self.report)
        self.report.bundle_at_start, self.side.bundle_existed, self.side.bundle_problem = \
            _describe(self.store if options.bundle is not None else None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Look at a bundle URL and the remote cache; in strict mode, check the bundle before any test
        (not in runs that only collect)."""
        if not self.config.option.collectonly:
            if self.options.bundle_url is not None:
                self.report.bundle_at_start, self.side.bundle_existed, self.side.bundle_problem = \
                    _describe(self.store)
            if self.side.bundle_problem:
                self.report.problems.append(self.side.bundle_problem)
            _check_remote(self.options, self.report)
            _check_at_start(self.options, self.store, self.side.bundle_problem, self.side.bundle_existed,
                            self.side.folders.process, self.report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        with warnings_to_pytest(self.config):
            failure = self.side.prepare_for(session)
        if failure:
            raise pytest.UsageError(failure)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        with warnings_to_pytest(self.config):
            self._finish(session)

    def _finish(self, session: pytest.Session) -> None:
        process = self.side.finish()
        own = self.side.own_artifacts(process)
        self.report.processes = [process]
        env = process.env
        pools = self.side.folders.shared / "binaries"
        Saver(self.store, self.options, self.side.bundle_existed, self.run, pools, self.side.bundle_problem).save(
            self.report, [(env, *own)] if own and env else [])
        _write_json(self.options.report, self.report)
        _exit_status(self.options, self.report, session)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return _header(self.options, self.report, self.side.process_report)



class Worker(_RunsTests):
    """An xdist worker: runs tests, then hands its artifacts and bundle story to the controller."""

    def __init__(self, config: pytest.Config, options: Options) -> None:
        workerinput: dict[str, Any] = config.workerinput  # type: ignore[attr-defined]
        shared = workerinput.get("compilecache_shared")
        folders = Folders(config, Path(shared) if shared else None)
        run = float(workerinput.get("compilecache_run", time.time()))
        super().__init__(config, options, TestSide(config, options, folders, str(workerinput.get("workerid", "worker")),
                                                   run, _open_store(options)))
        self.side.bundle_existed = bool(workerinput.get("compilecache_bundle_existed", False))
        self.side.bundle_problem = str(workerinput.get("compilecache_bundle_problem", ""))
        self.strict_failure: str | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        with warnings_to_pytest(self.config):
            self.strict_failure = self.side.prepare_for(session)
        if self.strict_failure:
            session.shouldstop = self.strict_failure

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.strict_failure:
            pytest.fail(self.strict_failure, pytrace=False)
        self.side.runtest_setup(item)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        with warnings_to_pytest(self.config):
            self._finish(session)

    def _finish(self, session: pytest.Session) -> None:
        process = self.side.finish()
        own = self.side.own_artifacts(process)
        if own is not None:
            name = f"{os.getpid()}-{uuid.uuid4().hex}"
            path = self.side.folders.shared / f"artifacts-{name}.bin"
            files.write_atomic(path, own[0], fsync=False)
            process.artifacts_file = str(path)
            index = self.side.folders.shared / f"index-{name}.bin"
            files.write_atomic(index, own[1].pack(), fsync=False)
            process.index_file = str(index)
        self.config.workeroutput[WORKER_OUTPUT_KEY] = process.to_json()  # type: ignore[attr-defined]


class Controller:
    """The xdist controller: runs no test; checks PATH first, merges every worker's artifacts once."""

    def __init__(self, config: pytest.Config, options: Options) -> None:
        self.config = config
        self.options = options
        self.folders = Folders(config)
        self.run = time.time()
        self.store = _open_store(options)
        self.report = SessionReport(bundle_path=options.bundle_name)
        self.collector = Collector(options, self.report)
        self.report.bundle_at_start, self.bundle_existed, self.start_problem = \
            _describe(self.store if options.bundle is not None else None)
        self._died_in_warmup: dict[str, str] = {}

    def close(self) -> None:
        """Remove the shared folder."""
        self.folders.remove(keep_root=False)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Look at a bundle URL and the remote cache; in strict mode, check the bundle before workers start."""
        if self.options.bundle_url is not None:
            self.report.bundle_at_start, self.bundle_existed, self.start_problem = _describe(self.store)
        if self.start_problem:
            self.report.problems.append(self.start_problem)
        _check_remote(self.options, self.report)
        _check_at_start(self.options, self.store, self.start_problem, self.bundle_existed, self.folders.process,
                        self.report)

    def pytest_configure_node(self, node: Any) -> None:
        """Tell a new worker where the session's shared folder is and whether PATH existed at start."""
        node.workerinput["compilecache_shared"] = str(self.folders.shared)
        node.workerinput["compilecache_bundle_existed"] = self.bundle_existed
        node.workerinput["compilecache_bundle_problem"] = self.start_problem
        node.workerinput["compilecache_run"] = self.run

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """Collect a worker's bundle story; for a worker that died in the warmup, say so."""
        output = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY)
        if output is not None:
            self.report.processes.append(ProcessReport.from_json(output))
        if error is not None:
            worker = str(node.gateway.id)
            why = died_in_warmup(self.folders.shared / "warmup-done", worker)
            if why:
                self._died_in_warmup[worker] = why
                self.report.problems.append(why)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """xdist blames the test it had handed a dead worker; say when the warmup killed it instead."""
        node = getattr(report, "node", None)
        why = self._died_in_warmup.get(str(node.gateway.id)) if node is not None else None
        if why:
            report.longrepr = f"{report.longrepr}\ncompilecache: {why}; this test had not started"

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        with warnings_to_pytest(self.config):
            self._finish(session)

    def _finish(self, session: pytest.Session) -> None:
        blobs = []
        for process in self.report.processes:
            file = process.artifacts_file
            if file and process.env and os.path.exists(file):
                blobs.append((process.env, Path(file).read_bytes(), _read_index(process.index_file)))
        Saver(self.store, self.options, self.bundle_existed, self.run, self.folders.shared / "binaries",
              self.start_problem).save(self.report, blobs)
        _write_json(self.options.report, self.report)
        _exit_status(self.options, self.report, session)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return _header(self.options, self.report, None)



class Collector:
    """Registered beside the roles that report (single process, controller): gathers per-test
    counts from the reports (a worker's arrive on them too) and prints the summary."""

    def __init__(self, options: Options, report: SessionReport) -> None:
        self.options = options
        self.report = report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        stats = getattr(report, REPORT_ATTR, None)
        if stats is not None and report.when == "teardown":
            self.report.add_test(report.nodeid, stats)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """The ``compilecache`` section: when asked for, when tests were counted, or when something went wrong."""
        report = self.report
        used = any(p.status is not Status.UNUSED for p in report.processes)
        if self.options.active or report.totals is not None or used or report.all_problems():
            terminalreporter.section("compilecache")
            for line in summary_lines(report):
                terminalreporter.write_line(line)


def _read_index(file: str | None) -> KeyIndex | None:
    """A worker's key index, or ``None`` when it wrote none (or it cannot be read: explanations only)."""
    try:
        return KeyIndex.unpack(Path(file).read_bytes()) if file else None
    except (OSError, KeyIndexError):
        return None


def is_controller(config: pytest.Config) -> bool:
    """Whether xdist will distribute this run, decided as xdist decides it."""
    if not config.pluginmanager.hasplugin("xdist") or config.option.collectonly:
        return False
    return getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None))
