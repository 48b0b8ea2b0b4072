"""A bundle at a URL (fsspec: s3://, gs://, az://, http(s)://, memory://), read through copies, written safely."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import files
from ..bundle.format import Bundle, BundleError, Entry, NotABundle, read_manifest, write_bundle
from .client import Client
from .copies import Copies
from .deadlines import DEFAULT_TIMEOUT
from .deltas import Deltas
from .errors import Conflict
from .interface import REPLACED_UNREADABLE, Look, Saved, Transfer, Version, Written
from .merge import env_id, fold, stamp, what_is_new, written_size
from .ranges import HEAD_BYTES, Ranges, download
from .urls import redacted

#: How many times a conditional write is tried (with a fresh read each time) before giving up.
ATTEMPTS = 8


class UrlStore:
    """A bundle at a URL (docs/urls.md), read by range requests through this machine's copies under ``copies``,
    written conditionally (else as a delta); ``unreachable``: as in :func:`.stores.open_store`."""

    #: A network and a server stand between this machine and the bundle.
    may_be_unreachable = True

    def __init__(self, url: str, copies: Path, lock_timeout: float,
                 storage_options: Mapping[str, Any] | None = None, network_timeout: float = DEFAULT_TIMEOUT,
                 unreachable: str = "") -> None:
        self.client = Client(url, storage_options, network_timeout)
        self.client.deadlines.gave_up = unreachable
        folder = Path(copies) / hashlib.sha256(redacted(url).encode()).hexdigest()[:16]
        self.copies = Copies(folder, self.client.name, lock_timeout)
        self._deltas = Deltas(self.client, folder)
        self.name = self.client.name
        self.lock_file = self.copies.writers.file
        self.deltas = self._deltas.url
        #: The object's version now (``None``: missing), the writers' lock, and the deltas' listing and removal.
        self.version = self.client.version
        self.locked = self.copies.writers.held
        self.list_deltas = self._deltas.waiting
        self.remove_deltas = self._deltas.remove

    @property
    def unreachable(self) -> str:
        """Why this process no longer asks the store ("" while it answers)."""
        return self.client.deadlines.gave_up

    @property
    def transfer(self) -> Transfer:
        """Bytes this object downloaded and uploaded, and its conditional writes retried."""
        return Transfer(True, self.client.downloaded, self.client.uploaded, self.client.conflicts)

    def describe(self) -> Look:
        """The object's size and version, and whether this machine keeps a copy (one request, nothing downloaded)."""
        try:
            version = self.version()
        except BundleError as exc:
            return Look(str(exc), True, str(exc))
        if version is None:
            return Look(f"{self.name}: missing, the session will create it", False)
        kept = "; this machine keeps a copy of this version" if self.copies.holds(version) else ""
        return Look(f"{self.name}: {version.size / 1e6:.1f} MB, version {version.tag or '(none given)'}{kept}", True)

    def read(self, env: Mapping[str, str] | None = None) -> Bundle | None:
        """The bundle (through this machine's copy), or ``None``; with ``env``, only that entry is read, and checked."""
        with self.copies.readers.held():
            for attempt in range(2):
                version = self.version()
                if version is None:
                    return None
                held = self._held(version, env)
                if held is not None:
                    return held
                try:
                    return self._fetch(version, env)
                except BundleError as exc:
                    if attempt == 0 and self.version() != version:
                        continue  # replaced while it was read: once more, from the new version
                    raise exc
        raise AssertionError("unreachable")

    def _held(self, version: Version, env: Mapping[str, str] | None, whole: bool = False) -> Bundle | None:
        """This machine's copy of ``version``, read ``whole`` or ``env``'s entry checked; one that fails is removed."""
        held = self.copies.held(version, env)
        if held is None:
            return None
        bundle = None
        try:
            bundle = read_manifest(held, label=self.name)
            if whole:
                bundle.read_all()
            return _checked(bundle, env)
        except (BundleError, FileNotFoundError):  # corrupt, or removed by a writer just now
            if bundle is not None:
                bundle.close()
            held.unlink(missing_ok=True)
            return None

    def _fetch(self, version: Version, env: Mapping[str, str] | None) -> Bundle:
        """Read the manifest by range, then download only the wanted entries' sections into a file, a chunk at a
        time; check them, and keep them as this machine's copy (where that cannot be written, read them from the
        download)."""
        part = self._download_file()
        local: Bundle | None = None
        try:
            if not version.size:  # a server that gives no size: the whole object, once
                part.write_bytes(self.client.cat())
            else:
                with self.client.progress.transfer("downloading", version.size) as moved:
                    raw = Ranges(self.client.read_range, version.size, moved)
                    with Bundle.over(raw, part, self.name, head=HEAD_BYTES) as remote:
                        wanted = _wanted(remote, env)
                    if not wanted:
                        return remote
                    spans = [(0, version.size)] if len(wanted) == len(remote.entries) else remote.spans(wanted)
                    download(self.client.read_range, version.size, spans, part, moved, raw.known(), raw.moved)
            if self.version() != version:
                raise BundleError(f"{self.name}: it changed while it was read")
            local = read_manifest(part, label=self.name)
            wanted = _wanted(local, env)
            for entry in wanted:
                local.check_all(entry)
            if len(wanted) == len(local.entries):
                kept = self._adopt(part, version)
                if kept is not None:
                    local.path = kept
                return local
            try:
                copy = self.copies.keep(Bundle(part, wanted), version, env)
            except BundleError:
                copy = None  # this machine cannot write its copy: the download serves
            if copy is None:
                return local
            local.release()
            local = copy
            return _checked(copy, env)
        except BaseException as exc:
            if local is not None:
                local.release()
            if isinstance(exc, OSError):
                raise self._no_room(exc) from None
            raise
        finally:
            part.unlink(missing_ok=True)  # unless adopted; the bundle read from it keeps it open

    def _download_file(self) -> Path:
        """:meth:`.copies.Copies.download`, its failure said as :meth:`_no_room`."""
        try:
            return self.copies.download()
        except OSError as exc:
            raise self._no_room(exc) from None

    def _no_room(self, exc: OSError) -> BundleError:
        """A download that could not be written on this machine, said as a problem of the bundle's copies."""
        return BundleError(f"{self.name}: cannot download it into {self.copies.folder}: {exc.strerror or exc}")

    def _adopt(self, part: Path, version: Version) -> Path | None:
        """:meth:`.copies.Copies.adopt`, or ``None`` where the copy cannot be written (the download serves)."""
        try:
            return self.copies.adopt(part, version)
        except OSError:
            return None

    def read_whole(self, dropped: list[str] | None = None) -> tuple[Version | None, Bundle | None]:
        """The object's version and the whole bundle, read, for a writer (``dropped``: as in :meth:`update`):
        downloaded into a file a chunk at a time where this machine's copy is not current. Raises
        :class:`NotABundle`, :class:`BundleError`, or :class:`Conflict` when it changed while read."""
        version = self.version()
        if version is None:
            return None, None
        held = self._held(version, None, whole=True)
        if held is not None:
            return version, held
        part = self._download_file()
        downloaded: Bundle | None = None
        try:
            try:
                if not version.size:
                    part.write_bytes(self.client.cat())
                else:
                    with self.client.progress.transfer("downloading", version.size) as moved:
                        download(self.client.read_range, version.size, [(0, version.size)], part, moved)
            except OSError as exc:
                raise self._no_room(exc) from None
            if self.version() != version:
                raise Conflict("the object changed while it was read")
            try:
                downloaded = read_manifest(part, label=self.name)
                downloaded.read_all()
            except NotABundle:
                raise
            except BundleError as exc:  # the object itself, read whole: unreadable
                if dropped is None:
                    raise
                dropped.append(f"{REPLACED_UNREADABLE} ({exc}); its entries were dropped and a fresh one written")
                return version, None
            kept = self._adopt(part, version)
            if kept is not None:
                downloaded.path = kept
            return version, downloaded
        except BaseException:
            if downloaded is not None:
                downloaded.release()
            raise
        finally:
            part.unlink(missing_ok=True)  # unless adopted; the bundle read from it keeps it open

    def write_warning(self) -> str:
        """Why a write here cannot be safe against other writers: no conditional write ("" where there is one)."""
        return "" if self.client.writer.conditional else (
            f"{self.client.protocol}:// offers no conditional write this plugin can use; it is written without one, so "
            "run this where no other writer runs (a final CI job)")

    def update(self, change: Callable[[Bundle | None], list[Entry] | None], unconditional: bool = False,
               dropped: list[str] | None = None) -> Bundle | None:
        """:meth:`.interface.BundleStore.update` by conditional write, retried from a fresh read on conflict; raises
        :class:`.errors.NoConditionalWrite` where the store has none, unless ``unconditional``."""
        said = len(dropped) if dropped is not None else 0
        for attempt in range(ATTEMPTS):
            if dropped is not None:
                del dropped[said:]
            with self.locked():
                current: Bundle | None = None
                staging = self.copies.folder / f"upload-{os.getpid()}.bundle"
                try:
                    version, current = self.read_whole(dropped)
                    entries = change(current)
                    if entries is None:
                        kept, current = current, None  # the caller's now
                        return kept
                    size = write_bundle(Bundle(staging, entries))
                    tag = self.client.put(staging, version, unconditional)
                except Conflict:
                    self.client.conflicts += 1
                else:
                    written = Version(tag, size)
                    target = self.copies.path(written, None) if tag else self.copies.folder / "written-untagged.bundle"
                    result = read_manifest(staging, label=self.name)  # open before another process can remove it
                    files.replace(staging, target)
                    result.path = target
                    if tag:
                        self.copies.forget_others(written)
                    return result
                finally:
                    with contextlib.suppress(OSError):  # Windows: an upload given up on may still hold it open
                        staging.unlink(missing_ok=True)
                    if current is not None:
                        current.release()
            time.sleep(random.uniform(0.05, 0.25) * 2 ** min(attempt, 4))
        raise BundleError(f"{self.name}: other writers changed it {ATTEMPTS} times while this run tried to "
                          "fold its artifacts in")

    def _holds_already(self, additions: list[Entry]) -> Bundle | None:
        """The bundle when it already holds every addition (through this machine's copy), else ``None``."""
        envs = {env_id(e.env): e.env for e in additions}
        try:
            current = self.read(next(iter(envs.values()))) if len(envs) == 1 else self.read_whole()[1]
        except (Conflict, BundleError):
            return None  # the update reads it again, and says what is wrong
        if current is not None and not what_is_new(current, additions).nothing:
            current.close()
            return None
        return current

    def add(self, additions: list[Entry], history: Mapping[str, object] | None = None, run: float | None = None,
            max_unused_runs: int = 0, rebuild: bool = False, counted: bool = True) -> Saved:
        """Publish ``additions`` (see :meth:`.interface.BundleStore.add`), as a delta where no conditional write can."""
        before = self.transfer
        if self.client.writer.read_only:
            raise BundleError(f"{self.name}: {self.client.protocol}:// bundles are read-only; this run's artifacts "
                              "were not published (publish to an object store such as s3:// and serve that over HTTP)")
        stamp(additions, history, run, counted)
        if not rebuild:
            with self.locked():
                held = self._holds_already(additions)
            if held is not None:
                return Saved(held, Written.UNCHANGED, size=self.client.size, transfer=self.transfer.since(before))
        if not self.client.writer.conditional:
            delta, bundle = self._deltas.upload(additions)
            note = (f"{self.client.protocol}:// offers no conditional write this plugin can use, so the bundle itself "
                    f"is never written by a session; `pytest-compilecache merge --deltas -o {self.name}` "
                    "folds the deltas in")
            return Saved(bundle, Written.DELTA, size=written_size(bundle), delta=delta, note=note,
                         transfer=self.transfer.since(before))
        try:
            saved = fold(self.update, additions, run=run, max_unused_runs=max_unused_runs, rebuild=rebuild)
        except NotABundle:
            raise
        except BundleError as exc:
            try:
                delta, kept = self._deltas.upload(additions)
            except BundleError:
                raise exc from None
            kept.close()
            raise BundleError(f"{exc}; this run's artifacts wait in {delta} for "
                              f"`pytest-compilecache merge --deltas -o {self.name}`") from None
        return replace(saved, transfer=self.transfer.since(before))


def _wanted(bundle: Bundle, env: Mapping[str, str] | None) -> list[Entry]:
    """``env``'s entry of ``bundle`` (none where it has none), or every entry where ``env`` is ``None``."""
    return bundle.entries if env is None else [e for e in [bundle.find(env)] if e is not None]


def _checked(bundle: Bundle, env: Mapping[str, str] | None) -> Bundle:
    """``bundle``, with ``env``'s entry (if it has one) read and checked: payload and carried binaries."""
    entry = bundle.find(env) if env is not None else None
    if entry is not None:
        bundle.check(entry)
        bundle.carried(entry)
    return bundle


def read_url(url: str, copies: Path, storage_options: Mapping[str, Any] | None = None,
             network_timeout: float = DEFAULT_TIMEOUT) -> Bundle:
    """The whole bundle at ``url`` (every payload downloaded and checked), for the command line."""
    store = UrlStore(url, copies, 60.0, storage_options, network_timeout)
    for _ in range(2):
        try:
            _, bundle = store.read_whole()
        except Conflict:
            continue
        if bundle is None:
            raise FileNotFoundError(store.name)
        return bundle
    raise BundleError(f"{store.name}: it changed while it was read, twice; try again")
