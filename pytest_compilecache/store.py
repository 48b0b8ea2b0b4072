"""The one owner of a bundle path: consistent reads, and one locked read-modify-write with one merge."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

from . import _torchapi, files, signing
from .binaries import CarriedBinaries
from .bundle import Bundle, BundleError, Entry, NotABundle, env_label, make_entry, read_manifest, write_bundle
from .keyindex import KeyIndex, artifact_id


def env_id(env: dict[str, str]) -> str:
    """A canonical text for an environment, to group entries by."""
    return json.dumps(env, sort_keys=True)


def union(entries: Iterable[Entry], dropped: list[str] | None = None) -> list[Entry]:
    """One entry per environment holding the union of the given entries' artifacts.

    Artifacts are merged over (type, key, content), so guard variants kept under one key survive;
    carried binaries over (build, path). History: what an earlier entry recorded wins (it
    describes the run that first built the entry); later entries only add keys, and tests.
    Every entry's payload and binaries must already be read.

    With the signing key set, an entry read without a valid signature is never merged into one
    that will be signed: beside a vouched-for entry of its environment it is dropped (and said in
    ``dropped``); with none, it is kept as it is, unmerged and unsigned.
    """
    secret = signing.key()
    groups: dict[str, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(env_id(entry.env), []).append(entry)
    merged = []
    for group in groups.values():
        if secret is not None:
            why = {id(e): e.vouched(secret) for e in group}
            trusted = [e for e in group if not why[id(e)]]
            if not trusted:
                merged.extend(group)
                continue
            for entry in group:
                if why[id(entry)] and dropped is not None:
                    dropped.append(f"dropped a bundle entry for {env_label(entry.env)}: {why[id(entry)]} "
                                   f"({signing.KEY_ENV} is set); it was not merged into the signed one")
            group = trusted
        group.sort(key=lambda e: e.created or float("inf"))
        payloads = list(dict.fromkeys(e.payload for e in group if e.payload is not None))
        history: dict[str, object] = {}
        tests: dict[str, object] = {}
        for entry in reversed(group):
            history.update(entry.history)
            if isinstance(entry.history.get("tests"), dict):
                tests.update(entry.history["tests"])
        if tests:
            history["tests"] = tests
        if len(payloads) == 1 and len(group) == 1:
            merged.append(group[0])
            continue
        try:
            for data in payloads:
                _torchapi.check_keys(data)
            payload = _torchapi.merge_artifacts(payloads) if len(payloads) > 1 else payloads[0]
            artifacts = _torchapi.describe_artifacts(payload)
            keys = {key for _, key, _ in _torchapi.artifact_sizes(payload)}
        except _torchapi.MegaCacheError as exc:
            raise BundleError(f"cannot merge the entries for {env_label(group[0].env)}: {exc}") from None
        created = min((e.created for e in group if e.created), default=0.0)
        binaries = CarriedBinaries.union(e.binaries for e in reversed(group) if e.binaries is not None)
        index = KeyIndex.union(e.index for e in group if e.index is not None).restricted(keys)
        entry = make_entry(group[0].env, payload, artifacts, created, binaries, index)
        entry.history = history
        merged.append(entry)
    return merged


class BundleStore:
    """A bundle path, its lock (``PATH.lock``, there only while held: see :class:`files.PathLock`),
    and the only code that reads or writes it."""

    def __init__(self, path: Path, lock_timeout: float) -> None:
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        self._lock = files.PathLock(str(self.path) + ".lock")
        #: What the last :meth:`add` left out (entries not vouched for), in words.
        self.dropped: list[str] = []
        #: ``{artifact type: count}`` the last :meth:`add` dropped as unused in too many updating runs.
        self.unused: dict[str, int] = {}

    @property
    def name(self) -> str:
        """The bundle as the user named it, for messages."""
        return str(self.path)

    def read(self, env: Mapping[str, str] | None = None) -> Bundle | None:
        """The bundle as it is now (its file kept open for payload reads), or ``None`` if missing.

        ``env`` (the entry the reader wants) matters only to stores that copy bundles from elsewhere.
        An empty file counts as missing: it holds nothing to lose, and writes always replace whole files."""
        try:
            if self.path.stat().st_size == 0:
                return None
            return read_manifest(self.path)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            blocked = next((p for p in self.path.parents if p.exists() and not p.is_dir()), self.path.parent)
            raise BundleError(f"{self.path}: cannot be read or written: {blocked} is a file, not a folder") from None
        except OSError as exc:
            raise BundleError(f"{self.path}: cannot read: {exc.strerror or exc}") from None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold ``PATH.lock`` (reentrant in one process), or raise :class:`BundleError` naming it."""
        lock_file = str(self.path) + ".lock"
        folder = self.path.parent
        blocked = next((p for p in [folder, *folder.parents] if p.exists() and not p.is_dir()), None)
        if blocked is not None:
            raise BundleError(f"{lock_file}: cannot create the lock file: {blocked} is not a folder")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._lock.acquire(timeout=self.lock_timeout)
        except files.LockTimeout:
            holders = files.lock_holders(lock_file)
            who = f"held by {', '.join(holders)}" if holders else "another process holds it"
            raise BundleError(
                f"{lock_file}: could not take the lock within {self.lock_timeout:g} s "
                f"({who}; raise --compile-cache-lock-timeout)"
            ) from None
        except OSError as exc:
            raise BundleError(f"{lock_file}: cannot create the lock file: {exc.strerror or exc}") from None
        try:
            yield
        finally:
            self._lock.release()

    def update(self, change: Callable[[Bundle | None], list[Entry] | None],
               replace_unreadable: bool = False) -> Bundle | None:
        """Under the lock: read PATH, let ``change`` compute the new entries, write them atomically.

        ``change`` returns ``None`` to leave PATH as it is. Returns the bundle now at PATH. With
        ``replace_unreadable``, a PATH that is a bundle but cannot be read (corrupt, truncated) counts
        as empty, and :attr:`dropped` says so; a file that is not a bundle is never replaced.
        """
        with self.locked():
            files.remove_leftovers(self.path)
            try:
                current = self.read()
                if current is not None:
                    current.read_all()
            except NotABundle:
                raise
            except BundleError as exc:
                if not replace_unreadable:
                    raise
                self.dropped.append(f"it could not be read ({exc}); its entries were dropped and a fresh one written")
                current = None
            try:
                entries = change(current)
                if entries is None:
                    return current
                result = Bundle(self.path, entries)
                write_bundle(result)
                return result
            finally:
                if current is not None:
                    current.close()

    def add(self, additions: list[Entry], history: Mapping[str, object] | None = None, run: float | None = None,
            max_unused_runs: int = 0, rebuild: bool = False) -> Bundle:
        """Merge ``additions`` (new payloads, each with its environment) into PATH: the union.

        ``run`` (the session's start) is noted as an updating run that used every artifact of the
        additions; with ``max_unused_runs``, artifacts of those environments that none of their last
        that many runs used are dropped. With ``rebuild``, what PATH holds for the additions'
        environments is replaced, unless this same run wrote it (a rebuilding session's first
        write replaces, its later writes merge).
        """
        self.dropped, self.unused = [], {}
        stamp(additions, history, run)
        result = self.update(lambda current: combine(current, additions, run, max_unused_runs, rebuild,
                                                     self.dropped, self.unused),
                             replace_unreadable=rebuild)
        assert result is not None
        return result


