"""A bundle at a URL (fsspec: s3://, gs://, az://, http(s)://, memory://), read through this
machine's copies and written conditionally."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import files
from ..bundle.format import Bundle, BundleError, Entry, NotABundle, encoded_size, parse, read_manifest, write_bundle
from .client import Client
from .copies import Copies
from .deadlines import DEFAULT_TIMEOUT
from .deltas import Deltas
from .errors import Conflict
from .interface import Look, Saved, Transfer, Version, Written
from .merge import Combined, New, adds_nothing, combine, env_id, stamp, what_is_new
from .ranges import HEAD_BYTES, Ranges
from .urls import redacted

#: How many times a conditional write is tried (with a fresh read each time) before giving up.
ATTEMPTS = 8


class UrlStore:
    """A bundle at a URL (see :class:`.interface.BundleStore`); ``copies`` is the folder of this
    machine's copies of bundles at URLs, this URL's in a folder of their own under it. Every request
    has a deadline (``network_timeout``, :mod:`.deadlines`); ``unreachable`` is why another process of
    the session stopped asking the store (then this one never asks).

    Reading asks the object's version first and uses this machine's copy of that version as it is;
    otherwise the manifest is read by a range request and only the wanted entry is downloaded (by
    ranges too) and checked before it is kept as the copy. Writing folds the additions in with a
    conditional write (:mod:`.writers`), reading again and retrying on conflict; where the store has
    none, or the write fails, the additions go to a delta (:mod:`.deltas`) instead, and that is said.
    No reader ever sees a half-written object. fsspec is imported only when a URL is used; no torch.
    """

    def __init__(self, url: str, copies: Path, lock_timeout: float,
                 storage_options: Mapping[str, Any] | None = None, network_timeout: float = DEFAULT_TIMEOUT,
                 unreachable: str = "") -> None:
        self.client = Client(url, storage_options, network_timeout)
        self.client.deadlines.gave_up = unreachable
        folder = Path(copies) / hashlib.sha256(redacted(url).encode()).hexdigest()[:16]
        self.copies = Copies(folder, self.client.name, lock_timeout)
        self._deltas = Deltas(self.client, folder)

    @property
    def name(self) -> str:
        """The URL as messages show it (:func:`.urls.redacted`)."""
        return self.client.name

    @property
    def lock_file(self) -> str:
        """This machine's writers' lock for the URL, in its folder of copies."""
        return self.copies.writers.file

    @property
    def deltas(self) -> str:
        """The folder of deltas beside the bundle."""
        return self._deltas.url

    @property
    def may_be_unreachable(self) -> bool:
        """A network and a server stand between this machine and the bundle."""
        return True

    @property
    def unreachable(self) -> str:
        """Why this process no longer asks the store ("" while it answers)."""
        return self.client.deadlines.gave_up

    @property
    def transfer(self) -> Transfer:
        """Bytes this object downloaded and uploaded, and its conditional writes retried."""
        return Transfer(True, self.client.downloaded, self.client.uploaded, self.client.conflicts)

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold this machine's writers' lock for the URL (a session's warmup holds it while it runs)."""
        return self.copies.writers.held()

    def version(self) -> Version | None:
        """The object's version now, or ``None`` when it does not exist. A size of 0 means unknown."""
        return self.client.version()

    def holds(self, version: Version) -> bool:
        """Whether this machine keeps a copy of ``version`` of the object (of all or part of it)."""
        return self.copies.holds(version)

    def describe(self) -> Look:
        """The object's size and version, and whether this machine keeps a copy (one request, nothing downloaded)."""
        try:
            version = self.version()
        except BundleError as exc:
            return Look(str(exc), True, str(exc))
        if version is None:
            return Look(f"{self.name}: missing, the session will create it", False)
        kept = "; this machine keeps a copy of this version" if self.holds(version) else ""
        return Look(f"{self.name}: {version.size / 1e6:.1f} MB, version {version.tag or '(none given)'}{kept}", True)

    # --- reading ---

    def read(self, env: Mapping[str, str] | None = None) -> Bundle | None:
        """The bundle (through this machine's copy), or ``None`` if there is no object at the URL.

        With ``env``, only that entry is downloaded, and it comes back read and checked (payload and
        carried binaries); a bundle with no entry for ``env`` is returned with its manifest only. A copy
        whose payload or carried binaries fail their checksum is downloaded again. Messages name the URL.
        """
        with self.copies.readers.held():
            for attempt in range(2):
                version = self.version()
                if version is None:
                    return None
                held = self.copies.held(version, env)
                if held is not None:
                    try:
                        bundle = read_manifest(held, label=self.name)
                    except (BundleError, FileNotFoundError):  # corrupt, or removed by a writer just now
                        held.unlink(missing_ok=True)
                    else:
                        try:
                            entry = bundle.find(env) if env is not None else None
                            if entry is not None:
                                bundle.payload(entry)
                                bundle.carried(entry)
                            return bundle
                        except BundleError:
                            bundle.close()
                            held.unlink(missing_ok=True)
                try:
                    return self._fetch(version, env)
                except BundleError as exc:
                    if attempt == 0 and self.version() != version:
                        continue  # replaced while it was read: once more, from the new version
                    raise exc
        raise AssertionError("unreachable")

    def _fetch(self, version: Version, env: Mapping[str, str] | None) -> Bundle:
        """Read the manifest by range, then only the wanted entries' sections; keep them as a copy."""
        fetched = self.copies.folder / "fetch"
        raw: Ranges | None = None
        shown = contextlib.ExitStack()
        if version.size:
            raw = Ranges(self.client.read_range, version.size,
                         shown.enter_context(self.client.progress.transfer("downloading", version.size)))
            try:
                remote = Bundle.over(raw, fetched, self.name, head=HEAD_BYTES)
            except BaseException:
                shown.close()
                raise
        else:  # a server that gives no size: the whole object, once
            remote = parse(io.BytesIO(self.client.cat()), fetched, self.name)
        try:
            wanted = remote.entries if env is None else [e for e in [remote.find(env)] if e is not None]
            if env is not None and not wanted:
                return remote
            for entry in wanted:
                remote.read_entry(entry)
        finally:
            remote.close()
            shown.close()
        whole = len(wanted) == len(remote.entries)
        kept = self.copies.keep(Bundle(fetched, wanted), version, None if whole else env)
        if kept is None:
            return Bundle(fetched, wanted, label=self.name)
        found = kept.find(env) if env is not None else None
        if found is not None:  # as a held copy is returned: the reader's entry read and checked
            kept.payload(found)
            kept.carried(found)
        return kept

    def read_whole(self) -> tuple[Version | None, Bundle | None]:
        """The object's version and the whole bundle, read (every payload checked), for a writer.

        Raises :class:`NotABundle` for an object that is not a bundle at all, :class:`BundleError`
        for one that cannot be read, :class:`Conflict` when it changed while it was read."""
        return self._read_whole(False, [])

    def _read_whole(self, replace_unreadable: bool, dropped: list[str]) -> tuple[Version | None, Bundle | None]:
        """:meth:`read_whole`; with ``replace_unreadable``, a bundle whose downloaded bytes cannot be
        read counts as empty (said in ``dropped``); nothing is replaced where the store cannot be read."""
        version = self.version()
        if version is None:
            return None, None
        held = self.copies.held(version, None)
        if held is not None:
            try:
                current = read_manifest(held, label=self.name)
                current.read_all()
                return version, current
            except (BundleError, FileNotFoundError):
                held.unlink(missing_ok=True)
        data = self.client.cat()
        if version.size and len(data) != version.size:
            raise Conflict("the object changed while it was read")
        try:
            downloaded = parse(io.BytesIO(data), self.copies.folder / "fetch", self.name)
            downloaded.read_all()
        except NotABundle:
            raise
        except BundleError as exc:
            if not replace_unreadable:
                raise
            dropped.append(f"it could not be read ({exc}); its entries were dropped and a fresh one written")
            return version, None
        kept = self.copies.keep(downloaded, version, None)
        if kept is not None:
            downloaded.path = kept.path
            kept.close()
        return version, downloaded

    # --- writing ---

    def write_warning(self) -> str:
        """Why a write here cannot be safe against other writers: no conditional write ("" where there is one)."""
        if self.client.writer.conditional:
            return ""
        return (f"{self.client.protocol}:// offers no conditional write this plugin can use; it is written without "
                "one, so run this where no other writer runs (a final CI job)")

    def update(self, change: Callable[[Bundle | None], list[Entry] | None],
               unconditional: bool = False) -> Bundle | None:
        """Read the bundle, let ``change`` compute the new entries, write them if the object is still the
        version read; on conflict, again from a fresh read. ``change`` returns ``None`` to leave it.

        Raises :class:`.errors.NoConditionalWrite` where the store has none (nothing is written then),
        unless ``unconditional``: then it writes without a condition.
        """
        return self._update(change, [], unconditional=unconditional)

    def _update(self, change: Callable[[Bundle | None], list[Entry] | None], dropped: list[str],
                replace_unreadable: bool = False, unconditional: bool = False) -> Bundle | None:
        """:meth:`update`, reading with ``replace_unreadable`` (see :meth:`_read_whole`); what an attempt
        said in ``dropped`` is taken back when it is retried."""
        said = len(dropped)
        for attempt in range(ATTEMPTS):
            del dropped[said:]
            with self.locked():
                current: Bundle | None = None
                staging = self.copies.folder / f"upload-{os.getpid()}.bundle"
                try:
                    version, current = self._read_whole(replace_unreadable, dropped)
                    entries = change(current)
                    if entries is None:
                        return current
                    write_bundle(Bundle(staging, entries))
                    data = staging.read_bytes()
                    tag = self.client.put(data, version, unconditional)
                except Conflict:
                    self.client.conflicts += 1
                else:
                    written = Version(tag, len(data))
                    target = self.copies.path(written, None) if tag else self.copies.folder / "written-untagged.bundle"
                    result = read_manifest(staging, label=self.name)  # open before another process can remove it
                    files.replace(staging, target)
                    result.path = target
                    if tag:
                        self.copies.forget_others(written)
                    return result
                finally:
                    staging.unlink(missing_ok=True)
                    if current is not None:
                        current.close()
            time.sleep(random.uniform(0.05, 0.25) * 2 ** min(attempt, 4))
        raise BundleError(f"{self.name}: other writers changed it {ATTEMPTS} times while this run tried to "
                          "fold its artifacts in")

    def _holds_already(self, additions: list[Entry]) -> Bundle | None:
        """The bundle (through this machine's copy of each addition's entry) when it already holds
        every addition, so that nothing needs writing; else ``None``."""
        envs = {env_id(e.env): e.env for e in additions}
        if len(envs) != 1:
            try:
                _, current = self.read_whole()
            except (Conflict, BundleError):
                return None
            if current is not None and not adds_nothing(current, additions):
                current.close()
                return None
            return current
        env = next(iter(envs.values()))
        try:
            current = self.read(env)
        except BundleError:
            return None  # the update reads it again, and says what is wrong
        if current is not None and not adds_nothing(current, additions):
            current.close()
            return None
        return current

    def add(self, additions: list[Entry], history: Mapping[str, object] | None = None, run: float | None = None,
            max_unused_runs: int = 0, rebuild: bool = False) -> Saved:
        """Publish ``additions`` (see :meth:`.interface.BundleStore.add`): nothing when the bundle already
        holds them (only this machine's entry is read for that); else into the bundle itself by conditional write.

        Where the store has no conditional write, the additions are uploaded as a delta (said in the
        outcome's note). Where the bundle cannot be updated (other writers won every attempt, the
        store failed), a delta is left too, and the :class:`BundleError` raised says where.
        """
        before = self.transfer
        if self.client.writer.read_only:
            raise BundleError(f"{self.name}: {self.client.protocol}:// bundles are read-only; this run's artifacts "
                              "were not published (publish to an object store such as s3:// and serve that over HTTP)")
        stamp(additions, history, run)
        if not rebuild and max_unused_runs == 0:
            with self.locked():
                held = self._holds_already(additions)
            if held is not None:
                return Saved(held, Written.UNCHANGED, size=self.client.size, transfer=self.transfer.since(before))
        if not self.client.writer.conditional:
            delta, bundle = self._deltas.upload(additions)
            note = (f"{self.client.protocol}:// offers no conditional write this plugin can use, so the bundle itself "
                    f"is never written by a session; `pytest-compilecache merge --deltas -o {self.name}` "
                    "folds the deltas in")
            return Saved(bundle, Written.DELTA, size=_size(bundle), delta=delta, note=note,
                         transfer=self.transfer.since(before))
        dropped: list[str] = []
        combined: list[Combined] = []
        new: list[New] = []

        def change(current: Bundle | None) -> list[Entry]:
            new.append(what_is_new(current, additions))
            combined.append(combine(current, additions, run=run, max_unused_runs=max_unused_runs, rebuild=rebuild))
            return combined[-1].entries

        try:
            result = self._update(change, dropped, replace_unreadable=rebuild)
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
        assert result is not None
        return Saved(result, size=_size(result), dropped=(*dropped, *combined[-1].dropped),
                     unused=combined[-1].unused, transfer=self.transfer.since(before), added=not new[-1].nothing, added_artifacts=new[-1].counts)

    def list_deltas(self) -> list[str]:
        """The URLs of the deltas waiting beside the bundle."""
        return self._deltas.waiting()

    def remove_deltas(self, urls: list[str]) -> list[str]:
        """Remove deltas once they are folded into the bundle; those that could not be removed."""
        return self._deltas.remove(urls)


def _size(bundle: Bundle) -> int:
    """The size of a bundle just written (or kept)."""
    return bundle.path.stat().st_size if bundle.path.is_file() else encoded_size(bundle)


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
