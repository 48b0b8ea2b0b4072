"""One writer per protocol: how its objects are written (conditionally where it can be), chosen once by protocol."""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, ClassVar, Mapping

from .errors import Conflict, NoConditionalWrite
from .interface import Version


class Writer:
    """A protocol with no conditional write this plugin can use: it writes only when told to write without one."""

    #: The extra of pytest-compilecache that installs the protocol's package ("" where it has none).
    extra: ClassVar[str] = ""
    #: Whether a write can be made only if the object is still the version read (compare-and-swap).
    conditional: ClassVar[bool] = False
    read_only: ClassVar[bool] = False
    #: What a path's first part names that must exist before anything is written ("" where nothing).
    bucket: ClassVar[str] = ""
    #: fsspec's ``pipe_file`` arguments that write only where no object is ({} where there are none).
    create_only: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol

    def with_timeouts(self, options: dict[str, Any], seconds: float) -> dict[str, Any]:
        """fsspec's ``options`` with the client's connect and read timeouts at ``seconds`` where none are set."""
        return options

    def unreachable(self, exc: FileNotFoundError) -> BaseException | None:
        """What a "not found" hides when it does not mean a missing object, else ``None``."""
        return None

    def put(self, fs: Any, path: str, data: bytes, expected: Version | None, unconditional: bool,
            version: Callable[[], Version | None]) -> str:
        """Write ``data`` if the object is still ``expected`` (absent: ``None``); its new version tag ("": unknown).
        Raises :class:`Conflict` if another writer came first, :class:`NoConditionalWrite` unless ``unconditional``."""
        if not unconditional:
            raise NoConditionalWrite()
        fs.pipe_file(path, data)
        return ""


def _tag(answer: Any) -> str:
    """The ETag a store answered a write with ("" when unknown: keep no copy rather than guess)."""
    tag = (answer.get("ETag") or answer.get("etag")) if isinstance(answer, dict) else None
    return str(tag) if tag else ""


class S3Writer(Writer):
    """S3: ``If-Match`` on the version read, ``If-None-Match`` (create-only) where there was none."""

    extra = "s3"
    conditional = True
    bucket = "bucket"
    create_only = {"mode": "create"}

    def with_timeouts(self, options: dict[str, Any], seconds: float) -> dict[str, Any]:
        config = {"connect_timeout": seconds, "read_timeout": seconds, **options.get("config_kwargs", {})}
        return {**options, "config_kwargs": config}

    def put(self, fs: Any, path: str, data: bytes, expected: Version | None, unconditional: bool,
            version: Callable[[], Version | None]) -> str:
        if expected is not None and not expected.tag:
            raise NoConditionalWrite()
        condition = {"IfMatch": expected.tag} if expected is not None else dict(self.create_only)
        return _tag(fs.pipe_file(path, data, chunksize=5 * 2**30, **condition))


class AzureWriter(Writer):
    """Azure Blob: the ETag read must still match, or create-only where there was none."""

    extra = "azure"
    conditional = True
    bucket = "container"
    create_only = {"mode": "create"}

    def with_timeouts(self, options: dict[str, Any], seconds: float) -> dict[str, Any]:
        whole = max(int(math.ceil(seconds)), 1)
        return {"connection_timeout": whole, "read_timeout": whole, **options}

    def put(self, fs: Any, path: str, data: bytes, expected: Version | None, unconditional: bool,
            version: Callable[[], Version | None]) -> str:
        if expected is None:
            return _tag(fs.pipe_file(path, data, **self.create_only))
        if not expected.tag:
            raise NoConditionalWrite()
        from azure.core import MatchConditions  # adlfs depends on it
        return _tag(fs.pipe_file(path, data, etag=expected.tag, match_condition=MatchConditions.IfNotModified))


class GcsWriter(Writer):
    """Google Cloud Storage: no conditional write this plugin uses; paths start with a bucket."""

    extra = "gcs"
    bucket = "bucket"


class HttpWriter(Writer):
    """Plain HTTP(S): read-only; a "not found" may be a server that could not be reached."""

    extra = "http"
    read_only = True

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


class MemoryWriter(Writer):
    """fsspec's in-memory file system: compare and write under one lock of this process."""

    conditional = True
    _writes: ClassVar[threading.Lock] = threading.Lock()

    def put(self, fs: Any, path: str, data: bytes, expected: Version | None, unconditional: bool,
            version: Callable[[], Version | None]) -> str:
        with self._writes:
            if version() != expected:
                raise Conflict("changed")
            fs.pipe_file(path, data)
            return (version() or Version("", 0)).tag


_WRITERS: dict[str, type[Writer]] = {
    "s3": S3Writer, "s3a": S3Writer, "az": AzureWriter, "abfs": AzureWriter, "abfss": AzureWriter,
    "gs": GcsWriter, "gcs": GcsWriter, "http": HttpWriter, "https": HttpWriter, "memory": MemoryWriter,
}


def writer_for(protocol: str) -> Writer:
    """The writer of ``protocol`` (a URL's scheme, lower case)."""
    return _WRITERS.get(protocol, Writer)(protocol)
