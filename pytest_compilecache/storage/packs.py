"""A bundle at a URL as packs (docs/urls.md): bundle files that never change, under ``URL/packs/``, named by their
content. A reader lists them and reads by range only what it uses; a writer adds one pack of what the others lack."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from .. import files
from ..caught import caught
from ..bundle import signing
from ..bundle.binaries import CarriedBinaries
from ..bundle.format import Bundle, BundleError, Entry, NotAFile, Unwritable
from ..bundle.writing import write_bundle
from ..bundle.keyindex import KeyIndex
from ..bundle.members import Members
from ..words import counted
from .client import Client
from .errors import DEFAULT_TIMEOUT, StoreError
from .interface import REPLACED_UNREADABLE, BundleStore, Look, Saved, Transfer, Written
from .local import LocalStore, Lock
from ..bundle.merge import _union, env_id, mergeable, stamp, what_is_new
from .ranges import CHUNK_BYTES, HEAD_BYTES, Ranges
from .urls import file_url_path, is_url, redacted

#: The folder of packs under the URL.
PACKS = "packs"
#: How long a pack that a compaction replaced stays, for readers that listed it before (see docs/urls.md).
GRACE_SECONDS = 24 * 3600.0
#: Ranges of one pack this close are asked as one request (the bytes between are cheaper than a request).
_GAP = 256 * 1024

#: Where bytes lie: a pack's name ("": the object at the URL itself), first byte, end.
Span = tuple[str, int, int]


@dataclass
class PackedBundle(Bundle):
    """The union of a URL's packs: what each entry holds is read by range when asked, or by :meth:`fetch_ahead`."""

    #: Per environment, the packs' entries it joins: (pack name, pack, entry).
    _parts: dict[str, list[tuple[str, Bundle, Entry]]] = field(default_factory=dict, repr=False)
    _fetch: Callable[[list[Span]], None] = field(default=lambda spans: None, repr=False)
    #: The environments whose packs' key indexes are read when a miss first needs them.
    _later: set[str] = field(default_factory=set, repr=False)
    #: Entries left out beside signed ones (the signing key set), in words: said where a write happens.
    unvouched: list[str] = field(default_factory=list)

    def fetch_ahead(self, entry: Entry) -> None:
        """Download every artifact and binary of ``entry`` not yet on this machine, a few requests at once."""
        self._fetch([span for part in self._parts.get(env_id(entry.env), []) for span in _spans(*part)])

    def read_key_index(self, entry: Entry) -> str:
        """Nothing yet where the packs' key indexes are read when first needed (see :meth:`key_index`)."""
        return "" if env_id(entry.env) in self._later else super().read_key_index(entry)

    def key_index(self, entry: Entry) -> tuple[KeyIndex | None, str]:
        """The union of the key indexes of the packs that hold ``entry``, each downloaded and checked now."""
        if env_id(entry.env) not in self._later:
            return super().key_index(entry)
        self._later.remove(env_id(entry.env))
        read, problems = [], []
        for _, bundle, part in self._parts[env_id(entry.env)]:
            index, problem = bundle.key_index(part)
            problems += [problem] if problem else []
            read += [index] if index is not None else []
        entry.index = KeyIndex.union(read) if read else None
        return entry.index, problems[0] if problems and not read else ""

    def signature_problem(self, entry: Entry, secret: bytes) -> str:
        """An entry put together from packs was made of those vouched for, each checked when read."""
        return super().signature_problem(entry, secret) if entry.from_file else ""


