"""Reading the bundle file (docs/file-format.md): a manifest, then per entry a table of its artifacts and each
artifact compressed alone, each checked before torch sees it."""

from __future__ import annotations

import contextlib
import enum
import errno
import hashlib
import io
import json
import os
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping, cast

from . import signing
from .binaries import BinaryDamaged, CarriedBinaries, check_section, natural
from .keyindex import KeyIndex, KeyIndexError, finite
from .labels import differences, env_label
from .members import WHOLE, MemberDamaged, Members, no_file, unpack_table

MAGIC = b"PYTEST-COMPILECACHE-BUNDLE\n"
FORMAT = 2
_MAX_MANIFEST = 64 * 1024 * 1024
#: Keep a bundle open while its payloads are read; on Windows an open file blocks a writer's rename.
HOLD_OPEN = os.name != "nt"


class BundleError(Exception):
    """A bundle cannot be read, used or written; the message names the file and the reason."""


class NotABundle(BundleError):
    """The file exists but is not a bundle at all; it is never overwritten."""


class NotAFile(BundleError):
    """The path is a folder, or lies under a file: there is no bundle file there to read, write or move."""


class Unwritable(BundleError):
    """No file can be made beside the bundle (a read-only folder): it may be read, never written."""


class Unreadable(enum.Enum):
    """Why a bundle path could not be used, told by what the user can do about it."""

    #: A bundle that cannot be read (corrupt, truncated, another format): ``--compile-cache-rebuild`` replaces it.
    DAMAGED = "damaged"
    #: Some other file: never written over.
    NOT_A_BUNDLE = "not a bundle"
    #: A folder, or a path under a file: nothing to move, another path is needed.
    NOT_A_FILE = "not a file"
    #: In a folder this user cannot write: the bundle is neither made nor changed there.
    UNWRITABLE = "cannot be written"

    @classmethod
    def of(cls, exc: BundleError) -> Unreadable:
        """The kind of problem ``exc`` is."""
        kinds = ((NotABundle, cls.NOT_A_BUNDLE), (Unwritable, cls.UNWRITABLE), (NotAFile, cls.NOT_A_FILE))
        return next((kind for error, kind in kinds if isinstance(exc, error)), cls.DAMAGED)


@dataclass
class Entry:
    """The artifacts of one environment inside a bundle."""

    env: dict[str, str]
    #: Mega-Cache bytes: made here, or its members put back together (for ``verify``).
    payload: bytes | None = None
    artifacts: dict[str, dict[str, int]] = field(default_factory=dict)
    created: float = 0.0
    updated: float = 0.0
    sha256: str = ""
    size: int = 0
    offset: int = 0
    history: dict[str, Any] = field(default_factory=dict)
    binaries: CarriedBinaries | None = None
    binaries_section: dict[str, Any] | None = None
    signature: str = ""
    index: KeyIndex | None = None
    index_section: dict[str, Any] | None = None
    #: Read from a bundle file (its signature, if any, is what vouches for it), not made in this process.
    from_file: bool = False
    _index_blob: bytes | None = field(default=None, repr=False)
    #: Why the key index is unusable ("": it is usable; ``None``: not checked yet).
    _index_problem: str | None = field(default=None, repr=False)
    #: Bytes of its members after the table (``offset``, ``size`` and ``sha256`` are the table's).
    stored: int = 0
    #: Its members (read from its bundle, or packed here), and the table as stored.
    _members: Members | None = field(default=None, repr=False)
    _table: bytes | None = field(default=None, repr=False)

    def vouched(self, secret: bytes) -> str:
        """``""`` when this entry may be signed with ``secret`` (made here, or read validly signed), else why not."""
        return "" if not self.from_file else signing.check(self.describe(), self.binaries_section, self.signature, secret)

    def with_members(self, members: Members, index: KeyIndex | None, binaries: bool = True) -> "Entry":
        """This entry with fewer artifacts (or no carried binaries), as trusted as it was."""
        smaller = entry_of(self.env, members, self.created, self.binaries if binaries else None, index)
        smaller.history = self.history
        secret = signing.key()
        smaller.from_file = self.from_file and (secret is None or bool(self.vouched(secret)))
        return smaller

    def reset_index(self) -> None:
        """Forget the packed key index after :attr:`index` changed."""
        self._index_blob = None
        self.index_section = None

    def index_blob(self) -> bytes | None:
        """The key index as stored: as read from the bundle, or packed from :attr:`index`."""
        if self._index_blob is None and self.index is not None:
            self._index_blob = self.index.pack()
        return self._index_blob

    def describe(self) -> dict[str, Any]:
        """The manifest form of this entry (without its place in the file); its index as read, else as packed now."""
        described: dict[str, Any] = {"history": self.history, "env": self.env, "created": self.created,
                                     "updated": self.updated, "size": self.size, "sha256": self.sha256,
                                     "artifacts": self.artifacts, "stored": self.stored}
        if self.index_section is not None:
            described["index"] = {k: self.index_section[k] for k in ("size", "sha256")}
        elif (blob := self.index_blob()) is not None:
            described["index"] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        return described


