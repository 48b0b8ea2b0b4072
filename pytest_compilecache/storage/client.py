"""The objects under a URL through fsspec: listed, read by range, written and removed, each within its deadline."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from ..bundle.format import BundleError
from ..caught import caught
from .errors import DEFAULT_TIMEOUT, MIN_RATE, StoreError, StoreTimeout, transient, why
from .interface import NoProgress, TransferProgress
from .protocols import protocol_of
from .urls import redacted


class Client:
    """The objects at and under ``url``: each request has a deadline, each failure is a :class:`BundleError`
    naming the URL, and every byte moved is counted.

    A request's deadline is fsspec's own: the client's coroutine is cancelled on fsspec's event loop once
    ``network_timeout`` seconds (plus a transfer's time at :data:`MIN_RATE`) have passed, with the client's own
    retries inside it; no thread is left running. Once a store gave no answer, it is not asked again."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None,
                 network_timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = url.rstrip("/")
        self.name = redacted(self.url)
        self.protocol = urlsplit(url).scheme.lower()
        self.kind = protocol_of(self.protocol)
        self.timeout = network_timeout
        self.storage_options = self.kind.with_timeouts(dict(storage_options or {}), network_timeout)
        #: The message of the deadline that passed ("" while the store answers), with which every later request fails.
        self.gave_up = ""
        self._fs: tuple[Any, str] | None = None
        self.downloaded = 0
        self.uploaded = 0
        #: Objects a server sent whole when asked for a range, by name.
        self._whole: dict[str, bytes] = {}
        #: Told how each download and upload goes (a session attaches its display).
        self.progress: TransferProgress = NoProgress()

    def filesystem(self) -> tuple[Any, str]:
        """fsspec's file system for the URL and the URL's path in it; a missing package is named with its extra."""
        if self._fs is None:
            extra = self.kind.extra
            hint = f"pip install 'pytest-compilecache[{extra}]'" if extra else "pip install fsspec"
            try:
                import fsspec
            except ImportError:
                raise BundleError(f"{self.name}: bundles at URLs need fsspec ({hint})") from None
            try:
                self._fs = fsspec.core.url_to_fs(self.url, **self.storage_options)
            except ImportError as exc:
                hint = hint if extra else f"install the package fsspec names for {self.protocol}://"
                raise BundleError(f"{self.name}: {exc} ({hint})") from None
            except Exception as exc:
                raise BundleError(f"{self.name}: cannot open: {why(exc)}") from None
        return self._fs

    def path(self, name: str = "") -> str:
        """The path in :meth:`filesystem` of the object ``name`` under the URL (the URL's own where "")."""
        root = self.filesystem()[1].rstrip("/")
        return f"{root}/{name}" if name else root

    def ask(self, doing: str, method: str, *args: Any, size: int = 0, **kwargs: Any) -> Any:
        """The file system's ``method(*args, **kwargs)`` within its deadline; a client that gave no answer in
        time raises :class:`StoreTimeout`, and so does every later request. A protocol whose client does not
        retry (:attr:`~.protocols.Protocol.attempts`) is asked again where a request failed on the way."""
        if self.gave_up:
            raise StoreTimeout(self.gave_up)
        fs = self.filesystem()[0]
        seconds = self.timeout + size / MIN_RATE
        started = time.monotonic()
        for attempt in range(self.kind.attempts):
            left = seconds - (time.monotonic() - started)
            if getattr(fs, "async_impl", False):
                kwargs["timeout"] = left  # fsspec's sync(): cancels the request on its loop once it passes
            try:
                return getattr(fs, method)(*args, **kwargs)
            except Exception as exc:
                left = seconds - (time.monotonic() - started)  # the request's deadline, not one read's timeout
                if left >= 1.0 and attempt + 1 < self.kind.attempts and transient(exc):
                    continue
                if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__:
                    self.gave_up = (f"{self.name}: no answer within {seconds:.0f} s while {doing}; this session goes "
                                    "on without it (--compile-cache-network-timeout sets the wait)")
                    raise StoreTimeout(self.gave_up) from None
                raise

    def size_of(self, name: str = "") -> int | None:
        """The size of the object ``name`` (the URL's own where ""), or ``None`` where there is none (or a folder);
        a missing bucket is said as a :class:`BundleError`."""
        fs, path = self.filesystem()[0], self.path(name)
        with contextlib.suppress(Exception):
            fs.invalidate_cache(path)
        try:
            info = self.ask("asking for it", "info", path)
        except BundleError:
            raise
        except FileNotFoundError as exc:
            cause = self.kind.unreachable(exc)  # an HTTP server not reached, or answering an error but 404
            if cause is not None:
                raise StoreError(f"{self.name}: cannot read it: {why(cause)}") from None
            self._check_bucket(path)
            return None
        except Exception as exc:
            raise StoreError(f"{self.name}: cannot read it: {why(exc)}") from None
        return None if info.get("type") == "directory" else int(info.get("size") or 0)

    def _check_bucket(self, path: str) -> None:
        """Raise :class:`BundleError` where a missing object lies in a bucket that does not exist."""
        bucket = path.strip("/").split("/", 1)[0]
        if self.kind.bucket and bucket and bucket != path.strip("/") and self.kind.bucket_missing(
                lambda method, *args, **kwargs: self.ask("asking for its bucket", method, *args, **kwargs), bucket):
            raise BundleError(f"{self.name}: no such {self.kind.bucket} {bucket!r} (create it, or check the URL and "
                              "the endpoint)")

    def listing(self, folder: str) -> dict[str, int]:
        """``{name: size}`` of the objects in the folder ``folder`` under the URL (none where it does not exist)."""
        if not self.kind.lists:
            return {}
        fs, path = self.filesystem()[0], self.path(folder)
        with contextlib.suppress(Exception):
            fs.invalidate_cache(path)
        try:
            found = self.ask(f"listing {folder}/", "ls", path, detail=True)
        except BundleError:
            raise
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except Exception as exc:
            raise StoreError(f"{self.name}: cannot list {folder}/: {why(exc)}") from None
        return {str(f["name"]).rstrip("/").rsplit("/", 1)[-1]: int(f.get("size") or 0)
                for f in found if f.get("type") != "directory"}

    def read_ranges(self, spans: list[tuple[str, int, int]], whole: int = 0) -> list[bytes]:
        """Bytes ``start:end`` of each object ``name`` of ``spans`` (names under the URL), asked at once (the
        client sends them concurrently); an answer shorter than asked is a failure, never used. A server that
        ignores ranges sends an object whole (``whole``: its size, for the deadline), kept for the next ranges."""
        if not spans:
            return []
        if all(name in self._whole for name, _, _ in spans):
            return [self._whole[name][start:end] for name, start, end in spans]
        paths = [self.path(name) for name, _, _ in spans]
        total = max(sum(end - start for _, start, end in spans), whole)
        with self.progress.transfer("downloading", total) as moved:
            try:
                if len(spans) == 1:
                    answers = [self.ask("downloading", "cat_file", paths[0], start=spans[0][1], end=spans[0][2],
                                        size=total)]
                else:
                    answers = list(self.ask("downloading", "cat_ranges", paths, [s for _, s, _ in spans],
                                            [e for *_, e in spans], on_error="raise", size=total))
            except BundleError:
                raise
            except FileNotFoundError:
                raise StoreError(f"{self.name}: cannot read {spans[0][0] or 'it'}: it was removed while it was read") \
                    from None
            except Exception as exc:
                raise StoreError(f"{self.name}: cannot read {spans[0][0] or 'it'}: {why(exc)}") from None
            got = sum(len(a) for a in answers)
            self.downloaded += got
            if moved is not None:
                moved(got)
        for (name, start, end), data in zip(spans, answers):
            if len(data) > end - start:  # the whole object
                self._whole[name] = bytes(data)
        answers = [data[start:end] if len(data) > end - start else data for (_, start, end), data in zip(spans, answers)]
        for (name, start, end), data in zip(spans, answers):
            if len(data) != end - start:
                raise StoreError(f"{self.name}: cannot read it: the server sent {len(data)} bytes of {name} where "
                                  f"{end - start} were asked (shorter than announced: a connection cut midway, or a "
                                  "server that lies)")
        return [bytes(a) for a in answers]

    def put(self, source: Path, name: str) -> None:
        """Write the file ``source`` as the object ``name`` under the URL (read from the file as it is sent); the
        store makes it visible whole, or not at all."""
        if self.kind.read_only:
            raise BundleError(f"{self.name}: {self.protocol}:// bundles are read-only; publish to an object "
                              "store (s3://...) and serve that over HTTP")
        path, size = self.path(name), source.stat().st_size
        with self.progress.transfer("uploading", size) as moved:
            try:
                self.kind.put(lambda method, *args: self.ask(f"uploading {name}", method, *args, size=size),
                              source, path)
            except BundleError:
                raise
            except Exception as exc:
                raise StoreError(f"{self.name}: uploading {name} failed: {why(exc)}") from None
            if moved is not None:
                moved(size)
        self.uploaded += size

    def remove(self, name: str) -> bool:
        """Remove the object ``name`` under the URL; whether it is gone."""
        try:
            self.ask(f"removing {name}", "rm_file", self.path(name))
        except FileNotFoundError:
            return True
        except Exception as exc:  # left for the next removal
            caught("removing a replaced pack from the store", exc)
            return False
        return True
