"""A bundle at a URL (fsspec: s3://, gs://, az://, http(s)://, memory://): read through a local copy
kept per version of the object, written with conditional writes, with deltas beside it.

- Reading: the object's version (its ETag or checksum) is asked first; a local copy of that version
  is used as it is, so a machine that already has it reads nothing. Otherwise the manifest is read
  with a range request, and only the entry for this machine is downloaded (also by ranges) and
  checked against its checksums before it is kept as the local copy.
- Writing: what a session compiled is folded into the bundle with a conditional write (S3 and
  Azure Blob ``If-Match`` / ``If-None-Match``), re-reading and retrying on conflict. Where the store has no
  conditional write here, or the write cannot be done, it is uploaded instead as a
  content-addressed delta (``URL.deltas/<sha256>.bundle``, create-only) for
  ``pytest-compilecache merge --deltas``, and that is said. No reader ever sees a half-written object.

fsspec and the store's own package are imported only when a URL is used. This module never imports torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple
from urllib.parse import urlsplit
from urllib.request import url2pathname

from . import files
from .bundle import Bundle, BundleError, Entry, NotABundle, parse, read_manifest, write_bundle
from .store import BundleStore, adds_nothing, combine, env_id, stamp

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")  # one letter is a Windows drive, not a scheme
#: The extra of pytest-compilecache that installs each protocol's package.
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure",
          "http": "http", "https": "http"}
READ_ONLY = ("http", "https")
#: Protocols whose paths start with a bucket (or container) that must exist before anything is written.
OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")
S3 = ("s3", "s3a")
AZURE = ("az", "abfs", "abfss")
#: How many times a conditional write is tried (with a fresh read each time) before giving up.
ATTEMPTS = 8
#: How much of a bundle's start the first range request reads: the marker, and most manifests.
HEAD_BYTES = 64 * 1024
_MEMORY_WRITES = threading.Lock()


def is_url(text: str) -> bool:
    """Whether ``text`` names a bundle by URL rather than by a local path (``file://`` is a path)."""
    return bool(_URL.match(text)) and not text.lower().startswith("file://")


def file_url_path(text: str) -> str | None:
    """The local path a ``file://`` URL names, or ``None`` for anything else.

    Raises :class:`BundleError` for a ``file://`` URL that names another host (or a relative path)."""
    if not text.lower().startswith("file://"):
        return None
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost"):
        raise BundleError(f"{text}: a file:// URL names a path on this machine: file:///absolute/path "
                          f"(not the host {parts.netloc!r})")
    return url2pathname(parts.path)


#: The environment variable that holds fsspec options for bundle URLs (a JSON object), read by the
#: plugin (over the ini value ``compile_cache_storage_options``) and by the command line.
STORAGE_OPTIONS_ENV = "PYTEST_COMPILE_CACHE_STORAGE_OPTIONS"


def parse_storage_options(text: str) -> dict[str, Any]:
    """fsspec options written as a JSON object; raises ValueError saying what is wrong."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError('must be a JSON object, e.g. {"endpoint_url": "http://127.0.0.1:9000"}')
    return value


def redacted(url: str) -> str:
    """``url`` as messages and reports show it: without a ``user:password@`` or a query (which can
    carry credentials, such as a presigned URL's signature). A ``name@host`` without a password stays
    (adlfs writes ``abfs://container@account.dfs.core.windows.net/...``)."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    secret = bool(at) and ":" in userinfo
    if not secret and not parts.query and not parts.fragment:
        return url
    return f"{parts.scheme}://{host if secret else parts.netloc}{parts.path}"


class Version(NamedTuple):
    """What identifies one version of an object: its ETag (or checksum, or modification time) and size."""

    tag: str
    size: int


class Conflict(Exception):
    """A conditional write found the object changed (or created) by another writer."""


class NoConditionalWrite(Exception):
    """The store offers no conditional write that this plugin knows how to use."""


def _install_hint(protocol: str) -> str:
    """What to install for ``protocol``: this package's extra where it has one."""
    if protocol in EXTRAS:
        return f"pip install 'pytest-compilecache[{EXTRAS[protocol]}]'"
    return f"install the package fsspec names for {protocol}://"


def _why(exc: BaseException) -> str:
    """An exception from a store's client, in words."""
    if isinstance(exc, FileNotFoundError):
        detail = str(exc.strerror or "") if exc.strerror else str(exc)
        return f"no such object or bucket ({detail})" if detail else "no such object or bucket"
    if isinstance(exc, PermissionError):
        return f"access denied ({exc}); check the credentials"
    text = str(exc) or type(exc).__name__
    return text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"


def _precondition_failed(exc: BaseException) -> bool:
    """Whether a store's error is its answer to a conditional write whose condition did not hold."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        error = response.get("Error") if isinstance(response, dict) else None
        code = error.get("Code") if isinstance(error, dict) else None
        if code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
            return True
        if isinstance(seen, FileExistsError) or getattr(seen, "status_code", None) in (409, 412):  # Azure's
            return True
        seen = seen.__cause__ or seen.__context__
    text = str(exc).lower()
    return "precondition" in text or "pre-condition" in text


class _Ranges(io.RawIOBase):
    """An object read by range requests, counting the bytes it moves. A server that ignores ranges
    answers with the whole object; it is then kept and sliced."""

    def __init__(self, fs: Any, path: str, size: int) -> None:
        super().__init__()
        self.fs, self.path, self.size = fs, path, size
        self.pos = 0
        self.moved = 0
        self._whole: bytes | None = None
        self._head = b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        end = min(self.pos + len(buffer), self.size)
        if end <= self.pos:
            return 0
        data = self._get(self.pos, end)
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)

    def _get(self, start: int, end: int) -> bytes:
        head = self._head
        if head and start < len(head):
            known = bytes(head[start:min(end, len(head))])
            return known + (self._get(len(head), end) if end > len(head) else b"")
        if self._whole is None:
            try:
                data = self.fs.cat_file(self.path, start=start, end=end)
            except FileNotFoundError:
                raise OSError("the object was deleted while it was being read") from None
            except OSError:
                raise
            except Exception as exc:  # a client's own error types (aiohttp, botocore)
                raise OSError(_why(exc)) from None
            data = bytes(data)
            self.moved += len(data)
            if len(data) <= end - start:
                if start == 0 and not head:
                    self._head = data
                return data
            self._whole = data
        return self._whole[start:end]


class RemoteStore:
    """A bundle at a URL, with the same reading and writing interface as :class:`BundleStore`.

    ``copies`` is the folder of local copies on this machine. This URL's copies live in a folder of
    their own under it, each named after the object version it holds (and, for a copy of one
    entry, that entry's environment), so a copy can never be taken for another version. A short
    lock there lets one process of the machine download while the others wait and then find the
    copy; a second lock (:meth:`locked`) serializes the machine's writers and its warmup.
    """

    def __init__(self, url: str, copies: Path, lock_timeout: float,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.protocol = urlsplit(url).scheme.lower()
        self.storage_options = dict(storage_options or {})
        self.folder = Path(copies) / hashlib.sha256(redacted(url).encode()).hexdigest()[:16]
        self._writers = BundleStore(self.folder / "bundle", lock_timeout)
        self._readers = BundleStore(self.folder / "read", lock_timeout)
        self._fs: tuple[Any, str] | None = None
        #: What the last :meth:`add` left out or could not do, in words.
        self.dropped: list[str] = []
        #: ``{artifact type: count}`` the last :meth:`add` dropped as unused in too many updating runs.
        self.unused: dict[str, int] = {}
        #: Bytes downloaded from and uploaded to the store by this object.
        self.downloaded = 0
        self.uploaded = 0
        #: The object's size when its version was last asked (0: unknown or missing).
        self.object_size = 0
        #: Conditional writes that found the object changed by another writer (each retried).
        self.conflicts = 0
        #: Where the last :meth:`add` left this run's artifacts when it could not fold them in, else ``None``.
        self.delta: str | None = None
        #: Whether the last :meth:`add` found everything already in the bundle (and wrote nothing).
        self.unchanged = False
        #: What the last :meth:`add` did differently by design (a delta on a store without conditional writes).
        self.note = ""

    @property
    def name(self) -> str:
        """The URL as messages show it (:func:`redacted`)."""
        return redacted(self.url)

    @property
    def path(self) -> Path:
        """A local stand-in for the bundle: ``PATH.lock`` beside it is this machine's writers' lock."""
        return self._writers.path

    @property
    def deltas(self) -> str:
        """The folder of deltas beside the bundle."""
        return self.url + ".deltas/"

    # --- the store's client ---

    def filesystem(self) -> tuple[Any, str]:
        """fsspec's file system for the URL and the path inside it; a missing package is named with its extra."""
        if self._fs is None:
            hint = _install_hint(self.protocol)
            try:
                import fsspec
            except ImportError:
                hint = hint if self.protocol in EXTRAS else "pip install fsspec"
                raise BundleError(f"{self.name}: bundles at URLs need fsspec ({hint})") from None
            try:
                self._fs = fsspec.core.url_to_fs(self.url, **self.storage_options)
            except ImportError as exc:
                raise BundleError(f"{self.name}: {exc} ({hint})") from None
            except Exception as exc:
                raise BundleError(f"{self.name}: cannot open: {_why(exc)}") from None
        return self._fs

    def _call(self, doing: str, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except (BundleError, Conflict, NoConditionalWrite):
            raise
        except Exception as exc:
            if _precondition_failed(exc):
                raise Conflict(str(exc)) from None
            raise BundleError(f"{self.name}: cannot {doing}: {_why(exc)}") from None

    def version(self) -> Version | None:
        """The object's version now, or ``None`` when it does not exist. A size of 0 means unknown."""
        fs, path = self.filesystem()
        with contextlib.suppress(Exception):
            fs.invalidate_cache(path)
        try:
            info = fs.info(path)
        except FileNotFoundError as exc:
            self._check_missing(fs, path, exc)
            return None
        except Exception as exc:
            raise BundleError(f"{self.name}: cannot read it: {_why(exc)}") from None
        if info.get("type") == "directory":
            raise BundleError(f"{self.name}: is a folder, not a bundle")
        size = self.object_size = int(info.get("size") or 0)
        for field in ("ETag", "etag", "Content-MD5", "md5Hash", "content_md5", "Digest", "checksum"):
            if info.get(field):
                return Version(str(info[field]), size)
        for field in ("LastModified", "Last-Modified", "last_modified", "mtime", "updated", "created"):
            if info.get(field):
                return Version(f"{field}={info[field]}", size)
        return Version("", size)

    def _check_missing(self, fs: Any, path: str, exc: FileNotFoundError) -> None:
        """Raise :class:`BundleError` where "not found" does not mean a bundle that does not exist yet:
        an HTTP server that could not be reached or answered with an error other than 404 (fsspec
        reports both as not found), or an object store's bucket that does not exist."""
        if self.protocol in READ_ONLY:
            cause = exc.__cause__
            if cause is not None and getattr(cause, "status", None) not in (404, 410):
                raise BundleError(f"{self.name}: cannot read it: {_why(cause)}") from None
            return
        bucket = path.strip("/").split("/", 1)[0]
        if self.protocol in OBJECT_STORES and bucket and bucket != path.strip("/"):
            try:
                fs.info(bucket)
            except FileNotFoundError:
                what = "container" if self.protocol in AZURE else "bucket"
                raise BundleError(f"{self.name}: no such {what} {bucket!r} (create it, or check the URL "
                                  "and the endpoint)") from None
            except Exception:
                pass  # not allowed to ask about the bucket: the object is simply missing

    # --- the local copies ---

    @staticmethod
    def _stem(version: Version) -> str:
        return hashlib.sha256(f"{version.tag}\0{version.size}".encode()).hexdigest()[:20]

    def _copy(self, version: Version, env: Mapping[str, str] | None) -> Path:
        """Where the copy of ``version`` (whole, or only ``env``'s entry) lives."""
        part = "all" if env is None else hashlib.sha256(env_id(dict(env)).encode()).hexdigest()[:12]
        return self.folder / f"{self._stem(version)}-{part}.bundle"

    def _held(self, version: Version, env: Mapping[str, str] | None) -> Path | None:
        """This machine's copy of ``version`` holding what the reader wants, if it keeps one."""
        if not version.tag or not version.size:
            return None
        for candidate in [self._copy(version, None)] + ([self._copy(version, env)] if env is not None else []):
            if candidate.is_file():
                return candidate
        return None

    def holds(self, version: Version) -> bool:
        """Whether this machine keeps a copy of ``version`` of the object (of all or part of it)."""
        return bool(version.tag) and any(self.folder.glob(f"{self._stem(version)}-*.bundle"))

    def _keep(self, bundle: Bundle, version: Version, env: Mapping[str, str] | None) -> Bundle | None:
        """Write ``bundle``'s entries as the copy of ``version`` (all of it, or only ``env``'s entry),
        remove copies of other versions, and return the copy, open. Where the version has no tag, or
        another process that holds a newer version removed this copy at once, keep nothing (``None``)."""
        if not version.tag or not version.size:
            return None
        target = self._copy(version, env)
        self.folder.mkdir(parents=True, exist_ok=True)
        write_bundle(Bundle(target, bundle.entries))
        try:
            kept = read_manifest(target, label=self.name)
        except FileNotFoundError:
            return None
        self._forget_others(version)
        return kept

    def _forget_others(self, version: Version) -> None:
        stem = self._stem(version)
        for old in self.folder.glob("*.bundle"):
            if not old.name.startswith(stem) and re.fullmatch(r"[0-9a-f]{20}-(all|[0-9a-f]{12})\.bundle", old.name):
                with contextlib.suppress(OSError):
                    old.unlink()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold this machine's writers' lock for the URL (a session's warmup holds it while it runs)."""
        with self._writers.locked():
            yield

    # --- reading ---

    def read(self, env: Mapping[str, str] | None = None) -> Bundle | None:
        """The bundle (through this machine's copy), or ``None`` if there is no object at the URL.

        With ``env``, only that entry is downloaded, and it comes back read and checked (payload and
        carried binaries); a bundle with no entry for ``env`` is returned with its manifest only. A copy whose payload or carried
        binaries fail their checksum is downloaded again. Messages name the URL.
        """
        with self._readers.locked():
            for attempt in range(2):
                version = self.version()
                if version is None:
                    return None
                held = self._held(version, env)
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
        fs, path = self.filesystem()
        if version.size:
            raw = _Ranges(fs, path, version.size)
            remote = parse(io.BufferedReader(raw, HEAD_BYTES), self.folder / "fetch", self.name)
            remote._file = raw  # type: ignore[assignment]  # each section in one range request, no read-ahead
        else:  # a server that gives no size: the whole object, once
            data = self._call("read it", lambda: fs.cat_file(path))
            self.downloaded += len(data)
            remote = parse(io.BytesIO(data), self.folder / "fetch", self.name)
            raw = None
        try:
            wanted = remote.entries if env is None else [e for e in [remote.find(env)] if e is not None]
            if env is not None and not wanted:
                return remote
            for entry in wanted:
                remote.payload(entry)
                remote.carried(entry)
                section = entry.index_section
                if section is not None:
                    blob = remote._read(entry, "the key index", section["offset"], section["size"])
                    if len(blob) != section["size"]:
                        raise BundleError(f"{self.name}: truncated: the key index of the entry is cut short")
                    entry._index_blob = blob
        finally:
            remote.close()
            if raw is not None:
                self.downloaded += raw.moved
        whole = len(wanted) == len(remote.entries)
        kept = self._keep(Bundle(self.folder / "fetch", wanted), version, None if whole else env)
        if kept is None:
            return Bundle(self.folder / "fetch", wanted, label=self.name)
        found = kept.find(env) if env is not None else None
        if found is not None:  # as a held copy is returned: the reader's entry read and checked
            kept.payload(found)
            kept.carried(found)
        return kept

    def read_whole(self, replace_unreadable: bool = False) -> tuple[Version | None, Bundle | None]:
        """The object's version and the whole bundle, read (every payload checked), for a writer.

        With ``replace_unreadable``, a bundle whose downloaded bytes cannot be read counts as empty
        (said in :attr:`dropped`); an object that is not a bundle at all raises :class:`NotABundle`,
        and a store that cannot be read raises :class:`BundleError` (nothing is ever replaced then).
        Raises :class:`Conflict` when the object changed while it was read.
        """
        version = self.version()
        if version is None:
            return None, None
        held = self._held(version, None)
        if held is not None:
            try:
                current = read_manifest(held, label=self.name)
                current.read_all()
                return version, current
            except (BundleError, FileNotFoundError):
                held.unlink(missing_ok=True)
        fs, path = self.filesystem()
        data = self._call("read it", lambda: fs.cat_file(path))
        self.downloaded += len(data)
        if version.size and len(data) != version.size:
            raise Conflict("the object changed while it was read")
        try:
            downloaded = parse(io.BytesIO(data), self.folder / "fetch", self.name)
            downloaded.read_all()
        except NotABundle:
            raise
        except BundleError as exc:
            if not replace_unreadable:
                raise
            self.dropped.append(f"it could not be read ({exc}); its entries were dropped and a fresh one written")
            return version, None
        kept = self._keep(downloaded, version, None)
        if kept is not None:
            downloaded.path = kept.path
            kept.close()
        return version, downloaded

    # --- writing ---

    def _put(self, data: bytes, expected: Version | None, unconditional: bool = False) -> str:
        """Write ``data`` as the object if it still is ``expected`` (absent: ``None``); its new version tag.

        Raises :class:`Conflict` when another writer got there first, :class:`NoConditionalWrite`
        where the store has none this plugin can use (unless ``unconditional``: then it just writes).
        """
        fs, path = self.filesystem()
        if self.protocol in READ_ONLY:
            raise BundleError(f"{self.name}: {self.protocol}:// bundles are read-only; publish to an object "
                              "store (s3://...) and serve that over HTTP")
        if self.protocol in S3 + AZURE:
            if expected is not None and not expected.tag:
                raise NoConditionalWrite()
            condition: dict[str, Any] = {"mode": "create"}
            if self.protocol in S3:
                condition = {"IfMatch": expected.tag} if expected is not None else condition
                answer = self._call("write it", lambda: fs.pipe_file(path, data, chunksize=5 * 2**30, **condition))
            else:
                from azure.core import MatchConditions  # adlfs depends on it

                if expected is not None:
                    condition = {"etag": expected.tag, "match_condition": MatchConditions.IfNotModified}
                answer = self._call("write it", lambda: fs.pipe_file(path, data, **condition))
            tag = (answer.get("ETag") or answer.get("etag")) if isinstance(answer, dict) else None
            return str(tag) if tag else ""  # unknown: keep no copy rather than guess
        if self.protocol == "memory":
            with _MEMORY_WRITES:
                if self.version() != expected:
                    raise Conflict("changed")
                self._call("write it", lambda: fs.pipe_file(path, data))
                return (self.version() or Version("", 0)).tag
        if not unconditional:
            raise NoConditionalWrite()
        self._call("write it", lambda: fs.pipe_file(path, data))
        return ""

    @property
    def conditional(self) -> bool:
        """Whether this plugin can write the store conditionally (compare-and-swap)."""
        return self.protocol in S3 + AZURE + ("memory",)

    def update(self, change: Callable[[Bundle | None], list[Entry] | None],
               replace_unreadable: bool = False, unconditional: bool = False) -> Bundle | None:
        """Read the bundle, let ``change`` compute the new entries, write them if the object is still the
        version read; on conflict, again from a fresh read. ``change`` returns ``None`` to leave it.
        What an attempt said in :attr:`dropped` is taken back when it is retried.

        Raises :class:`NoConditionalWrite` where the store has none (nothing is written then), unless
        ``unconditional``: then it writes without a condition.
        """
        said = len(self.dropped)
        for attempt in range(ATTEMPTS):
            del self.dropped[said:]
            with self.locked():
                current: Bundle | None = None
                staging = self.folder / f"upload-{os.getpid()}.bundle"
                try:
                    version, current = self.read_whole(replace_unreadable)
                    entries = change(current)
                    if entries is None:
                        return current
                    write_bundle(Bundle(staging, entries))
                    data = staging.read_bytes()
                    tag = self._put(data, version, unconditional)
                except Conflict:
                    self.conflicts += 1
                else:
                    self.uploaded += len(data)
                    written = Version(tag, len(data))
                    target = self._copy(written, None) if tag else self.folder / "written-untagged.bundle"
                    result = read_manifest(staging, label=self.name)  # open before another process can remove it
                    files.replace(staging, target)
                    result.path = target
                    if tag:
                        self._forget_others(written)
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
            max_unused_runs: int = 0, rebuild: bool = False) -> Bundle:
        """Publish ``additions`` (see :meth:`BundleStore.add`): nothing when the bundle already holds
        them (only this machine's entry is read for that); else into the bundle itself by conditional write.

        Where the store has no conditional write, the additions are uploaded as a delta
        (:attr:`delta`, said in :attr:`note`; the delta's own bundle is returned). Where the bundle
        cannot be updated (other writers won every attempt, the store failed), a delta is left too,
        and the :class:`BundleError` raised says where.
        """
        self.dropped, self.unused, self.delta, self.unchanged, self.note = [], {}, None, False, ""
        if self.protocol in READ_ONLY:
            raise BundleError(f"{self.name}: {self.protocol}:// bundles are read-only; this run's artifacts were "
                              "not published (publish to an object store such as s3:// and serve that over HTTP)")
        stamp(additions, history, run)
        if not rebuild and max_unused_runs == 0:
            with self.locked():
                held = self._holds_already(additions)
            if held is not None:
                self.unchanged = True
                return held
        if not self.conditional:
            self.delta, delta = self._upload_delta(additions)
            self.note = (f"{self.protocol}:// offers no conditional write this plugin can use, so the bundle itself "
                         f"is never written by a session; `pytest-compilecache merge --deltas -o {self.name}` "
                         "folds the deltas in")
            return delta

        def change(current: Bundle | None) -> list[Entry]:
            self.unused = {}
            return combine(current, additions, run, max_unused_runs, rebuild, self.dropped, self.unused)

        try:
            result = self.update(change, replace_unreadable=rebuild)
        except NotABundle:
            raise
        except BundleError as exc:
            try:
                self.delta, _ = self._upload_delta(additions)
            except BundleError:
                raise exc from None
            raise BundleError(f"{exc}; this run's artifacts wait in {self.delta} for "
                              f"`pytest-compilecache merge --deltas -o {self.name}`") from None
        assert result is not None
        return result

    def _upload_delta(self, additions: list[Entry]) -> tuple[str, Bundle]:
        """Upload the additions as a content-addressed delta (create-only); its URL and local bundle."""
        self.folder.mkdir(parents=True, exist_ok=True)
        staging = self.folder / f"delta-{os.getpid()}.bundle"
        write_bundle(Bundle(staging, additions))
        data = staging.read_bytes()
        name = f"{hashlib.sha256(data).hexdigest()[:32]}.bundle"
        kept = self.folder / name
        files.replace(staging, kept)
        url = redacted(self.url) + ".deltas/" + name
        fs, path = self.filesystem()
        target = path.rstrip("/") + ".deltas/" + name
        condition: dict[str, Any] = {"mode": "create"} if self.protocol in S3 + AZURE else {}
        with contextlib.suppress(Exception):
            fs.makedirs(path.rstrip("/") + ".deltas", exist_ok=True)  # file systems with folders
        try:
            self._call("upload its delta", lambda: fs.pipe_file(target, data, **condition))
            self.uploaded += len(data)
        except Conflict:
            pass  # the same content is there already
        return url, read_manifest(kept, label=url)

    def _remove(self, url: str) -> bool:
        """Remove a delta (and this machine's copy of it); whether the store's one is gone."""
        fs, path = self.filesystem()
        name = url.rsplit("/", 1)[-1]
        with contextlib.suppress(OSError):
            (self.folder / name).unlink()
        try:
            fs.rm_file(path.rstrip("/") + ".deltas/" + name)
        except FileNotFoundError:
            return True
        except Exception:
            return False
        return True

    def list_deltas(self) -> list[str]:
        """The URLs of the deltas waiting beside the bundle."""
        fs, path = self.filesystem()
        folder = path.rstrip("/") + ".deltas"
        try:
            names = fs.ls(folder, detail=False)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise BundleError(f"{self.name}.deltas/: cannot list: {_why(exc)}") from None
        return sorted(self.deltas + str(n).rsplit("/", 1)[-1] for n in names if str(n).endswith(".bundle"))

    def remove_deltas(self, urls: list[str]) -> list[str]:
        """Remove deltas once they are folded into the bundle; those that could not be removed."""
        return [url for url in urls if not self._remove(url)]


def read_url(url: str, copies: Path, storage_options: Mapping[str, Any] | None = None) -> Bundle:
    """The whole bundle at ``url`` (every payload downloaded and checked), for the command line."""
    store = RemoteStore(url, copies, 60.0, storage_options)
    for _ in range(2):
        try:
            _, bundle = store.read_whole()
        except Conflict:
            continue
        if bundle is None:
            raise FileNotFoundError(store.name)
        return bundle
    raise BundleError(f"{store.name}: it changed while it was read, twice; try again")
