"""One object at a URL through fsspec: its version, reads and writes, each within its deadline."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from ..bundle.format import BundleError
from .deadlines import DEFAULT_TIMEOUT, Deadlines
from .errors import Conflict, NoConditionalWrite, precondition_failed, transient, why
from .interface import NoProgress, TransferProgress, Version
from .urls import redacted
from .writers import writer_for


class Client:
    """The object at ``url``: each request has a deadline, and each failure is a :class:`BundleError` naming it."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None,
                 network_timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = url
        self.name = redacted(url)
        self.protocol = urlsplit(url).scheme.lower()
        self.writer = writer_for(self.protocol)
        self.storage_options = self.writer.with_timeouts(dict(storage_options or {}), network_timeout)
        self.deadlines = Deadlines(self.name, network_timeout)
        self._fs: tuple[Any, str] | None = None
        #: Bytes downloaded and uploaded, and conditional writes that found the object changed (each retried).
        self.downloaded = 0
        self.uploaded = 0
        self.conflicts = 0
        #: The object's size when its version was last asked (0: unknown or missing).
        self.size = 0
        #: Told how each download and upload goes (a session attaches its display).
        self.progress: TransferProgress = NoProgress()

    def filesystem(self) -> tuple[Any, str]:
        """fsspec's file system for the URL and the path inside it; a missing package is named with its extra."""
        if self._fs is None:
            extra = self.writer.extra
            hint = f"pip install 'pytest-compilecache[{extra}]'" if extra else "pip install fsspec"
            try:
                import fsspec
            except ImportError:
                raise BundleError(f"{self.name}: bundles at URLs need fsspec ({hint})") from None
            try:
                self._fs = self.deadlines.run("opening it",
                                              lambda: fsspec.core.url_to_fs(self.url, **self.storage_options))
            except BundleError:
                raise
            except ImportError as exc:
                hint = hint if extra else f"install the package fsspec names for {self.protocol}://"
                raise BundleError(f"{self.name}: {exc} ({hint})") from None
            except Exception as exc:
                raise BundleError(f"{self.name}: cannot open: {why(exc)}") from None
        return self._fs

    def call(self, doing: str, action: Callable[[], Any], size: int = 0) -> Any:
        """``action()`` within its deadline, its failure said as "``doing`` failed" (or :class:`Conflict`)."""
        try:
            return self.deadlines.run(doing, action, size)
        except (BundleError, Conflict, NoConditionalWrite):
            raise
        except Exception as exc:
            if precondition_failed(exc):
                raise Conflict(str(exc)) from None
            raise BundleError(f"{self.name}: {doing} failed: {why(exc)}") from None

    def version(self) -> Version | None:
        """The object's version now, or ``None`` when it does not exist. A size of 0 means unknown."""
        fs, path = self.filesystem()
        with contextlib.suppress(Exception):
            fs.invalidate_cache(path)
        try:
            info = self.deadlines.retried("reading its version", lambda: fs.info(path), transient)
        except BundleError:
            raise
        except FileNotFoundError as exc:
            cause = self.writer.unreachable(exc)  # an HTTP server not reached, or answering an error but 404
            if cause is not None:
                raise BundleError(f"{self.name}: cannot read it: {why(cause)}") from None
            self.deadlines.run("reading its version", lambda: self._check_bucket(fs, path))
            return None
        except Exception as exc:
            raise BundleError(f"{self.name}: cannot read it: {why(exc)}") from None
        if info.get("type") == "directory":
            raise BundleError(f"{self.name}: is a folder, not a bundle")
        self.size = int(info.get("size") or 0)
        tags = [str(info[f]) for f in ("ETag", "etag", "Content-MD5", "md5Hash", "content_md5", "Digest", "checksum")
                if info.get(f)]
        tags += [f"{f}={info[f]}" for f in ("LastModified", "Last-Modified", "last_modified", "mtime", "updated",
                                             "created") if info.get(f)]
        return Version(tags[0] if tags else "", self.size)

    def _check_bucket(self, fs: Any, path: str) -> None:
        """Raise :class:`BundleError` where a missing object lies in a bucket that does not exist."""
        bucket = path.strip("/").split("/", 1)[0]
        if self.writer.bucket and bucket and bucket != path.strip("/") and self.writer.bucket_missing(fs, bucket):
            raise BundleError(f"{self.name}: no such {self.writer.bucket} {bucket!r} (create it, or check the URL and "
                              "the endpoint)")

    def cat(self) -> bytes:
        """The whole object (as long as its version said, when it said)."""
        fs, path = self.filesystem()
        with self.progress.transfer("downloading", self.size) as moved:
            data = self._read("downloading it", lambda: fs.cat_file(path), self.size)
            if moved is not None:
                moved(len(data))
        return data

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of the object (a server that ignores ranges sends it whole)."""
        fs, path = self.filesystem()
        return self._read(f"downloading bytes {start}-{end}", lambda: fs.cat_file(path, start=start, end=end),
                          end - start, whole=self.size)

    def _read(self, doing: str, action: Callable[[], Any], size: int, whole: int = 0) -> bytes:
        """``action()``'s bytes, read again where it failed midway, within one deadline (long enough for ``whole``)."""

        def read() -> bytes:
            data = bytes(action())
            if size and len(data) < size and not (whole and len(data) == whole):
                raise ShortRead(f"the server sent {len(data)} bytes where {size} were asked (shorter than "
                                "announced: a connection cut midway, or a server that lies)")
            return data

        try:
            data = self.deadlines.retried(doing, read, transient, max(size, whole))
        except BundleError:
            raise
        except FileNotFoundError:
            raise BundleError(f"{self.name}: cannot read it: it was deleted while it was being read") from None
        except Exception as exc:
            raise BundleError(f"{self.name}: cannot read it: {why(exc)}") from None
        self.downloaded += len(data)
        return data

    def put(self, source: Path, expected: Version | None, unconditional: bool = False) -> str:
        """Write the file ``source`` (read as it is sent) if the object is still ``expected`` (see
        :meth:`.writers.Writer.put`); its new version tag."""
        fs, path = self.filesystem()
        if self.writer.read_only:
            raise BundleError(f"{self.name}: {self.protocol}:// bundles are read-only; publish to an object "
                              "store (s3://...) and serve that over HTTP")
        tag: str = self._upload("uploading it", source, lambda: self.writer.put(fs, path, source, expected,
                                                                                 unconditional, self.version))
        return tag

    def create(self, target: str, source: Path, doing: str) -> None:
        """Write the file ``source`` as the object ``target`` (a path in :meth:`filesystem`) where none is (see
        :meth:`.writers.Writer.create`)."""
        fs, _ = self.filesystem()
        self._upload(doing, source, lambda: self.writer.create(fs, target, source))

    def _upload(self, doing: str, source: Path, action: Callable[[], Any]) -> Any:
        """``action()``, which uploads ``source``, shown and counted (see :meth:`call`)."""
        size = source.stat().st_size
        with self.progress.transfer("uploading", size) as moved:
            answer = self.call(doing, action, size)
            if moved is not None:
                moved(size)
        self.uploaded += size
        return answer


class ShortRead(OSError):
    """A read that brought fewer bytes than asked: read again, never used."""
