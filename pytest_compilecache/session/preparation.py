"""A process's bundle: loaded (or warmed up and published, under the bundle's lock) once before its first test,
binaries pooled, what it adds at the end."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Collection

import pytest

from .. import _torchapi, files, misses
from .._torchapi import patches
from .._torchapi.layout import in_order, in_subdir, is_cpp
from ..bundle import signing
from ..bundle.binaries import identity_differences
from ..bundle.format import (Bundle, BundleError, Entry, NotABundle, NotAFile, Unreadable, Unwritable, make_entry,
                             read_manifest)
from ..bundle.keyindex import KeyIndex
from ..bundle.labels import env_label
from ..bundle.members import WHOLE, MemberDamaged
from ..bundle.writing import write_bundle
from ..cache import CacheKind, CompileCache
from ..report.model import Concern, Problem, ProcessReport, Status
from ..storage.interface import REPLACED_UNREADABLE, BundleStore
from ..storage.local import LocalStore
from .entries import EntryOnDemand
from .folders import Folders, WorkerDir
from .options import Isolation, Options
from .pool import BinaryPool, pooled
from .protocol import Next, Outcome, Published, WarmupMarker, decide
from ..channel import BundleAtStart


#: Beside the marker: the warmup's artifacts a failed store did not take.
_UNPUBLISHED = "warmup-unpublished.bundle"


class WarmupFailed(Exception):
    """The warmup hook raised; the message holds the hook's location and the traceback."""


def running_note(marker: Path, process: str) -> Path:
    """The note a process keeps beside the session's marker while it runs the warmup hook."""
    return marker.with_name(f"warmup-running-{process}.json")


def died_in_warmup(marker: Path, process: str) -> str:
    """Why a process that is gone left its warmup unfinished (naming the lock it held), or ``""``."""
    try:
        note = json.loads(running_note(marker, process).read_text())
        pid, lock = note.get("pid", "?"), note.get("lock", "the bundle lock")
    except (OSError, ValueError, AttributeError):  # no note, or not one
        return ""
    return (f"{process} (pid {pid}) died while running the warmup hook (or publishing its result), holding {lock}; "
            "the OS released the lock and the next process to take it ran the warmup again")