class PackStore:
    """A bundle at a URL (see :class:`.interface.BundleStore`), its packs' bytes kept on this machine under
    ``copies`` once read (a pack never changes); ``unreachable``: as in :func:`open_store`."""

    #: A network and a server stand between this machine and the bundle.
    may_be_unreachable = True

    def __init__(self, url: str, copies: Path, lock_timeout: float,
                 storage_options: Mapping[str, Any] | None = None, network_timeout: float = DEFAULT_TIMEOUT,
                 unreachable: str = "") -> None:
        self.client = Client(url, storage_options, network_timeout, unreachable)
        self.name = self.client.name
        self.folder = Path(copies) / hashlib.sha256(redacted(url).encode()).hexdigest()[:16]
        writers = Lock(self.folder / "bundle", lock_timeout)
        self._readers = Lock(self.folder / "read", lock_timeout)
        self.lock_file, self.locked = writers.file, writers.held
        #: Each pack's size, and what this machine keeps of it by (first byte, end): files (looked for again with
        #: each download: another process may keep parts too), or of the object at the URL, which may change,
        #: this process's memory.
        self._sizes: dict[str, int] = {}
        self._kept: dict[str, dict[tuple[int, int], Path | bytes]] = {"": {}}

    @property
    def unreachable(self) -> str:
        """Why this process no longer asks the store ("" while it answers)."""
        return self.client.gave_up

    @property
    def transfer(self) -> Transfer:
        return Transfer(True, self.client.downloaded, self.client.uploaded)

    def describe(self) -> Look:
        """How many packs there are and their size (one listing, nothing downloaded)."""
        try:
            packs = self._listing()
        except BundleError as exc:
            return Look(str(exc), True, str(exc))
        if not packs:
            return Look(f"{self.name}: missing, the session will create it", False)
        return Look(f"{self.name}: {counted(len(packs), 'pack')}, {sum(packs.values()) / 1e6:.1f} MB", True)

    def read(self, env: Mapping[str, str] | None = None) -> PackedBundle | None:
        """The union of the packs (``env``'s entry only, where given), or ``None`` where there are none; key
        indexes are downloaded when first needed."""
        return self._union(self._open(), env, indexes_later=True)

    def add(self, additions: list[Entry], history: Mapping[str, object] | None = None, run: float | None = None,
            max_unused_runs: int = 0, rebuild: bool = False, counted: bool = True) -> Saved:
        """Upload one pack of what ``additions`` hold that the packs lack (see :meth:`.interface.BundleStore.add`);
        with ``rebuild``, all of it, replacing the packs of only these environments and the unreadable ones."""
        before = self.transfer
        self._writable()
        stamp(additions, history, run, counted)
        envs = {env_id(e.env): e.env for e in additions}
        opened = self._open()
        only = next(iter(envs.values())) if len(envs) == 1 else None
        current = None if rebuild else self._union(opened, only, indexes_later=True)
        try:
            new = what_is_new(current, additions)  # packs it cannot read are said by the sessions that read them
            if current is not None and new.nothing:
                kept, current = current, None
                return Saved(kept, Written.UNCHANGED, size=sum(self._sizes[n] for n in opened),
                             transfer=self.transfer.since(before))
            entries = [_lacking(current, a) for a in additions]
            refused = current.unvouched if current is not None else []
        finally:
            if current is not None:
                current.release()
        secret = signing.key()
        readable = {n: b for n, b in opened.items() if n and isinstance(b, Bundle)}
        ours = [n for n, b in readable.items() if {env_id(e.env) for e in b.entries} <= set(envs)]
        unsigned = [n for n in ours if secret is not None and all(e.vouched(secret) for e in readable[n].entries)]
        unreadable = {n: why for n, why in opened.items() if n and isinstance(why, str)} if rebuild else {}
        dropped = [f"{REPLACED_UNREADABLE} ({why}); a fresh pack replaces it" for why in unreadable.values()]
        self._write(entries, [*ours, *unreadable] if rebuild else unsigned)
        opened = self._open()
        written = self._union(opened, only, indexes_later=True)
        assert written is not None
        return Saved(written, size=sum(self._sizes[n] for n in opened), dropped=(*refused, *dropped),
                     transfer=self.transfer.since(before), added=not new.nothing, added_artifacts=new.counts)

    def update(self, change: Callable[[Bundle | None], list[Entry] | None],
               dropped: list[str] | None = None) -> Bundle | None:
        """One pack of ``change``'s entries, replacing every pack read (packs others add meanwhile stay); then the
        packs replaced more than :data:`GRACE_SECONDS` ago are removed."""
        self._writable()
        opened = self._open()
        current = self._union(opened, None)
        if current is not None and dropped is not None:  # the write replaces what it could not read
            dropped.extend([*current.problems, *current.unvouched])
        if current is not None:
            for entry in current.entries:
                current.fetch_ahead(entry)
        try:
            entries = change(current)
            if entries is None:
                kept, current = current, None
                return kept
            self._write(entries, sorted(name for name in opened if name))
        finally:
            if current is not None:
                current.release()
        left = self._collect(opened)
        if dropped is not None and left:
            dropped.append(f"{counted(len(left), 'pack')} replaced more than a day ago could not be removed "
                           f"({', '.join(left)}); the next prune tries again")
        return self.read()

    def _writable(self) -> None:
        """Raise :class:`BundleError` for a store that takes no writes (plain HTTP), before anything is read."""
        if self.client.kind.http:
            raise BundleError(f"{self.name}: {self.client.protocol}:// bundles are read-only; nothing was published "
                              "(publish to an object store such as s3:// and serve that over HTTP)")

    def _listing(self) -> dict[str, int]:
        """``{pack name: size}``; the object at the URL itself, where there is one, is the pack ``""``."""
        own = self.client.size_of()
        packs = {name: size for name, size in self.client.listing(PACKS).items() if name.endswith(".bundle")}
        if own:
            packs[""] = own
        with contextlib.suppress(OSError):
            for gone in (self.folder / PACKS).iterdir():  # what this machine kept of packs since removed
                if gone.name not in packs:
                    shutil.rmtree(gone, ignore_errors=True)
        return packs

    def _object(self, name: str) -> str:
        return f"{PACKS}/{name}" if name else ""

    def _where(self, name: str, start: int, end: int) -> tuple[Path | bytes, int] | None:
        """What this machine keeps that holds bytes ``start:end`` of a pack, and where in it they begin."""
        if name not in self._kept:
            kept = self._kept[name] = {}
            with contextlib.suppress(OSError):
                for file in (self.folder / PACKS / name).iterdir():
                    first, _, last = file.name.partition("-")
                    if file.name == "whole":
                        kept[(0, self._sizes.get(name, 0))] = file
                    elif first.isdigit() and last.isdigit():
                        kept[(int(first), int(last))] = file
        return next(((held, start - a) for (a, b), held in self._kept[name].items() if a <= start and end <= b), None)

    def _read(self, name: str, start: int, end: int) -> bytes:
        """Bytes ``start:end`` of a pack: from what this machine keeps of it, else downloaded and kept."""
        held, at = self._where(name, start, end) or (None, 0)
        if isinstance(held, bytes):
            return held[at:at + end - start]
        if held is not None:
            try:
                with open(held, "rb") as f:
                    f.seek(at)
                    if len(data := f.read(end - start)) == end - start:
                        return data
            except OSError as exc:  # read again from the store
                caught("reading a kept range of a pack", exc)
        (data,) = self.client.read_ranges([(self._object(name), start, end)], whole=self._sizes.get(name, 0))
        self._keep(name, start, end, data)
        return data

    def _keep(self, name: str, start: int, end: int, data: bytes) -> None:
        if not name:  # the object at the URL may change: what this process read of it stays in its memory only
            self._kept[""][(start, end)] = data
            return
        kept = self.folder / PACKS / name / f"{start}-{end}"
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            files.write_atomic(kept, data, fsync=False)
        except OSError as exc:  # this machine keeps no copy: the next read asks again
            caught("keeping a range read of a pack", exc)
            return
        if name in self._kept:
            self._kept[name][(start, end)] = kept

    def _fetch(self, spans: list[Span]) -> None:
        """Download the spans this machine keeps no copy of, in pieces of at most :data:`CHUNK_BYTES` as
        :class:`.ranges.Ranges` reads them, each kept as such: nearby pieces of a pack as one request of at most
        that size, a few requests at once (held in memory until kept)."""
        self._kept = {"": self._kept[""]}  # another process may have kept some since
        pieces = {(n, at, min(e, at + CHUNK_BYTES)) for n, s, e in spans for at in range(s, e, CHUNK_BYTES)}
        groups: list[tuple[Span, list[Span]]] = []  # the range of one request, and the pieces it holds
        for piece in sorted(p for p in pieces if self._where(*p) is None):
            (name, first, end), held = groups[-1] if groups else (piece, [])
            if held and name == piece[0] and piece[1] - end <= _GAP and piece[2] - first <= CHUNK_BYTES:
                groups[-1] = ((name, first, max(end, piece[2])), [*held, piece])
            else:
                groups.append((piece, [piece]))
        while groups:
            batch = [groups.pop(0)]
            while groups and sum(e - s for (_, s, e), _ in [*batch, groups[0]]) <= 4 * CHUNK_BYTES:
                batch.append(groups.pop(0))
            whole = max(self._sizes.get(name, 0) for (name, _, _), _ in batch)  # for a server that ignores ranges
            answers = self.client.read_ranges([(self._object(n), s, e) for (n, s, e), _ in batch], whole)
            for ((_, start, _), held), data in zip(batch, answers):
                for name, s, e in held:
                    self._keep(name, s, e, data[s - start:e - start])

    def _fetch_locked(self, spans: list[Span]) -> None:
        """:meth:`_fetch` under this machine's readers' lock: one process downloads, the others find it here. Where
        no lock can be made, nothing could be kept either: each part is read when asked instead; where another
        process holds it too long, this one downloads for itself (a kept range is written whole or not at all)."""
        try:
            with self._readers.held() if spans else contextlib.nullcontext():
                self._fetch(spans)
        except (NotAFile, Unwritable) as exc:  # each part is read when asked instead
            caught("keeping the bundle's parts on this machine", exc)
            return
        except StoreError:
            raise
        except BundleError:
            self._fetch(spans)

    def _open(self) -> dict[str, Bundle | str]:
        """Every pack's manifest, listed now (their first bytes read at once), or why it cannot be read."""
        packs = self._listing()
        self._sizes.update(packs)
        self._fetch_locked([(name, 0, min(HEAD_BYTES, size)) for name, size in packs.items() if size])
        opened: dict[str, Bundle | str] = {}
        for name, size in sorted(packs.items()):
            ranges = Ranges(functools.partial(self._read, name), size)
            try:
                opened[name] = Bundle.over(ranges, ranges.read_at, self.folder / PACKS / (name or "at-the-url"),
                                           f"{self.name}/{PACKS}/{name}" if name else self.name, head=HEAD_BYTES)
            except StoreError:
                raise
            except BundleError as exc:
                opened[name] = str(exc)
        return opened

    def _union(self, opened: Mapping[str, Bundle | str], env: Mapping[str, str] | None,
               indexes_later: bool = False) -> PackedBundle | None:
        """The live packs' entries (``env``'s only, where given) joined per environment; the others listed unread.
        With ``indexes_later``, their key indexes are read when first asked for (:meth:`PackedBundle.key_index`)."""
        if not opened:
            return None
        replaced = {old for b in opened.values() for old in _replaces(b)}
        live = [(n, b) for n, b in opened.items() if n not in replaced]
        problems = [b for _, b in live if isinstance(b, str)]
        wanted = [(n, b, e) for n, b in live if isinstance(b, Bundle) for e in b.entries
                  if env is None or e.env == dict(env)]
        self._fetch_locked([span for n, b, e in wanted for span in _sections(n, b, e, not indexes_later)])
        joined: dict[str, list[tuple[str, Bundle, Entry]]] = {}
        parts = []
        for name, bundle, entry in wanted:
            try:
                bundle.members(entry)
                if entry.binaries_section is not None:
                    entry.binaries = bundle.carried_listing(entry)
                    problems += [f"{bundle.name}: {p}" for p in entry.binaries.problems]
                _, problem = bundle.key_index(entry) if not indexes_later else (None, "")
            except BundleError as exc:
                problems.append(str(exc))
                continue
            problems += [problem] if problem else []
            joined.setdefault(env_id(entry.env), []).append((name, bundle, entry))
            parts.append(entry)
        entries, dropped = _union(parts)
        seen = {env_id(e.env) for e in entries}
        for entry in [e for _, b in live if isinstance(b, Bundle) for e in b.entries] if env is not None else []:
            if entry.env != dict(env or {}) and env_id(entry.env) not in seen:  # listed for messages, unread
                seen.add(env_id(entry.env))
                entries.append(entry)
        if not entries and problems:
            raise BundleError(problems[0])
        return PackedBundle(self.folder / "union.bundle", entries, label=self.name, problems=problems,
                            _parts=joined, _fetch=self._fetch_locked, _later=set(joined) if indexes_later else set(),
                            unvouched=dropped)

    def _write(self, entries: list[Entry], supersedes: list[str]) -> str:
        """Upload ``entries`` as a new pack (replacing the packs ``supersedes``), keep it here whole; its name."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="pack-", suffix=".part", dir=self.folder)
        os.close(fd)
        staging = Path(name)
        try:
            try:
                write_bundle(Bundle(staging, entries, supersedes=tuple(supersedes), written=time.time()))
            except BundleError as exc:
                why = str(exc).split(": ", 2)[-1].replace("; the file there is unchanged", "")
                raise BundleError(f"{self.name}: cannot write its new pack in {self.folder} before uploading it: "
                                  f"{why}; nothing was uploaded") from None
            pack = f"{files.checksum(staging)[0][:32]}.bundle"
            self.client.put(staging, f"{PACKS}/{pack}")
            try:
                (self.folder / PACKS / pack).mkdir(parents=True, exist_ok=True)
                files.replace(staging, self.folder / PACKS / pack / "whole")
            except OSError as exc:  # the next reader downloads it
                caught("keeping a new pack on this machine", exc)
        finally:
            staging.unlink(missing_ok=True)
        return pack

    def _collect(self, opened: Mapping[str, Bundle | str]) -> list[str]:
        """Remove the packs replaced more than :data:`GRACE_SECONDS` ago, the earliest replaced first; stop at
        the first that stays (so no pack replaced comes back); the names of those left."""
        now = time.time()
        when: dict[str, float] = {}
        for bundle in opened.values():
            if isinstance(bundle, Bundle) and bundle.written and now - bundle.written > GRACE_SECONDS:
                for old in _replaces(bundle):
                    when[old] = min(when.get(old, bundle.written), bundle.written)
        due = sorted((n for n in when if n in opened), key=lambda n: when[n])
        for number, name in enumerate(due):
            if not self.client.remove(self._object(name)):
                return due[number:]
        return []


def _replaces(bundle: Bundle | str) -> tuple[str, ...]:
    """The packs ``bundle`` replaces: as its manifest says, or with the signing key set, only where its seal holds
    (a writer without the key can hide no pack, nor have one removed). The object at the URL itself is never
    replaced: it is not the layout's to remove."""
    if isinstance(bundle, str):  # a pack that cannot be read replaces nothing
        return ()
    secret = signing.key()
    if secret is not None and signing.check({"supersedes": list(bundle.supersedes), "written": bundle.written}, None,
                                            bundle.seal, secret):
        return ()
    return tuple(name for name in bundle.supersedes if name)


