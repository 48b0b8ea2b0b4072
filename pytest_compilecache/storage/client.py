"""The objects under a URL through fsspec: listed, read by range, written and removed, each within its deadline;
and what differs between stores by URL scheme, as values."""

from __future__ import annotations

import functools
import math
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from ..bundle.format import BundleError
from ..caught import caught
from .errors import DEFAULT_TIMEOUT, MIN_RATE, StoreError, StoreTimeout, transient, why
from .urls import redacted

#: A request to the store's file system: ``ask(method, *args, **kwargs)`` within its deadline.
Ask = Callable[..., Any]
#: fsspec's options for a scheme, given the user's and the network timeout in seconds.
Options = Callable[[dict[str, Any], float], dict[str, Any]]


@dataclass(frozen=True)
class Protocol:
    """What a URL's scheme needs; the default is a store reached through fsspec with nothing special about it."""

    #: The extra of pytest-compilecache that installs the protocol's package ("" where it has none).
    extra: str = ""
    #: What a path's first part names that must exist before anything is written ("" where nothing).
    bucket: str = ""
    #: The user's options with the client's connect and read timeouts at the seconds given where none are set.
    options: Options = lambda options, seconds: options
    #: Ask the store about a bucket (:attr:`bucket`): :class:`FileNotFoundError` where it does not exist.
    ask_bucket: Callable[[Ask, str], object] = lambda ask, bucket: ask("info", bucket)
    #: Plain HTTP(S): read-only, one object (no folder is listed), and a "not found" may be a server that could
    #: not be reached. aiohttp does not retry, so a request that stalled or was cut is sent once more.
    http: bool = False
    #: A folder on this machine, where a file shows as it is written: a pack is written beside its place and renamed.
    staged: bool = False


