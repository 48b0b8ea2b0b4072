"""What differs between stores, by URL scheme: the package that reaches it, its timeouts, buckets, and writes."""

from __future__ import annotations

import math
import os
import uuid
from pathlib import Path
from typing import Any, Callable, ClassVar

from ..bundle.format import BundleError
from ..caught import caught

#: A request to the store's file system: ``ask(method, *args, **kwargs)`` within its deadline.
Ask = Callable[..., Any]


class Protocol:
    """A store reached through fsspec with nothing special about it."""

    #: The extra of pytest-compilecache that installs the protocol's package ("" where it has none).
    extra: ClassVar[str] = ""
    read_only: ClassVar[bool] = False
    #: Whether its folders can be listed (an HTTP server's cannot, reliably).
    lists: ClassVar[bool] = True
    #: What a path's first part names that must exist before anything is written ("" where nothing).
    bucket: ClassVar[str] = ""
    #: How many times a request that failed on the way is sent (1 where the client retries by itself).
    attempts: ClassVar[int] = 1

    def with_timeouts(self, options: dict[str, Any], seconds: float) -> dict[str, Any]:
        """fsspec's ``options`` with the client's connect and read timeouts at ``seconds`` where none are set."""
        return options

    def unreachable(self, exc: FileNotFoundError) -> BaseException | None:
        """What a "not found" hides when it does not mean a missing object, else ``None``."""
        return None

    def bucket_missing(self, ask: Ask, bucket: str) -> bool:
        """Whether ``bucket`` (:attr:`bucket`) surely does not exist; ``False`` where the store will not say."""
        try:
            self.ask_about_bucket(ask, bucket)
        except FileNotFoundError:
            return True
        except BundleError:  # no answer in time: said as such, not as a missing bundle
            raise
        except Exception as exc:  # the bucket's absence is not said
            caught("asking whether the bucket exists", exc)
            return False
        return False

    def ask_about_bucket(self, ask: Ask, bucket: str) -> None:
        """Ask the store about ``bucket``: :class:`FileNotFoundError` where it does not exist."""
        ask("info", bucket)

    def put(self, ask: Ask, source: Path, path: str) -> None:
        """Write the file ``source`` at ``path``: an object store shows an object whole once its upload ends."""
        ask("put_file", str(source), path)


class S3(Protocol):
    extra = "s3"
    bucket = "bucket"

    def with_timeouts(self, options: dict[str, Any], seconds: float) -> dict[str, Any]:
        config = {"connect_timeout": seconds, "read_timeout": seconds, **options.get("config_kwargs", {})}
        return {**options, "config_kwargs": config}

    def ask_about_bucket(self, ask: Ask, bucket: str) -> None:
        """``HeadBucket`` (s3fs 2024.12 to 2025.7 at least take an empty bucket for a missing one in ``info``)."""
        ask("call_s3", "head_bucket", Bucket=bucket)


class Azure(Protocol):
    extra = "azure"
    bucket = "container"

    def with_timeouts(self, options: dict[str, Any], seconds: float) -> dict[str, Any]:
        whole = max(int(math.ceil(seconds)), 1)
        return {"connection_timeout": whole, "read_timeout": whole, **options}


class Gcs(Protocol):
    extra = "gcs"
    bucket = "bucket"

    def with_timeouts(self, options: dict[str, Any], seconds: float) -> dict[str, Any]:
        return {"timeout": seconds, **options}


class Http(Protocol):
    """Plain HTTP(S): read-only, one object; a "not found" may be a server that could not be reached. aiohttp
    does not retry, so a read that stalled or was cut is sent once more."""

    extra = "http"
    read_only = True
    lists = False
    attempts = 2

    def with_timeouts(self, options: dict[str, Any], seconds: float) -> dict[str, Any]:
        client = dict(options.get("client_kwargs", {}))
        if "timeout" not in client:
            try:
                import aiohttp
            except ImportError:
                return options  # fsspec says what to install when it opens the URL
            client["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=seconds, sock_read=seconds)
        return {**options, "client_kwargs": client}

    def unreachable(self, exc: FileNotFoundError) -> BaseException | None:
        cause = exc.__cause__
        return cause if cause is not None and getattr(cause, "status", None) not in (404, 410) else None


class Local(Protocol):
    """A folder on this machine (``file://`` through fsspec): a file is written beside its place and renamed."""

    def put(self, ask: Ask, source: Path, path: str) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
        try:
            ask("put_file", str(source), str(part))
            os.replace(part, target)
        finally:
            part.unlink(missing_ok=True)


_PROTOCOLS: dict[str, type[Protocol]] = {
    "s3": S3, "s3a": S3, "az": Azure, "abfs": Azure, "abfss": Azure, "gs": Gcs, "gcs": Gcs,
    "http": Http, "https": Http, "local": Local, "file": Local,
}


def protocol_of(scheme: str) -> Protocol:
    """What a URL's scheme (lower case) needs."""
    return _PROTOCOLS.get(scheme, Protocol)()