def stamp(additions: list[Entry], history: Mapping[str, object] | None, run: float | None) -> None:
    """Give new entries the session's history, their creation time, and (with ``run``) a note that
    this run used every artifact they hold."""
    now = time.time()
    for entry in additions:
        entry.history = {**(history or {}), **({"run": run} if run is not None else {}), **entry.history}
        entry.created = entry.created or now
        if run is not None:
            used = [artifact_id(kind, key) for kind, key, _ in _torchapi.artifact_sizes(bundle_payload(entry))]
            entry.index = KeyIndex.union([entry.index or KeyIndex()])
            entry.index.note_run(run, used)
            entry.reset_index()


def combine(current: Bundle | None, additions: list[Entry], run: float | None, max_unused_runs: int, rebuild: bool,
            dropped: list[str], unused: dict[str, int]) -> list[Entry]:
    """The entries of ``current`` with the (stamped) ``additions`` merged in; see :meth:`BundleStore.add`.

    What was left out is said in ``dropped``; artifacts dropped as unused are counted in ``unused``.
    """
    touched = {env_id(e.env) for e in additions}
    existing = list(current.entries) if current else []
    if rebuild:
        existing = [e for e in existing if env_id(e.env) not in touched or e.history.get("run") == run]
    merged = union([*existing, *additions], dropped)
    if max_unused_runs > 0:
        merged = [_without_unused(e, max_unused_runs, unused) if env_id(e.env) in touched else e for e in merged]
    return merged


def adds_nothing(current: Bundle | None, additions: list[Entry]) -> bool:
    """Whether every artifact and carried binary of ``additions`` is already in ``current`` (read whole),
    in an entry that a write would not change (with the signing key set: one that is vouched for)."""
    if current is None:
        return False
    secret = signing.key()
    for entry in additions:
        have = current.find(entry.env)
        if have is None or (secret is not None and have.vouched(secret)):
            return False
        if not _torchapi.artifact_identities(bundle_payload(entry)) <= _torchapi.artifact_identities(bundle_payload(have)):
            return False
        carried = entry.binaries.files if entry.binaries else {}
        held = have.binaries.files if have.binaries else {}
        if any(key not in held for key in carried):
            return False
    return True


def _without_unused(entry: Entry, runs: int, counts: dict[str, int]) -> Entry:
    """``entry`` without the artifacts none of its last ``runs`` updating runs used (counted in ``counts``)."""
    if entry.index is None:
        return entry
    sizes = _torchapi.artifact_sizes(bundle_payload(entry))
    unused = entry.index.unused_for(runs, [artifact_id(kind, key) for kind, key, _ in sizes])
    if not unused:
        return entry
    payload, dropped = _torchapi.select_artifacts(bundle_payload(entry),
                                                  lambda kind, key: artifact_id(kind, key) not in unused)
    for kind, n in dropped.items():
        counts[kind] = counts.get(kind, 0) + n
    kept = {key for kind, key, _ in sizes if artifact_id(kind, key) not in unused}
    return entry.with_payload(payload, _torchapi.describe_artifacts(payload), entry.index.restricted(kept))


def bundle_payload(entry: Entry) -> bytes:
    """The payload of an entry already read (or made here)."""
    if entry.payload is None:
        raise BundleError(f"the payload for {env_label(entry.env)} was not read")
    return entry.payload