def _sections(name: str, bundle: Bundle, entry: Entry, index: bool) -> Iterator[Span]:
    """The spans of an entry's table and (with ``index``) key index; its binaries' listing is in the manifest."""
    yield name, bundle._start + entry.offset, bundle._start + entry.offset + entry.size
    if index and entry.index_section is not None:
        at = bundle._start + entry.index_section["offset"]
        yield name, at, at + entry.index_section["size"]


def _spans(name: str, bundle: Bundle, entry: Entry) -> Iterator[Span]:
    """Where each artifact and each carried binary of ``entry`` (its table read) lies in the pack ``name``."""
    at = bundle._start + entry.offset + entry.size
    yield from ((name, at + m.offset, at + m.offset + m.stored) for m in bundle.members(entry).table)
    at = bundle._start + (entry.binaries_section or {}).get("offset", 0)
    for *_, stored in (entry.binaries_section or {}).get("files", []):
        yield name, at, at + stored
        at += stored


def _lacking(current: Bundle | None, addition: Entry) -> Entry:
    """``addition`` less the artifacts and binaries ``current`` holds for its environment; its key index keeps the
    run's record of every artifact it used, and the key details of those it adds."""
    have = current.find(addition.env) if current is not None else None
    secret = signing.key()
    if have is None or (secret is not None and have.vouched(secret)):  # what no signature vouches for is not held
        return addition
    held = {(m.kind, m.key, m.sha256) for m in mergeable(have).table}
    members = mergeable(addition)
    kept = [m for m in members.table if (m.kind, m.key, m.sha256) not in held]
    index = addition.index
    if index is not None:
        used = dict(index.used)
        index = index.restricted({m.key for m in kept})
        index.used = used
    smaller = addition.with_members(Members.chosen((members, m) for m in kept), index, binaries=False)
    if addition.binaries:
        carried = have.binaries.files if have.binaries else {}
        smaller.binaries = CarriedBinaries(dict(addition.binaries.builds), {
            key: f for key, f in addition.binaries.files.items() if key not in carried}) or None
    return smaller


def read_url(url: str, copies: Path, storage_options: Mapping[str, Any] | None = None,
             network_timeout: float = DEFAULT_TIMEOUT, whole: bool = True) -> PackedBundle:
    """The bundle at ``url`` for the command line; with ``whole``, every entry's parts downloaded now (each
    checked when read)."""
    bundle = PackStore(url, copies, 60.0, storage_options, network_timeout).read()
    if bundle is None:
        raise FileNotFoundError(redacted(url))
    for entry in bundle.entries if whole else []:
        bundle.fetch_ahead(entry)
    return bundle


def open_store(where: str | Path, lock_timeout: float, copies: Path,
               storage_options: Mapping[str, Any] | None = None, network_timeout: float = DEFAULT_TIMEOUT,
               unreachable: str = "") -> BundleStore:
    """The store of the bundle at ``where``, opened once per process that needs it: a URL's (its packs' bytes kept
    under ``copies``; ``unreachable``: why another process of the session stopped asking it), or a path's, also
    given as a ``file://`` URL."""
    name = str(where)
    if is_url(name):
        return PackStore(name, copies, lock_timeout, storage_options, network_timeout, unreachable)
    return LocalStore(Path(file_url_path(name) or name), lock_timeout)