@dataclass
class Bundle:
    """A bundle file's manifest, read through one open file, so that payloads come from the same version."""

    path: Path
    entries: list[Entry]
    _file: BinaryIO | None = field(default=None, repr=False)
    _start: int = 0
    #: What messages call the bundle when ``path`` is only a local copy of it (the URL it came from).
    label: str = ""
    #: How to let go of the readers of its sections handed out (they outlive :meth:`close`, not :meth:`release`).
    _opened: list[Callable[[], None]] = field(default_factory=list, repr=False)
    #: A pack of a bundle at a URL: the packs it replaces (docs/urls.md), and when it was written.
    supersedes: tuple[str, ...] = ()
    written: float = 0.0
    #: Their signature, with the signing key set (see :func:`.signing.seal`).
    seal: str = ""
    #: What of it could not be used, in words, each naming the file (a bundle at a URL: an unreadable pack).
    problems: list[str] = field(default_factory=list)
    #: A pack at a URL: ``read_at(first byte, length)`` reads its artifacts and binaries, each range when asked.
    _read_at: Callable[[int, int], bytes] | None = field(default=None, repr=False)

    @classmethod
    def over(cls, source: io.RawIOBase, read_at: Callable[[int, int], bytes], path: Path, label: str = "",
             head: int = io.DEFAULT_BUFFER_SIZE) -> "Bundle":
        """The manifest of the bundle in ``source`` (kept open), read ``head`` bytes, then a section, at a time;
        its artifacts and binaries are read by ``read_at``, each when asked."""
        buffered = io.BufferedReader(source, head)
        bundle = parse(cast(BinaryIO, buffered), path, label)
        bundle._file, bundle._read_at = cast(BinaryIO, buffered.detach()), read_at
        return bundle

    @property
    def name(self) -> str:
        """The bundle as the user named it: its URL for a copy of one at a URL, else its path."""
        return self.label or str(self.path)

    def __enter__(self) -> "Bundle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file the manifest was read from; payloads already read stay available."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def release(self) -> None:
        """Close the file and every reader of its sections handed out (for a writer done with what it read)."""
        self.close()
        while self._opened:
            self._opened.pop()()

    def find(self, env: Mapping[str, str]) -> Entry | None:
        """The entry made in an environment equal to ``env``, if any."""
        return next((e for e in self.entries if e.env == dict(env)), None)

    def mismatch(self, env: Mapping[str, str]) -> str:
        """Why no entry matches ``env``: the differing fields of the closest entry."""
        closest = min(self.entries, key=lambda e: len(differences(e.env, env)), default=None)
        why = "; ".join(differences(closest.env, env)) if closest else "it has no entries"
        return f"{self.name}: no entry matches this machine ({why})"

    def payload(self, entry: Entry) -> bytes:
        """The entry's Mega-Cache bytes, its members each checked and put back together (this needs torch)."""
        if entry.payload is None:
            self.members(entry)
        return payload_of(entry, self.name)

    def _read(self, entry: Entry, what: str, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` (from the first payload byte) of the file the manifest was read from."""
        if self._file is None:
            raise BundleError(f"{self.name}: the bundle was closed before {what} for {env_label(entry.env)} was read")
        try:
            self._file.seek(self._start + offset)
            return self._file.read(size)
        except OSError as exc:
            raise BundleError(f"{self.name}: cannot read: {exc.strerror or exc}") from None

    def members(self, entry: Entry) -> Members:
        """The entry's artifacts, listed (its table checked), each read alone when asked; they outlive :meth:`close`."""
        if entry._members is not None:
            return entry._members
        table = self._read(entry, "the table of artifacts", entry.offset, entry.size)
        if len(table) != entry.size:
            raise BundleError(f"{self.name}: truncated: the table of artifacts for {env_label(entry.env)} is cut short")
        if hashlib.sha256(table).hexdigest() != entry.sha256:
            raise BundleError(f"{self.name}: corrupt: the table of artifacts for {env_label(entry.env)} fails its "
                              "checksum")
        try:
            listed = unpack_table(table)
        except MemberDamaged as exc:
            raise BundleError(f"{self.name}: corrupt: the entry for {env_label(entry.env)}: {exc}") from None
        if sum(m.stored for m in listed) != entry.stored:
            raise BundleError(f"{self.name}: corrupt: the table of artifacts for {env_label(entry.env)} does not "
                              "match the entry's size")
        fetch, close = self._ranges(entry, "the artifacts", entry.offset + entry.size, entry.stored)
        entry._members, entry._table = Members(listed, fetch, close=close), table
        return entry._members

    def _ranges(self, entry: Entry, what: str, offset: int, size: int) -> tuple[Callable[[int, int], bytes],
                                                                                Callable[[], None]]:
        """Reads by range of ``what`` (``size`` bytes at ``offset``), and how to let go of them: through a file
        descriptor of their own (they outlive :meth:`close`) where the bundle is a local file, else from memory."""
        first = self._start + offset
        read_at = self._read_at
        if read_at is not None:  # a pack at a URL: each range read when asked
            return (lambda at, length: read_at(first + at, length)), no_file
        fd = None
        if self._file is not None and hasattr(os, "pread"):
            with contextlib.suppress(AttributeError, OSError, io.UnsupportedOperation):
                fd = os.dup(self._file.fileno())
        if fd is None:
            region = self._read(entry, what, offset, size)
            if len(region) != size:
                raise BundleError(f"{self.name}: truncated: {what} for {env_label(entry.env)} are cut short")
            return (lambda at, length: region[at:at + length]), no_file
        held = fd

        def fetch(at: int, length: int) -> bytes:
            if not close.alive:  # its number may belong to another file by now
                raise OSError(errno.EBADF, "the bundle was closed")
            return os.pread(held, length, first + at)

        close = weakref.finalize(fetch, os.close, held)  # closed once: when told, or when no reader is left
        return fetch, close

    def fetch_ahead(self, entry: Entry) -> None:
        """Read now what the entry's artifacts and binaries will be read from (nothing: a file is read in place)."""

    def signature_problem(self, entry: Entry, secret: bytes) -> str:
        """``""`` when the entry's signature is valid for ``secret``; otherwise the problem, naming the file."""
        why = signing.check(entry.describe(), entry.binaries_section, entry.signature, secret)
        return why and (f"{self.name}: the entry for {env_label(entry.env)}: {why} ({signing.KEY_ENV} is set); "
                        "it is not used")

    def carried(self, entry: Entry, check: bool = False) -> tuple[CarriedBinaries, list[str]]:
        """The entry's compiled binaries, each read by range as stored when needed (the section's checksum checked
        now, a chunk at a time), and one problem per file left out; with ``check``, each file is read and checked
        now too, and a damaged one left out."""
        problems: list[str] = []
        section = entry.binaries_section
        if entry.binaries is None and section is not None:
            fetch, close = self._ranges(entry, "the binaries", section["offset"], section["size"])
            self._opened.append(close)
            listed, digest = CarriedBinaries.of_section(section, fetch), hashlib.sha256()
            try:
                for chunk in listed.packed()[0]():  # the section as stored, a chunk at a time
                    digest.update(chunk)
            except BinaryDamaged as exc:
                raise BundleError(f"{self.name}: {exc}") from None
            if digest.hexdigest() != section["sha256"]:
                raise BundleError(f"{self.name}: corrupt: the binaries for {env_label(entry.env)} fail their checksum")
            entry.binaries = listed
            problems = list(listed.problems)
        carried = entry.binaries or CarriedBinaries()
        if check:
            carried, damaged = carried.checked()
            problems += damaged
        return carried, [f"{self.name}: {p}" for p in problems]

    def carried_listing(self, entry: Entry) -> CarriedBinaries:
        """The entry's compiled binaries, listed, each read and checked when asked for."""
        section = entry.binaries_section
        if entry.binaries is not None:  # its problems were said where it was read
            return CarriedBinaries(entry.binaries.builds, entry.binaries.files)
        if section is None:
            return CarriedBinaries()
        fetch, close = self._ranges(entry, "the binaries", section["offset"], section["size"])
        self._opened.append(close)
        return CarriedBinaries.of_section(section, fetch)

    def key_index(self, entry: Entry) -> tuple[KeyIndex | None, str]:
        """The entry's key index (``None`` when it has none or it is unusable) and the problem, if any."""
        problem = self.read_key_index(entry)
        blob = entry._index_blob
        if problem or entry.index is not None or entry.index_section is None or blob is None:
            return entry.index, problem
        where = f"{self.name}: the key index of {env_label(entry.env)}"
        try:
            entry.index = KeyIndex.unpack(blob)
        except KeyIndexError as exc:
            entry._index_problem = f"{where} is unusable ({exc}); misses cannot be explained from it (kept as it is)"
            return None, entry._index_problem
        return entry.index, ""

    def read_key_index(self, entry: Entry) -> str:
        """Read the entry's key index (unless read already) and check it without unpacking it; the problem, if any."""
        section = entry.index_section
        if entry.index is not None or section is None:
            return ""
        if entry._index_problem is not None:
            return entry._index_problem
        where = f"{self.name}: the key index of {env_label(entry.env)}"
        blob = entry._index_blob
        if blob is None:
            blob = self._read(entry, "the key index", section["offset"], section["size"])
            if len(blob) != section["size"]:
                entry.index_section = None
                return f"{where} is cut short; misses cannot be explained from it"
            entry._index_blob = blob
        entry._index_problem = ""
        if hashlib.sha256(blob).hexdigest() != section["sha256"]:
            entry._index_problem = f"{where} fails its checksum; misses cannot be explained from it (kept as it is)"
        return entry._index_problem

    def read_all(self) -> None:
        """Read and check every entry (its table, carried binaries, key index) now, then close the file."""
        try:
            for entry in self.entries:
                self.members(entry)
                self.carried(entry)
                self.key_index(entry)
        finally:
            self.close()


def payload_of(entry: Entry, name: str) -> bytes:
    """The Mega-Cache bytes of an entry already read (or made here), its members put back together by torch."""
    if entry.payload is None:
        if entry._members is None:
            raise BundleError(f"{name}: the payload for {env_label(entry.env)} was not read")
        from .._torchapi import artifacts_bytes

        try:
            listed = list(entry._members.contents())
            whole = len(listed) == 1 and listed[0][0] == WHOLE
            entry.payload = listed[0][2] if whole else artifacts_bytes(listed)
        except MemberDamaged as exc:
            raise BundleError(f"{name}: corrupt: the entry for {env_label(entry.env)}: {exc}") from None
    return entry.payload


def _payload_start(f: Any, path: str) -> int:
    magic = f.read(len(MAGIC))
    if magic != MAGIC:
        if not magic:
            raise BundleError(f"{path}: empty file, not a bundle")
        if magic.lstrip().lower().startswith((b"<!doc", b"<html", b"<?xml", b"<head", b"<body")):
            raise NotABundle(f"{path}: not a pytest-compilecache bundle: it is a web page (HTML or XML), "
                             "such as an error or login page a server or proxy answered with")
        raise NotABundle(f"{path}: not a pytest-compilecache bundle (it does not start with the bundle marker)")
    line = f.readline(32)
    if not line.endswith(b"\n") or not line[:-1].isdigit():
        raise BundleError(f"{path}: corrupt: the manifest length is unreadable")
    return len(MAGIC) + len(line) + int(line)


def _entry(raw: Any) -> Entry:
    env, artifacts, history = raw["env"], raw.get("artifacts", {}), raw.get("history", {})
    if not isinstance(env, dict) or not isinstance(artifacts, dict) or not isinstance(history, dict):
        raise TypeError("env, artifacts and history must be objects")
    for kind, counts in artifacts.items():
        if not isinstance(counts, dict) or not all(isinstance(counts.get(k), int) for k in ("count", "bytes")):
            raise TypeError(f"artifacts[{kind!r}] must hold integer count and bytes")
    numbers = [raw.get("created", 0), raw.get("updated", 0), raw["size"], raw["offset"]]
    if not all(finite(n) for n in numbers) or not isinstance(raw["size"], int) or not isinstance(raw["offset"], int):
        raise TypeError("created and updated must be finite numbers, size and offset integers")
    sha, signature, stored = raw["sha256"], raw.get("signature", ""), raw["stored"]
    if not isinstance(sha, str) or not isinstance(signature, str) or not natural(stored):
        raise TypeError("sha256 and signature must be strings, stored a non-negative integer")
    index, binaries = raw.get("index"), raw.get("binaries")
    if index is not None and (not isinstance(index, dict) or not isinstance(index.get("sha256"), str)
                              or not natural(index.get("offset")) or not natural(index.get("size"))):
        raise TypeError("index must hold a non-negative offset and size and a sha256")
    if binaries is not None:
        check_section(binaries)
    return Entry(env={str(k): str(v) for k, v in env.items()}, artifacts=artifacts, created=float(numbers[0]),
                 updated=float(numbers[1]), sha256=sha, size=raw["size"], offset=raw["offset"], history=dict(history),
                 binaries_section=binaries, signature=signature, index_section=index, from_file=True, stored=stored)


def read_manifest(path: Path, label: str = "") -> Bundle:
    """Open a bundle and read its manifest, not its payloads (the file stays open: close the bundle)."""
    path = Path(path)
    name = label or str(path)
    try:
        source: BinaryIO = open(path, "rb")
        if not HOLD_OPEN:
            with source:
                source = io.BytesIO(source.read())
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise NotAFile(f"{name}: is a directory, not a bundle file") from None
    except OSError as exc:
        raise BundleError(f"{name}: cannot read: {exc.strerror or exc}") from None
    try:
        return parse(source, path, label)
    except BaseException:
        source.close()
        raise


def parse(f: BinaryIO, path: Path, label: str = "") -> Bundle:
    """Read the manifest from ``f`` (at its start), which stays open for payload reads; messages name ``label``."""
    name = label or str(path)
    try:
        start = _payload_start(f, name)
        size = start - f.tell()
        if size > _MAX_MANIFEST:
            raise BundleError(f"{name}: corrupt: manifest length {size} is implausible")
        raw = f.read(size)
        end = f.seek(0, os.SEEK_END)
    except OSError as exc:
        raise BundleError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if len(raw) != size:
        raise BundleError(f"{name}: truncated: the manifest is cut short")
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BundleError(f"{name}: corrupt: the manifest is not valid JSON") from None
    if not isinstance(manifest, dict) or "format" not in manifest:
        raise BundleError(f"{name}: corrupt: the manifest has no format version")
    version = manifest["format"]
    if version != FORMAT or isinstance(version, bool):
        raise BundleError(f"{name}: bundle format {version!r} is not supported by this pytest-compilecache (it reads "
                          f"format {FORMAT}); upgrade the plugin, or rebuild the bundle: run the tests with "
                          "--compile-cache-rebuild")
    try:
        entries = [_entry(raw_entry) for raw_entry in manifest["entries"]]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise BundleError(f"{name}: corrupt: the manifest's entries are malformed") from None
    for e in entries:
        if e.offset < 0 or e.size < 0 or start + e.offset + e.size + e.stored > end:
            raise BundleError(f"{name}: truncated: the artifacts for {env_label(e.env)} lie past the end of the file")
        section = e.binaries_section
        if section is not None and start + section["offset"] + section["size"] > end:
            raise BundleError(f"{name}: truncated: the binaries for {env_label(e.env)} lie past the end of the file")
        index = e.index_section
        if index is not None and start + index["offset"] + index["size"] > end:
            raise BundleError(f"{name}: truncated: the key index for {env_label(e.env)} lies past the end of the file")
    supersedes, written, seal = manifest.get("supersedes", []), manifest.get("written", 0.0), manifest.get("seal", "")
    if not isinstance(supersedes, list) or not all(isinstance(n, str) for n in supersedes) or not finite(written) \
            or not isinstance(seal, str):
        raise BundleError(f"{name}: corrupt: the manifest's supersedes, written or seal is malformed")
    return Bundle(path, entries, f, start, label, supersedes=tuple(supersedes), written=float(written), seal=seal)


def make_entry(env: Mapping[str, str], payload: bytes, artifacts: dict[str, dict[str, int]], created: float = 0.0,
               binaries: CarriedBinaries | None = None, index: KeyIndex | None = None) -> Entry:
    """A new entry for ``payload`` (and the compiled binaries it carries), its artifacts packed now, stamped now."""
    entry = entry_of(env, Members.packed(_artifacts_of(payload)), created, binaries, index)
    entry.payload, entry.artifacts = payload, artifacts
    return entry


def entry_of(env: Mapping[str, str], members: Members, created: float = 0.0, binaries: CarriedBinaries | None = None,
             index: KeyIndex | None = None) -> Entry:
    """A new entry of ``members`` (and the compiled binaries it carries), stamped now."""
    table, now = members.table_blob(), time.time()
    return Entry(env=dict(env), artifacts=members.counts(), created=created or now, updated=now,
                 sha256=hashlib.sha256(table).hexdigest(), size=len(table), binaries=binaries or None,
                 index=index or None, stored=members.stored, _members=members, _table=table)


def members_of(entry: Entry, name: str) -> Members:
    """The members of an entry already read (or made here)."""
    if entry._members is None:
        raise BundleError(f"{name}: the artifacts for {env_label(entry.env)} were not read")
    return entry._members


def _artifacts_of(payload: bytes) -> list[tuple[str, str, bytes]]:
    """The artifacts of Mega-Cache bytes, taken apart by torch; one :data:`WHOLE` member where torch cannot."""
    from .. import _torchapi

    try:
        return _torchapi.artifact_contents(payload)
    except (_torchapi.MegaCacheError, _torchapi.TorchUnavailable, OSError):  # OSError: torch's import failed to write
        return [(WHOLE, "", payload)]
