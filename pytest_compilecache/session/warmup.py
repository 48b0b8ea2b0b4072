"""Bringing one process's template cache up to date with the session's bundle, once: load, or warm up and publish."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Collection

from .. import _torchapi, files, misses
from ..bundle import signing
from .._torchapi.layout import in_order, in_subdir, is_cpp
from ..bundle.binaries import identity_differences
from ..bundle.format import (Bundle, BundleError, Entry, NotABundle, NotAFile, Unreadable, Unwritable, make_entry,
                             read_manifest)
from ..bundle.labels import env_label
from ..bundle.writing import write_bundle
from ..bundle.keyindex import KeyIndex
from ..bundle.members import WHOLE, MemberDamaged
from ..report.model import Concern, Problem, ProcessReport, Status
from ..storage.interface import BundleStore, replaced_unreadable
from .entries import EntryOnDemand
from .folders import Folders
from .options import Options
from .pool import BinaryPool, pooled
from .protocol import Next, Outcome, Published, WarmupMarker, decide


#: Beside the marker: the warmup's artifacts a failed store did not take.
_UNPUBLISHED = "warmup-unpublished.bundle"
#: Runs the warmup in a folder (starting from the previous template, if given), noting in the process's report what
#: it ran; the Mega-Cache bytes it recorded (``None``: nothing); raises :class:`WarmupFailed`.
RunWarmup = Callable[[Path | None], bytes | None]


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


class Preparer:
    """Loads the bundle (or runs the warmup and publishes it) into ``template``, once per process."""

    def __init__(self, options: Options, folders: Folders, source: BundleStore | None, to_source: bool,
                 fallback: BundleStore, run_warmup: RunWarmup | None, process: str, binaries: BinaryPool, run: float,
                 tell: Callable[[str], None] | None = None, selected: Collection[str] = ()) -> None:
        #: The tests this process may run: where they are a tenth or more of those the bundle's runs recorded (a
        #: CI shard, say), an entry at a URL is downloaded before the first test, else each part when torch asks.
        self.selected = selected
        #: Where the bundle is read from; where the warmup publishes (``source`` where this session writes it, else
        #: ``fallback``, the session's own, also used when ``source`` cannot be read).
        self.source, self.fallback = source, fallback
        self.publish = source if to_source and source is not None else fallback
        self.update, self.rebuild, self.run = options.update, options.rebuild, run
        self.template, self.marker = folders.template, folders.shared / "warmup-done"
        self.binaries, self.run_warmup = binaries, run_warmup
        #: Told, as soon as it is found and before the warmup runs, that the bundle cannot be used (the summary says why).
        self.tell = tell
        self.report = ProcessReport(process=process)

    def prepare(self, env: dict[str, str]) -> bool:
        """Fill the template folder; True when it holds a usable bundle entry."""
        self.report.env = env
        loaded = False
        try:
            bundle = self.source.read(env) if self.source is not None and not self.rebuild else None
            if self.rebuild and self.source is not None:
                self._status(Status.IGNORED, f"{self.source.name}: not read (--compile-cache-rebuild); "
                                             "this session writes a fresh entry for this machine")
            elif bundle is None and self.source is not None:
                self._status(Status.MISSING, f"{self.source.name}: does not exist yet")
            elif bundle is not None:
                with bundle:
                    entry = bundle.find(env)
                    if entry is None:
                        self._problem(Status.INCOMPATIBLE, bundle.mismatch(env))
                    else:
                        loaded = self._load(bundle, entry)
                if loaded and not self.update:
                    return True
        except BundleError as exc:
            self._problem(Status.NOT_A_BUNDLE if isinstance(exc, NotABundle) else Status.UNUSABLE, str(exc))
            self._unreadable(str(exc), Unreadable.of(exc))

        if not loaded and self.source is not None:
            misses.use_bundle_index("", cannot=f"no bundle entry was loaded ({self.report.status.value}: "
                                                  f"{self.report.reason})")
        if self.tell is not None and self.source is not None and self.report.problems:
            instead = "the warmup runs in its place" if self.run_warmup is not None else "this run goes on without it"
            self.tell(f"{self.source.name} cannot be used: {instead} (the compilecache summary says why)")
        if self.run_warmup is None:
            if self.source is None:
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

    def _unreadable(self, why: str, kind: Unreadable) -> None:
        """The bundle could not be read: nothing writes over it, the warmup publishes to the session's own instead."""
        self.report.bundle_unreadable, self.report.bundle_unreadable_kind = why, kind
        if self.publish is self.source:
            self.publish = self.fallback

    def _status(self, status: Status, reason: str) -> None:
        self.report.status, self.report.reason = status, reason

    def _problem(self, status: Status, message: str) -> None:
        self._status(status, message)
        self._say(Concern.BUNDLE, message, self.source.name if self.source is not None else "")

    def _say(self, concern: Concern, text: str, where: str = "") -> None:
        self.report.problems.append(Problem(concern, text, where))

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
            if not isinstance(recorded, dict) or 10 * len(set(self.selected) & set(recorded)) >= len(recorded):
                bundle.fetch_ahead(entry)
            members = bundle.members(entry)
            _torchapi.check_artifact_keys((m.kind, m.key) for m in members.table if m.kind != WHOLE)
            shutil.rmtree(self.template, ignore_errors=True)
            self.template.mkdir(parents=True)
            later = _torchapi.kinds_on_demand()
            source = EntryOnDemand(members, bundle.name, self.report)
            now = source.up_front(later)
            whole = len(now) == 1 and now[0][0] == WHOLE
            data = now[0][2] if whole else _torchapi.artifacts_bytes(now) if now else b""
            loaded = _torchapi.load_artifacts(data, str(self.template)) if now else {}
            _torchapi.fill_from(self.template, source)
        except (BundleError, _torchapi.MegaCacheError, MemberDamaged) as exc:
            message = str(exc) if str(exc).startswith(bundle.name) else f"{bundle.name}: {exc}"
            self._problem(Status.UNUSABLE, message)
            if isinstance(exc, BundleError) and self.source is not None and bundle.name == self.source.name:
                self._unreadable(message, Unreadable.of(exc))
            _torchapi.fill_from(self.template, None)
            shutil.rmtree(self.template, ignore_errors=True)
            return False
        self.report.own_warmup = self._own(bundle)
        shown = "this session's warmup" if self.report.own_warmup else bundle.name
        self._status(Status.LOADED, f"{shown}: {env_label(entry.env)}")
        self.report.history = dict(entry.history)
        self.report.loaded = {kind: len(keys) for kind, keys in loaded.items()}
        self.report.loaded_bytes = sum(len(content) for *_, content in now)
        held: dict[str, list[str]] = {}
        for member in members.table:
            held.setdefault(member.kind, []).append(member.key)
        self.report.on_demand = {kind: len(keys) for kind, keys in held.items() if kind in later}
        self._use_index(bundle, entry, held)
        self._load_binaries(bundle, entry, self.binaries, source)
        self.report.load_seconds = time.perf_counter() - start
        return True

    def _use_index(self, bundle: Bundle, entry: Entry, loaded: dict[str, list[str]]) -> None:
        """Explain later misses against the entry's key index: checked now, unpacked when first needed."""
        if unreadable := bundle.read_key_index(entry):
            self._say(Concern.BUNDLE, unreadable, bundle.name)
        keys = {k for kind in ("inductor", "aot_autograd") for k in loaded.get(kind, [])}
        _torchapi.note_bundle_keys(loaded.get("aot_autograd", []), loaded.get("autotune", []))
        name = "this session's warmup" if self.report.own_warmup else f"the bundle {bundle.name}"

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

    def _own(self, bundle: Bundle) -> bool:
        """Whether ``bundle`` holds only what this session's warmup compiled, not PATH's entry."""
        return bundle.path.name == _UNPUBLISHED or (bundle.name == self.fallback.name
                                                    and (self.source is None or self.source.name != bundle.name))

    def _load_binaries(self, bundle: Bundle, entry: Entry, pool: BinaryPool, source: EntryOnDemand) -> None:
        """Put the entry's binaries that fit this machine into the pool, now or (C++ binaries, where torch says
        which folder it builds in) when torch asks for their folder; say why others do not fit."""
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
        self.report.binaries = {"carried": count, "fit": fit, "triton_kernels": carried.triton_counts()["count"],
                                "probes": len(cpp) - count}
        if count and not fit and carried.builds:
            why = "; ".join(identity_differences(identity, pool.identity) for identity in carried.builds.values())
            self._say(Concern.BINARY, f"{bundle.name}: none of its {count} carried binaries fits this machine "
                                      f"({why}); their kernels are built here", bundle.name)

    def _write_marker(self, outcome: Outcome, detail: str = "") -> None:
        WarmupMarker(outcome, self.report.process, detail).write(self.marker)

    def _warm_up_once(self, env: dict[str, str], have_previous: bool) -> bool:
        try:
            return self._warm_up_under_lock(env, have_previous)
        except (NotABundle, NotAFile, Unwritable) as exc:
            # Only --compile-cache-rebuild, which did not read PATH, finds it here: a file that is not a bundle is
            # never written over, and a path with no file (or in a folder this user cannot write) cannot be: the
            # warmup publishes to the session's own.
            if self.publish is not self.source or self.report.warmup_seconds is not None \
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
            if marker is None or marker.outcome not in (Outcome.FAILED, Outcome.KEPT_APART):
                current = self._read_published(env, marker)
            with current if current is not None else contextlib.nullcontext():
                entry = current.find(env) if current is not None else None
                published = (Published.NOTHING if current is None else Published.NO_ENTRY if entry is None
                             else Published.THIS_RUNS_ENTRY if entry.history.get("run") == self.run
                             else Published.EARLIER_ENTRY)
                step = decide(marker.outcome if marker is not None else None, published, self.update,
                              self.rebuild, self.publish is self.source)
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
            note = running_note(self.marker, self.report.process)
            files.write_atomic(note, json.dumps({"pid": os.getpid(), "lock": self.publish.lock_file}).encode(),
                               fsync=False)
            try:
                return self._warm_up_and_publish(env, have_previous)
            finally:
                note.unlink(missing_ok=True)

    def _read_published(self, env: dict[str, str], marker: WarmupMarker | None) -> Bundle | None:
        """What the place the warmup publishes to holds (``None``: nothing, or a damaged bundle it may replace)."""
        try:
            return self.publish.read(env)
        except BundleError as exc:
            rebuilding = self.rebuild and self.publish is self.source
            if isinstance(exc, NotABundle) or marker is not None or not (rebuilding or self.publish.may_be_unreachable):
                raise
            if not rebuilding:  # a damaged bundle is said once, and its rebuild replaces it
                self._say(Concern.BUNDLE, f"{exc}; the warmup runs without it", self.publish.name)
            return None

    def _warm_up_and_publish(self, env: dict[str, str], have_previous: bool) -> bool:
        """Run the warmup hook and publish what it compiled; the caller holds the lock."""
        assert self.run_warmup is not None
        try:
            data = self.run_warmup(self.template if have_previous else None)
        except WarmupFailed as exc:
            self._write_marker(Outcome.FAILED, str(exc))
            self._warmup_failed(str(exc))
            return False
        report, to_path = self.report, self.publish is self.source
        if data is None:
            self._write_marker(Outcome.NOTHING)
            return False
        # The session's own bundle needs no binaries: its readers share the pool on disk already.
        carried = pooled(self.binaries.path.parent) if to_path else None
        addition = make_entry(env, data, _torchapi.describe_artifacts(data), binaries=carried,
                              index=misses.index_for(data))
        seconds = round(report.warmup_seconds or 0.0, 3)
        try:
            saved = self.publish.add([addition], {"warmup_seconds": seconds}, run=self.run,
                                     rebuild=self.rebuild and to_path, counted=False)  # the session's end decides
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
                if self.rebuild and to_path and replaced_unreadable(why):
                    continue  # the repair asked for: the header said it
                self._say(Concern.SAVING, f"{self.publish.name}: {why}", self.publish.name)
            self._write_marker(Outcome.PUBLISHED)
            report.wrote_bundle, report.warmup_found_all = to_path and saved.added, to_path and not saved.added
        with published:
            entry = published.find(env)
            return entry is not None and self._load(published, entry)

    def _warmup_failed(self, message: str, elsewhere: str = "") -> None:
        where = f" (in {elsewhere})" if elsewhere and elsewhere != self.report.process else ""
        self.report.warmup_error = message
        self._status(Status.WARMUP_FAILED, f"the warmup hook failed{where}: {message.splitlines()[0]}")
        self._say(Concern.WARMUP, self.report.reason)
