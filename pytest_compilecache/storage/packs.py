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
from .interface import REPLACED_UNREADABLE, Look, Saved, Transfer, Written
from .local import Lock
from ..bundle.merge import _union, env_id, mergeable, stamp, what_is_new
from .ranges import CHUNK_BYTES, HEAD_BYTES, Ranges
from .urls import redacted

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

    _spans: dict[str, list[Span]] = field(default_factory=dict, repr=False)
    _fetch: Callable[[list[Span]], None] | None = field(default=None, repr=False)
    #: Per environment, the packs' entries whose key indexes are read when a miss first needs them.
    _indexes: dict[str, list[tuple[Bundle, Entry]]] = field(default_factory=dict, repr=False)
    #: Entries left out beside signed ones (the signing key set), in words: said where a write happens.
    unvouched: list[str] = field(default_factory=list)

    def fetch_ahead(self, entry: Entry) -> None:
        """Download every artifact and binary of ``entry`` not yet on this machine, a few requests at once."""
        if self._fetch is not None:
            self._fetch(self._spans.get(env_id(entry.env), []))

    def read_key_index(self, entry: Entry) -> str:
        """Nothing yet where the packs' key indexes are read when first needed (see :meth:`key_index`)."""
        return "" if env_id(entry.env) in self._indexes else super().read_key_index(entry)

    def key_index(self, entry: Entry) -> tuple[KeyIndex | None, str]:
        """The union of the key indexes of the packs that hold ``entry``, each downloaded and checked now."""
        parts = self._indexes.pop(env_id(entry.env), None)
        if parts is None:
            return super().key_index(entry)
        read, problems = [], []
        for bundle, part in parts:
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
    ``copies`` once read (a pack never changes); ``unreachable``: as in :func:`.stores.open_store`."""

    #: A network and a server stand between this machine and the bundle.
    may_be_unreachable = True

    def __init__(self, url: str, copies: Path, lock_timeout: float,
                 storage_options: Mapping[str, Any] | None = None, network_timeout: float = DEFAULT_TIMEOUT,
                 unreachable: str = "") -> None:
        self.client = Client(url, storage_options, network_timeout)
        self.client.gave_up = unreachable
        self.name = self.client.name
        self.folder = Path(copies) / hashlib.sha256(redacted(url).encode()).hexdigest()[:16]
        writers = Lock(self.folder / "bundle", lock_timeout)
        self._readers = Lock(self.folder / "read", lock_timeout)
        self.lock_file, self.locked = writers.file, writers.held
        #: Why each pack that could not be read could not, by name; how many of its first bytes a reader reads.
        self._unreadable: dict[str, str] = {}
        self._heads: dict[str, int] = {}
        self._sizes: dict[str, int] = {}
        #: The ranges of each pack this machine keeps, by (first byte, end); of the object at the URL, this process.
        self._spans_kept: dict[str, dict[tuple[int, int], Path]] = {}
        self._memory: dict[tuple[int, int], bytes] = {}

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
        packs = self._listing()
        return self._union(self._open(packs), env, indexes_later=True) if packs else None

    def add(self, additions: list[Entry], history: Mapping[str, object] | None = None, run: float | None = None,
            max_unused_runs: int = 0, rebuild: bool = False, counted: bool = True) -> Saved:
        """Upload one pack of what ``additions`` hold that the packs lack (see :meth:`.interface.BundleStore.add`);
        with ``rebuild``, all of it, replacing the packs of only these environments and the unreadable ones."""
        before = self.transfer
        if self.client.kind.read_only:
            raise BundleError(f"{self.name}: {self.client.protocol}:// bundles are read-only; this run's artifacts "
                              "were not published (publish to an object store such as s3:// and serve that over HTTP)")
        stamp(additions, history, run, counted)
        envs = {env_id(e.env): e.env for e in additions}
        packs = self._listing()
        opened = self._open(packs)
        only = next(iter(envs.values())) if len(envs) == 1 else None
        current = None if rebuild else self._union(opened, only, indexes_later=True)
        try:
            new = what_is_new(current, additions)  # packs it cannot read are said by the sessions that read them
            if current is not None and new.nothing:
                kept, current = current, None
                return Saved(kept, Written.UNCHANGED, size=sum(packs.values()), transfer=self.transfer.since(before))
            entries = [_lacking(current, a) for a in additions]
            refused = current.unvouched if current is not None else []
        finally:
            if current is not None:
                current.release()
        secret = signing.key()
        readable = {n: b for n, b in opened.items() if b is not None}
        ours = [n for n, b in readable.items() if n and {env_id(e.env) for e in b.entries} <= set(envs)]
        unsigned = [n for n in ours if secret is not None and all(e.vouched(secret) for e in readable[n].entries)]
        unreadable = [n for n, b in opened.items() if n and b is None] if rebuild else []
        dropped = [f"{REPLACED_UNREADABLE} ({self._unreadable[n]}); a fresh pack replaces it" for n in unreadable]
        self._write(entries, [*ours, *unreadable] if rebuild else unsigned)
        packs = self._listing()
        written = self._union(self._open(packs), only, indexes_later=True)
        assert written is not None
        return Saved(written, size=sum(packs.values()), dropped=(*refused, *dropped), transfer=self.transfer.since(before),
                     added=not new.nothing, added_artifacts=new.counts)

    def update(self, change: Callable[[Bundle | None], list[Entry] | None],
               dropped: list[str] | None = None) -> Bundle | None:
        """One pack of ``change``'s entries, replacing every pack read (packs others add meanwhile stay); then the
        packs replaced more than :data:`GRACE_SECONDS` ago are removed."""
        opened = self._open(self._listing())
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

    def _kept(self, name: str, start: int, end: int) -> Path:
        return self.folder / PACKS / name / f"{start}-{end}"

    def _read(self, name: str, start: int, end: int) -> bytes:
        """Bytes ``start:end`` of a pack: from what this machine keeps of it, else read and kept (the object at the
        URL itself may change: what this process read of it is kept in its memory only)."""
        if not name:
            held = next((data[start - a:end - a] for (a, b), data in self._memory.items() if a <= start and end <= b),
                        None)
            if held is not None:
                return held
        for path, at in self._places(name, start, end) if name else []:
            with contextlib.suppress(OSError), open(path, "rb") as f:
                f.seek(at)
                data = f.read(end - start)
                if len(data) == end - start:
                    return data
        (data,) = self.client.read_ranges([(self._object(name), start, end)], whole=self._sizes.get(name, 0))
        if name:
            self._keep(name, start, end, data)
        return data

    def _keep(self, name: str, start: int, end: int, data: bytes) -> None:
        if not name:  # the object at the URL may change: what this process read of it stays in its memory only
            self._memory[(start, end)] = data
            return
        kept = self._kept(name, start, end)
        with contextlib.suppress(OSError):  # this machine keeps no copy: the next read asks again
            kept.parent.mkdir(parents=True, exist_ok=True)
            files.write_atomic(kept, data, fsync=False)
            self._spans_kept.setdefault(name, {})[(start, end)] = kept

    def _fetch(self, spans: list[Span]) -> None:
        """Download the spans this machine keeps no copy of: nearby ones of a pack as one range, each range in
        requests of at most :data:`CHUNK_BYTES`, a few of them at once (held in memory until kept)."""
        groups: list[tuple[Span, list[Span]]] = []
        self._spans_kept.clear()  # another process may have kept some since
        for span in sorted({s for s in spans if not self._has(*s)}):
            last = groups[-1][0] if groups else None
            if last is not None and last[0] == span[0] and span[1] - last[2] <= _GAP and \
                    span[2] - last[1] <= CHUNK_BYTES:
                groups[-1] = ((last[0], last[1], max(last[2], span[2])), [*groups[-1][1], span])
            else:
                groups.append((span, [span]))
        while groups:
            batch: list[tuple[Span, list[Span]]] = []
            size = 0
            while groups and (not batch or size + groups[0][0][2] - groups[0][0][1] <= 4 * CHUNK_BYTES):
                batch.append(groups.pop(0))
                size += batch[-1][0][2] - batch[-1][0][1]
            pieces = [[(self._object(n), at, min(e, at + CHUNK_BYTES)) for at in range(s, e, CHUNK_BYTES)]
                      for (n, s, e), _ in batch]
            whole = max(self._sizes.get(name, 0) for (name, _, _), _ in batch)  # for a server that ignores ranges
            answers = iter(self.client.read_ranges([piece for group in pieces for piece in group], whole))
            for ((_, start, _), parts), group in zip(batch, pieces):
                data = b"".join(next(answers) for _ in group)
                for name, s, e in parts:
                    self._keep(name, s, e, data[s - start:e - start])

    def _fetch_locked(self, spans: list[Span]) -> None:
        """:meth:`_fetch` under this machine's readers' lock: one process downloads, the others find it here. Where
        no lock can be made, nothing could be kept either: each part is read when asked instead; where another
        process holds it too long, this one downloads for itself (a kept range is written whole or not at all)."""
        try:
            with self._readers.held():
                self._fetch(spans)
        except (NotAFile, Unwritable) as exc:  # each part is read when asked instead
            caught("keeping the bundle's parts on this machine", exc)
            return
        except StoreError:
            raise
        except BundleError:
            self._fetch(spans)

    def _places(self, name: str, start: int, end: int) -> list[tuple[Path, int]]:
        """The files on this machine that may hold bytes ``start:end`` of a pack, and where in them."""
        if name not in self._spans_kept:
            kept = self._spans_kept[name] = {}
            with contextlib.suppress(OSError):
                for file in (self.folder / PACKS / name).iterdir():
                    first, _, last = file.name.partition("-")
                    if first.isdigit() and last.isdigit():
                        kept[(int(first), int(last))] = file
        holding = [(f, start - a) for (a, b), f in self._spans_kept[name].items() if a <= start and end <= b]
        return [(self.folder / PACKS / name / "whole", start), (self._kept(name, start, end), 0), *holding]

    def _has(self, name: str, start: int, end: int) -> bool:
        if not name:
            return any(a <= start and end <= b for a, b in self._memory)
        return any(path.is_file() for path, _ in self._places(name, start, end))

    def _open(self, packs: Mapping[str, int]) -> dict[str, Bundle | None]:
        """Every pack's manifest (their first bytes read at once); ``None`` for one that cannot be read."""
        self._sizes.update(packs)
        self._heads.update({name: min(HEAD_BYTES, size) for name, size in packs.items()})
        self._fetch_locked([(name, 0, head) for name, head in self._heads.items() if head and name in packs])
        opened: dict[str, Bundle | None] = {}
        for name, size in sorted(packs.items()):
            label = f"{self.name}/{PACKS}/{name}" if name else self.name
            try:
                opened[name] = Bundle.over(Ranges(functools.partial(self._read, name), size),
                                           self.folder / PACKS / (name or "at-the-url"), label, head=HEAD_BYTES)
            except StoreError:
                raise
            except BundleError as exc:
                opened[name] = None
                self._unreadable[name] = str(exc)
        return opened

    def _union(self, opened: Mapping[str, Bundle | None], env: Mapping[str, str] | None,
               indexes_later: bool = False) -> PackedBundle | None:
        """The live packs' entries (``env``'s only, where given) joined per environment; the others listed unread.
        With ``indexes_later``, their key indexes are read when first asked for (:meth:`PackedBundle.key_index`)."""
        if not opened:
            return None
        replaced = {old for b in opened.values() for old in _replaces(b)}
        live = {n: b for n, b in opened.items() if n not in replaced}
        problems = [self._unreadable.get(n, f"{self.name}/{PACKS}/{n}: cannot be read")
                    for n, b in live.items() if b is None]
        wanted = [(n, b, e) for n, b in live.items() if b is not None for e in b.entries
                  if env is None or e.env == dict(env)]
        self._fetch_locked([span for n, b, e in wanted for span in _sections(n, b, e, not indexes_later)])
        spans: dict[str, list[Span]] = {}
        later: dict[str, list[tuple[Bundle, Entry]]] = {}
        parts = []
        for name, bundle, entry in wanted:
            try:
                members = bundle.members(entry)
                if entry.binaries_section is not None:
                    entry.binaries = bundle.carried_listing(entry)
                    problems += [f"{bundle.name}: {p}" for p in entry.binaries.problems]
                _, problem = bundle.key_index(entry) if not indexes_later else (None, "")
            except BundleError as exc:
                problems.append(str(exc))
                continue
            if problem:
                problems.append(problem)
            if indexes_later:
                later.setdefault(env_id(entry.env), []).append((bundle, entry))
            parts.append(entry)
            first = bundle._start + entry.offset + entry.size
            section = entry.binaries_section or {}
            spans.setdefault(env_id(entry.env), []).extend(
                [(name, first + m.offset, first + m.offset + m.stored) for m in members.table]
                + [(name, bundle._start + section["offset"] + at, bundle._start + section["offset"] + at + stored)
                   for at, stored in _binary_offsets(section)])
        entries, dropped = _union(parts)
        seen = {env_id(e.env) for e in entries}
        for bundle in (b for b in live.values() if b is not None and env is not None):
            for entry in bundle.entries:
                if entry.env != dict(env or {}) and env_id(entry.env) not in seen:  # listed for messages, unread
                    seen.add(env_id(entry.env))
                    entries.append(entry)
        if not entries and problems:
            raise BundleError(problems[0])
        return PackedBundle(self.folder / "union.bundle", entries, label=self.name, problems=problems,
                            _spans=spans, _fetch=self._fetch_locked, _indexes=later, unvouched=dropped)

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
            with contextlib.suppress(OSError):
                (self.folder / PACKS / pack).mkdir(parents=True, exist_ok=True)
                files.replace(staging, self.folder / PACKS / pack / "whole")
        finally:
            staging.unlink(missing_ok=True)
        return pack

    def _collect(self, opened: Mapping[str, Bundle | None]) -> list[str]:
        """Remove the packs replaced more than :data:`GRACE_SECONDS` ago, the earliest replaced first; stop at
        the first that stays (so no pack replaced comes back); the names of those left."""
        now = time.time()
        when: dict[str, float] = {}
        for bundle in opened.values():
            if bundle is not None and bundle.written and now - bundle.written > GRACE_SECONDS:
                for old in _replaces(bundle):
                    when[old] = min(when.get(old, bundle.written), bundle.written)
        due = sorted((n for n in when if n in opened), key=lambda n: when[n])
        for number, name in enumerate(due):
            if not self.client.remove(self._object(name)):
                return due[number:]
        return []


def _replaces(bundle: Bundle | None) -> tuple[str, ...]:
    """The packs ``bundle`` replaces: as its manifest says, or with the signing key set, only where its seal holds
    (a writer without the key can hide no pack, nor have one removed). The object at the URL itself is never
    replaced: it is not the layout's to remove."""
    if bundle is None:
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


def _binary_offsets(section: Mapping[str, Any]) -> Iterator[tuple[int, int]]:
    """(where in the section, stored size) of each file a binaries section lists."""
    at = 0
    for *_, stored in section.get("files", []):
        yield at, stored
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