class BundlePreparation:
    """This process's bundle, prepared once, lazily, before the first test that may use it."""

    def __init__(self, config: pytest.Config, options: Options, folders: Folders, process: str, run: float,
                 store: BundleStore | None, at_start: Callable[[], BundleAtStart], undo: contextlib.ExitStack,
                 tell: Callable[[str], None] | None) -> None:
        self.config, self.options, self.folders = config, options, folders
        self.store, self.run = store, run
        #: The folder of compiles outside fixtures, if any (filled from the bundle, pooled from at the end).
        self.session_cache: Path | None = None
        #: The bundle as the session saw it before any test (the role that looked says).
        self._at_start = at_start
        #: What bundle preparation did in this process.
        self.process_report = ProcessReport(process=process)
        self._prepared: bool | None = None
        #: The tests this process may run (known once the first test is about to run): where they are a tenth or more
        #: of those the bundle's runs recorded (a CI shard, say), an entry at a URL is downloaded before the first test.
        self._selected: list[str] = []
        self._pool: BinaryPool | None = None
        self._dropped: set[str] = set()
        #: What the test side's end undoes (the session folder's filling from the bundle).
        self._undo = undo
        self._started = time.time()
        #: Where a bundle problem found while preparing is said at once (``None``: not in this process).
        self.tell = tell
        self.marker = folders.shared / "warmup-done"
        #: The session's own bundle: where the warmup publishes unless this session writes PATH (or PATH is unreadable).
        self.fallback = LocalStore(folders.shared / "session.bundle", options.lock_timeout)
        self.publish: BundleStore = self.fallback

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
            self._say(Concern.BUNDLE, f"--compile-cache-bundle: {exc}", self.options.bundle_name or "")
        except Warning as exc:  # a warning filter set to "error" (-W error, filterwarnings = error)
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self._say(Concern.BUNDLE, f"--compile-cache-bundle: preparing the bundle stopped on a warning that this "
                      f"run's warning filters turn into an error: {type(exc).__name__}: {exc} ({where.filename}:"
                      f"{where.lineno}); no bundle is used (ignore it by its category and module in filterwarnings "
                      "to prepare one)", self.options.bundle_name or "")
        if self.options.strict and self._prepared is not None:
            misses.unpack_bundle_index()  # a malformed key index is otherwise found at the first miss
        problems = [p for p in self.process_report.problems if p.concern is not Concern.BINARY]
        if self.options.strict and problems:
            return "--compile-cache-strict: bundle problem at session start:\n  " + "\n  ".join(map(str, problems))
        return None

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
            self._prepared = self.load_or_warm_up(_torchapi.environment_fingerprint(), pool)
            if self.session_cache is not None and self.options.isolation is not Isolation.TEST:
                self._fill_session_cache(self.session_cache, pool)
        return self._prepared

    def load_or_warm_up(self, env: dict[str, str], pool: BinaryPool) -> bool:
        """Fill the template folder, its binaries pooled in ``pool``; True when it holds a usable bundle entry."""
        self._pool, self.process_report.env = pool, env
        warms_up = bool(self.config.hook.pytest_compilecache_warmup.get_hookimpls())
        self.publish = self.store if self.writes_bundle and self.store is not None else self.fallback
        loaded = False
        try:
            bundle = self.store.read(env) if self.store is not None and not self.options.rebuild else None
            if self.options.rebuild and self.store is not None:
                self._status(Status.IGNORED, f"{self.store.name}: not read (--compile-cache-rebuild); "
                                             "this session writes a fresh entry for this machine")
            elif bundle is None and self.store is not None:
                self._status(Status.MISSING, f"{self.store.name}: does not exist yet")
            elif bundle is not None:
                with bundle:
                    entry = bundle.find(env)
                    if entry is None:
                        self._problem(Status.INCOMPATIBLE, bundle.mismatch(env))
                    else:
                        loaded = self._load(bundle, entry)
                if loaded and not self.options.update:
                    return True
        except BundleError as exc:
            self._problem(Status.NOT_A_BUNDLE if isinstance(exc, NotABundle) else Status.UNUSABLE, str(exc))
            self._unreadable(str(exc), Unreadable.of(exc))
        report = self.process_report
        if not loaded and self.store is not None:
            misses.use_bundle_index("", cannot=f"no bundle entry was loaded ({report.status.value}: {report.reason})")
        if self.tell is not None and not self._at_start().problem and self.store is not None and report.problems:
            instead = "the warmup runs in its place" if warms_up else "this run goes on without it"
            self.tell(f"{self.store.name} cannot be used: {instead} (the compilecache summary says why)")
        if not warms_up:
            if self.store is None:
                self._status(Status.NONE, "no --compile-cache-bundle and no pytest_compilecache_warmup hook")
            return loaded
        try:
            return self._warm_up_once(env, loaded) or loaded
        except BundleError as exc:
            problem = str(exc)
        except OSError as exc:
            problem = f"{exc.filename or self.marker.parent}: {exc.strerror or exc}"
        except _torchapi.MegaCacheError as exc:
            problem = f"{self.publish.name}: could not publish the warmup's artifacts: {exc}"
        if loaded:
            self._say(Concern.BUNDLE, f"the bundle loaded, but the warmup did not run: {problem}", self.publish.name)
        else:
            self._problem(Status.UNUSABLE, problem)
        return loaded

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
                self._say(Concern.BINARY, f"{folder}: could not pool its C++ binaries: {exc}", str(folder))

    def finish(self) -> ProcessReport:
        """At the end of the session: pool what compiles outside fixtures built; this process's report."""
        process = self.process_report
        if self.session_cache is not None and self.writes_bundle:
            self.harvest(self.session_cache, since=self._started)
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
                    except Exception as exc:  # where the hook is defined, and the traceback from its own frame on
                        codes = [impl.function.__code__ for impl in hook.get_hookimpls()]
                        tb = exc.__traceback__
                        while tb is not None and tb.tb_frame.f_code not in codes:
                            tb = tb.tb_next
                        where = ", ".join(f"{code.co_filename}:{code.co_firstlineno}" for code in codes)
                        text = "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))
                        raise WarmupFailed(f"pytest_compilecache_warmup ({where}) raised {type(exc).__name__}: "
                                           f"{exc}\n{text}") from None
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

    def _unreadable(self, why: str, kind: Unreadable) -> None:
        """The bundle could not be read: nothing writes over it, the warmup publishes to the session's own instead."""
        self.process_report.bundle_unreadable, self.process_report.bundle_unreadable_kind = why, kind
        if self.publish is self.store:
            self.publish = self.fallback

    def _status(self, status: Status, reason: str) -> None:
        self.process_report.status, self.process_report.reason = status, reason

    def _problem(self, status: Status, message: str) -> None:
        self._status(status, message)
        self._say(Concern.BUNDLE, message, self.store.name if self.store is not None else "")

    def _say(self, concern: Concern, text: str, where: str = "") -> None:
        self.process_report.problems.append(Problem(concern, text, where))

    def _load(self, bundle: Bundle, entry: Entry) -> bool:
        start = time.perf_counter()
        secret = signing.key()
        if refused := bundle.signature_problem(entry, secret) if secret else "":
            self._problem(Status.UNUSABLE, refused)
            return False
        for problem in bundle.problems:
            self._say(Concern.BUNDLE, problem, bundle.name)
        try:
            recorded = entry.history.get("tests")
            if not isinstance(recorded, dict) or 10 * len(set(self._selected) & set(recorded)) >= len(recorded):
                bundle.fetch_ahead(entry)
            members = bundle.members(entry)
            _torchapi.check_artifact_keys((m.kind, m.key) for m in members.table if m.kind != WHOLE)
            shutil.rmtree(self.folders.template, ignore_errors=True)
            self.folders.template.mkdir(parents=True)
            later = _torchapi.kinds_on_demand()
            source = EntryOnDemand(members, bundle.name, self.process_report)
            now = source.up_front(later)
            whole = len(now) == 1 and now[0][0] == WHOLE
            data = now[0][2] if whole else _torchapi.artifacts_bytes(now) if now else b""
            loaded = _torchapi.load_artifacts(data, str(self.folders.template)) if now else {}
            _torchapi.fill_from(self.folders.template, source)
        except (BundleError, _torchapi.MegaCacheError, MemberDamaged) as exc:
            message = str(exc) if str(exc).startswith(bundle.name) else f"{bundle.name}: {exc}"
            self._problem(Status.UNUSABLE, message)
            if isinstance(exc, BundleError) and self.store is not None and bundle.name == self.store.name:
                self._unreadable(message, Unreadable.of(exc))
            _torchapi.fill_from(self.folders.template, None)
            shutil.rmtree(self.folders.template, ignore_errors=True)
            return False
        self.process_report.own_warmup = bundle.path.name == _UNPUBLISHED or (  # not PATH's entry
            bundle.name == self.fallback.name and (self.store is None or self.store.name != bundle.name))
        shown = "this session's warmup" if self.process_report.own_warmup else bundle.name
        self._status(Status.LOADED, f"{shown}: {env_label(entry.env)}")
        self.process_report.history = dict(entry.history)
        self.process_report.loaded = {kind: len(keys) for kind, keys in loaded.items()}
        self.process_report.loaded_bytes = sum(len(content) for *_, content in now)
        held: dict[str, list[str]] = {}
        for member in members.table:
            held.setdefault(member.kind, []).append(member.key)
        self.process_report.on_demand = {kind: len(keys) for kind, keys in held.items() if kind in later}
        self._use_index(bundle, entry, held)
        self._load_binaries(bundle, entry, source)
        self.process_report.load_seconds = time.perf_counter() - start
        return True

    def _use_index(self, bundle: Bundle, entry: Entry, loaded: dict[str, list[str]]) -> None:
        """Explain later misses against the entry's key index: checked now, unpacked when first needed."""
        if unreadable := bundle.read_key_index(entry):
            self._say(Concern.BUNDLE, unreadable, bundle.name)
        keys = {k for kind in ("inductor", "aot_autograd") for k in loaded.get(kind, [])}
        _torchapi.note_bundle_keys(loaded.get("aot_autograd", []), loaded.get("autotune", []))
        name = "this session's warmup" if self.process_report.own_warmup else f"the bundle {bundle.name}"

        def unpacked() -> tuple[KeyIndex | None, int, str]:
            index, problem = bundle.key_index(entry)  # read and checked above: the file is not read again
            if problem and not unreadable:  # malformed, found only now
                self._say(Concern.BUNDLE, problem, bundle.name)
            if problem:
                return None, 0, "the bundle's key details are unusable (see the bundle's problems)"
            if index is not None and index.torch and index.torch != entry.env.get("torch", index.torch):
                return None, 0, (f"the bundle's key details were recorded by torch {index.torch}, "
                                 f"not {entry.env.get('torch')}")
            if index is None or not index.keys:
                return None, 0, ("the bundle holds no key details for this entry (it was written before "
                                 "pytest-compilecache recorded them)")
            return index, len(keys - set(index.keys)), ""

        misses.use_bundle_index(name, unpacked)

    def _load_binaries(self, bundle: Bundle, entry: Entry, source: EntryOnDemand) -> None:
        """Put the entry's binaries that fit this machine into the pool, now or (C++ binaries, where torch says
        which folder it builds in) when torch asks for their folder; say why others do not fit."""
        pool = self._pool
        assert pool is not None
        try:
            carried = bundle.carried_listing(entry)
        except BundleError as exc:
            self._say(Concern.BINARY, f"{exc}; no carried binary is used, kernels are built here", bundle.name)
            return
        for problem in carried.problems:
            self._say(Concern.BINARY, f"{bundle.name}: {problem}", bundle.name)
        fitting = carried.fitting(pool.build)
        later = {path: f for path, f in fitting.items()
                 if (_torchapi.binaries_on_demand() and in_subdir(path))
                 or (_torchapi.triton_on_demand() and path.startswith("triton/"))}
        now = [(path, f) for path, f in in_order(fitting) if path not in later]
        probes = carried.probes(_torchapi.cpu_probe_sources())
        try:
            _, failed = pool.add_all(source.checked_binaries(now))
        finally:
            source.carry(later, pool, probes)
        for path, error in failed:
            self._say(Concern.BINARY, f"{bundle.name}: carried binary {path} could not be pooled: {error}", bundle.name)
        _torchapi.mark_carried(fitting)
        listed = (entry.binaries_section or {}).get("files") or [[b, p] for b, p in carried.files]
        cpp = [item[1] for item in listed if is_cpp(item[1])]
        count = sum(1 for path in cpp if path not in probes)
        fit = sum(1 for path in fitting if is_cpp(path) and path not in probes)
        self.process_report.binaries = {"carried": count, "fit": fit, "probes": len(cpp) - count,
                                        "triton_kernels": carried.triton_counts()["count"]}
        if count and not fit and carried.builds:
            why = "; ".join(identity_differences(identity, pool.identity) for identity in carried.builds.values())
            self._say(Concern.BINARY, f"{bundle.name}: none of its {count} carried binaries fits this machine "
                                      f"({why}); their kernels are built here", bundle.name)

    def _write_marker(self, outcome: Outcome, detail: str = "") -> None:
        WarmupMarker(outcome, self.process_report.process, detail).write(self.marker)

    def _warm_up_once(self, env: dict[str, str], have_previous: bool) -> bool:
        try:
            return self._warm_up_under_lock(env, have_previous)
        except (NotABundle, NotAFile, Unwritable) as exc:
            # Only --compile-cache-rebuild, which did not read PATH, finds it here: a file that is not a bundle is
            # never written over, and a path with no file (or in a folder this user cannot write) cannot be: the
            # warmup publishes to the session's own.
            if self.publish is not self.store or self.process_report.warmup_seconds is not None \
                    or (have_previous and isinstance(exc, Unwritable)):
                raise
            if isinstance(exc, NotABundle):
                self._problem(Status.NOT_A_BUNDLE, str(exc))
            else:  # a local path only, said by the session's look at it before any test
                self._status(Status.UNUSABLE, str(exc))
            self._unreadable(str(exc), Unreadable.of(exc))
            return self._warm_up_under_lock(env, have_previous)

    def _warm_up_under_lock(self, env: dict[str, str], have_previous: bool) -> bool:
        with self.publish.locked():
            marker = WarmupMarker.read(self.marker)
            current = None
            try:  # what the place the warmup publishes to holds (``None``: nothing, or a damaged bundle it replaces)
                if marker is None or marker.outcome not in (Outcome.FAILED, Outcome.KEPT_APART):
                    current = self.publish.read(env)
            except BundleError as exc:
                rebuilding = self.options.rebuild and self.publish is self.store
                if isinstance(exc, NotABundle) or marker is not None \
                        or not (rebuilding or self.publish.may_be_unreachable):
                    raise
                if not rebuilding:  # a damaged bundle is said once, and its rebuild replaces it
                    self._say(Concern.BUNDLE, f"{exc}; the warmup runs without it", self.publish.name)
            with current if current is not None else contextlib.nullcontext():
                entry = current.find(env) if current is not None else None
                published = (Published.NOTHING if current is None else Published.NO_ENTRY if entry is None
                             else Published.THIS_RUNS_ENTRY if entry.history.get("run") == self.run
                             else Published.EARLIER_ENTRY)
                step = decide(marker.outcome if marker is not None else None, published, self.options.update,
                              self.options.rebuild, self.publish is self.store)
                if step is Next.SAY_FAILED and marker is not None:
                    self._warmup_failed(marker.detail, elsewhere=marker.process)
                    return False
                if step is Next.LOAD_KEPT_APART and marker is not None:
                    with read_manifest(Path(marker.detail)) as kept:
                        found = kept.find(env)
                        return found is not None and self._load(kept, found)
                if step is Next.LOAD_PUBLISHED and current is not None and entry is not None:
                    return self._load(current, entry)
                if step is Next.NOTHING:
                    return False
            note = running_note(self.marker, self.process_report.process)
            files.write_atomic(note, json.dumps({"pid": os.getpid(), "lock": self.publish.lock_file}).encode(),
                               fsync=False)
            try:
                return self._warm_up_and_publish(env, have_previous)
            finally:
                note.unlink(missing_ok=True)

    def _warm_up_and_publish(self, env: dict[str, str], have_previous: bool) -> bool:
        """Run the warmup hook and publish what it compiled; the caller holds the lock."""
        try:
            data = self._run_warmup(self.folders.template if have_previous else None)
        except WarmupFailed as exc:
            self._write_marker(Outcome.FAILED, str(exc))
            self._warmup_failed(str(exc))
            return False
        report, to_path = self.process_report, self.publish is self.store
        if data is None:
            self._write_marker(Outcome.NOTHING)
            return False
        # The session's own bundle needs no binaries: its readers share the pool on disk already.
        carried = pooled(self.folders.shared / "binaries") if to_path else None
        addition = make_entry(env, data, _torchapi.describe_artifacts(data), binaries=carried,
                              index=misses.index_for(data))
        try:  # counted at the session's end
            saved = self.publish.add([addition], {"warmup_seconds": round(report.warmup_seconds or 0.0, 3)},
                                     run=self.run, rebuild=self.options.rebuild and to_path, counted=False)
        except BundleError as exc:
            if not self.publish.may_be_unreachable:
                raise
            # The store failed (a network, a server): this session still uses what the warmup compiled.
            write_bundle(Bundle(self.marker.with_name(_UNPUBLISHED), [addition]))
            published = read_manifest(self.marker.with_name(_UNPUBLISHED))
            self._say(Concern.SAVING, f"{exc}; this session uses the warmup's artifacts without publishing them",
                      self.publish.name)
            self._write_marker(Outcome.KEPT_APART, str(published.path))
        else:
            published = saved.bundle
            for why in saved.dropped:
                if self.options.rebuild and to_path and why.startswith(REPLACED_UNREADABLE):
                    continue  # the repair asked for: the header said it
                self._say(Concern.SAVING, f"{self.publish.name}: {why}", self.publish.name)
            self._write_marker(Outcome.PUBLISHED)
            report.wrote_bundle, report.warmup_found_all = to_path and saved.added, to_path and not saved.added
        with published:
            entry = published.find(env)
            return entry is not None and self._load(published, entry)

    def _warmup_failed(self, message: str, elsewhere: str = "") -> None:
        where = f" (in {elsewhere})" if elsewhere and elsewhere != self.process_report.process else ""
        self.process_report.warmup_error = message
        self._status(Status.WARMUP_FAILED, f"the warmup hook failed{where}: {message.splitlines()[0]}")
        self._say(Concern.WARMUP, self.process_report.reason)