def _http_options(options: dict[str, Any], seconds: float) -> dict[str, Any]:
    client = dict(options.get("client_kwargs", {}))
    if "timeout" not in client:
        try:
            import aiohttp
        except ImportError:
            return options  # fsspec says what to install when it opens the URL
        client["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=seconds, sock_read=seconds)
    return {**options, "client_kwargs": client}


_S3 = Protocol("s3", "bucket", lambda options, seconds: {**options, "config_kwargs": {
    "connect_timeout": seconds, "read_timeout": seconds, **options.get("config_kwargs", {})}},
    # HeadBucket: s3fs 2024.12 to 2025.7 at least take an empty bucket for a missing one in ``info``
    ask_bucket=lambda ask, bucket: ask("call_s3", "head_bucket", Bucket=bucket))
_AZURE = Protocol("azure", "container", lambda options, seconds: {
    "connection_timeout": max(int(math.ceil(seconds)), 1), "read_timeout": max(int(math.ceil(seconds)), 1), **options})
_GCS = Protocol("gcs", "bucket", lambda options, seconds: {"timeout": seconds, **options})
_HTTP = Protocol("http", options=_http_options, http=True)
_FOLDER = Protocol(options=lambda options, seconds: {"auto_mkdir": True, **options}, staged=True)

#: By URL scheme (lower case); any other is :class:`Protocol`'s default.
PROTOCOLS = {"s3": _S3, "s3a": _S3, "az": _AZURE, "abfs": _AZURE, "abfss": _AZURE, "gs": _GCS, "gcs": _GCS,
             "http": _HTTP, "https": _HTTP, "local": _FOLDER, "file": _FOLDER}


class Client:
    """The objects at and under ``url``: each request has a deadline, each failure is a :class:`BundleError`
    naming the URL, and every byte moved is counted.

    A request's deadline is fsspec's own: the client's coroutine is cancelled on fsspec's event loop once
    ``network_timeout`` seconds (plus a transfer's time at :data:`MIN_RATE`) have passed, with the client's own
    retries inside it; no thread is left running. Once a store gave no answer (``gave_up``: why, also where
    another process of the session gave up on it), it is not asked again."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None,
                 network_timeout: float = DEFAULT_TIMEOUT, gave_up: str = "") -> None:
        self.url = url.rstrip("/")
        self.name = redacted(self.url)
        self.protocol = urlsplit(url).scheme.lower()
        self.kind = PROTOCOLS.get(self.protocol, Protocol())
        self.timeout = network_timeout
        self.storage_options = self.kind.options(dict(storage_options or {}), network_timeout)
        #: The message of the deadline that passed ("" while the store answers), with which every later request fails.
        self.gave_up = gave_up
        self._fs: tuple[Any, str] | None = None
        self.downloaded = self.uploaded = 0
        #: Objects a server sent whole when asked for a range, by name.
        self._whole: dict[str, bytes] = {}

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
                # A file system of its own: fsspec keeps one per set of arguments, and the endpoint or credentials
                # a client reads from the environment are not among them.
                self._fs = fsspec.core.url_to_fs(self.url, **{**self.storage_options, "skip_instance_cache": True})
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

    def ask(self, doing: str, failed: str, method: str, *args: Any, size: int = 0,
            missing: tuple[type[OSError], ...] = (FileNotFoundError,), **kwargs: Any) -> Any:
        """The file system's ``method(*args, **kwargs)`` within its deadline. No answer in time is a
        :class:`StoreTimeout` saying what it was ``doing`` (and so is every later request); an object or folder
        not there is the caller's (``missing``), any other failure a :class:`StoreError`, ``failed``: its reason.
        HTTP, whose client does not retry, is asked once more where a request failed on the way."""
        if self.gave_up:
            raise StoreTimeout(self.gave_up)
        fs = self.filesystem()[0]
        seconds = self.timeout + size / MIN_RATE
        started, attempts = time.monotonic(), 2 if self.kind.http else 1
        for attempt in range(attempts):
            if getattr(fs, "async_impl", False):  # fsspec's sync(): cancels the request on its loop once it passes
                kwargs["timeout"] = seconds - (time.monotonic() - started)
            try:
                answer = getattr(fs, method)(*args, **kwargs)
                if method == "cat_ranges":  # fsspec before 2026.6 returns a range's failure instead of raising it
                    failure = next((a for a in answer if isinstance(a, BaseException)), None)
                    if failure is not None:
                        raise failure
                return answer
            except missing:
                raise
            except Exception as exc:
                left = seconds - (time.monotonic() - started)  # the request's deadline, not one read's timeout
                if left >= 1.0 and attempt + 1 < attempts and transient(exc):
                    continue
                if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__:
                    self.gave_up = (f"{self.name}: no answer within {seconds:.0f} s while {doing}; this session goes "
                                    "on without it (--compile-cache-network-timeout sets the wait)")
                    raise StoreTimeout(self.gave_up) from None
                raise StoreError(f"{self.name}: {failed}: {why(exc)}") from None

    def size_of(self, name: str = "") -> int | None:
        """The size of the object ``name`` (the URL's own where ""), or ``None`` where there is none (or a folder);
        a missing bucket is said as a :class:`BundleError`."""
        path = self.path(name)
        self.filesystem()[0].invalidate_cache(path)
        try:
            info = self.ask("asking for it", "cannot read it", "info", path)
        except FileNotFoundError as exc:  # HTTP: a server not reached, or answering an error but 404, says so too
            cause = exc.__cause__ if self.kind.http else None
            if cause is not None and getattr(cause, "status", None) not in (404, 410):
                raise StoreError(f"{self.name}: cannot read it: {why(cause)}") from None
            self._check_bucket(path.strip("/"))
            return None
        return None if info.get("type") == "directory" else int(info.get("size") or 0)

    def _check_bucket(self, path: str) -> None:
        """Raise :class:`BundleError` where a missing object lies in a bucket that does not exist."""
        bucket = path.split("/", 1)[0]
        if not self.kind.bucket or bucket in ("", path):
            return
        try:
            self.kind.ask_bucket(functools.partial(self.ask, "asking for its bucket", "cannot ask for its bucket"),
                                 bucket)
        except FileNotFoundError:
            raise BundleError(f"{self.name}: no such {self.kind.bucket} {bucket!r} (create it, or check the URL and "
                              "the endpoint)") from None
        except StoreTimeout:  # no answer in time: said as such, not as a missing bundle
            raise
        except StoreError as exc:  # the bucket's absence is not said
            caught("asking whether the bucket exists", exc)

    def listing(self, folder: str) -> dict[str, int]:
        """``{name: size}`` of the objects in the folder ``folder`` under the URL (none where it does not exist)."""
        if self.kind.http:
            return {}
        path = self.path(folder)
        self.filesystem()[0].invalidate_cache(path)
        try:
            found = self.ask(f"listing {folder}/", f"cannot list {folder}/", "ls", path, detail=True,
                             missing=(FileNotFoundError, NotADirectoryError))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return {str(f["name"]).rstrip("/").rsplit("/", 1)[-1]: int(f.get("size") or 0)
                for f in found if f.get("type") != "directory"}

    def read_ranges(self, spans: list[tuple[str, int, int]], whole: int = 0) -> list[bytes]:
        """Bytes ``start:end`` of each object ``name`` of ``spans`` (names under the URL), asked at once (the
        client sends them concurrently); an answer shorter than asked is a failure, never used. A server that
        ignores ranges sends an object whole (``whole``: its size, for the deadline), kept for the next ranges."""
        if all(name in self._whole for name, _, _ in spans):
            return [self._whole[name][start:end] for name, start, end in spans]
        total = max(sum(end - start for _, start, end in spans), whole)
        try:
            answers = list(self.ask("downloading", f"cannot read {spans[0][0] or 'it'}", "cat_ranges",
                                    [self.path(name) for name, _, _ in spans], [s for _, s, _ in spans],
                                    [e for *_, e in spans], on_error="raise", size=total))
        except FileNotFoundError:
            raise StoreError(f"{self.name}: cannot read {spans[0][0] or 'it'}: it was removed while it was read") \
                from None
        self.downloaded += sum(len(a) for a in answers)
        got = []
        for (name, start, end), data in zip(spans, answers):
            if len(data) > end - start:  # the whole object
                self._whole[name] = bytes(data)
                data = data[start:end]
            if len(data) != end - start:
                raise StoreError(f"{self.name}: cannot read it: the server sent {len(data)} bytes of {name} where "
                                 f"{end - start} were asked (shorter than announced: a connection cut midway, or a "
                                 "server that lies)")
            got.append(bytes(data))
        return got

    def put(self, source: Path, name: str) -> None:
        """Write the file ``source`` as the object ``name`` under the URL (read from the file as it is sent); the
        store shows it whole, or not at all (an object store once its upload ended; a folder once the file written
        beside it is renamed)."""
        size = source.stat().st_size
        folder, _, base = name.rpartition("/")
        staging = f"{folder}/.{base}.{uuid.uuid4().hex}.part" if self.kind.staged else name
        ask = functools.partial(self.ask, f"uploading {name}", f"uploading {name} failed", size=size, missing=())
        try:
            ask("put_file", str(source), self.path(staging))
            if staging != name:
                ask("mv", self.path(staging), self.path(name))
        except BaseException:
            if staging != name:
                self.remove(staging)
            raise
        self.uploaded += size

    def remove(self, name: str) -> bool:
        """Remove the object ``name`` under the URL; whether it is gone."""
        try:
            self.ask(f"removing {name}", f"cannot remove {name}", "rm_file", self.path(name))
        except FileNotFoundError:
            return True
        except BundleError as exc:  # left for the next removal
            caught("removing an object from the store", exc)
            return False
        return True
