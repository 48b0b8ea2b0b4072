"""One writer per protocol: how its objects are written (conditionally where it can be), chosen once by protocol."""

from __future__ import annotations

import base64
import math
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, ClassVar

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

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol

    def with_timeouts(self, options: dict[str, Any], seconds: float) -> dict[str, Any]:
        """fsspec's ``options`` with the client's connect and read timeouts at ``seconds`` where none are set."""
        return options

    def unreachable(self, exc: FileNotFoundError) -> BaseException | None:
        """What a "not found" hides when it does not mean a missing object, else ``None``."""
        return None

    def bucket_missing(self, fs: Any, bucket: str) -> bool:
        """Whether ``bucket`` (:attr:`bucket`) surely does not exist; ``False`` where the store will not say."""
        try:
            self.ask_about_bucket(fs, bucket)
        except FileNotFoundError:
            return True
        except Exception:
            return False
        return False

    def ask_about_bucket(self, fs: Any, bucket: str) -> None:
        """Ask the store about ``bucket``: :class:`FileNotFoundError` where it does not exist."""
        fs.info(bucket)

    def put(self, fs: Any, path: str, source: Path, expected: Version | None, unconditional: bool,
            version: Callable[[], Version | None]) -> str:
        """Write the file ``source`` as the object at ``path`` if it is still ``expected`` (absent: ``None``), read
        from the file as it is sent; its new version tag ("": unknown). Raises :class:`Conflict` if another writer
        came first, :class:`NoConditionalWrite` unless ``unconditional``."""
        if not unconditional:
            raise NoConditionalWrite()
        fs.put_file(str(source), path)
        return ""

    def create(self, fs: Any, path: str, source: Path) -> None:
        """Write the file ``source`` as the object at ``path`` only where there is none (:class:`Conflict` where
        there is one), or, where the protocol cannot tell, whatever is there."""
        self.put(fs, path, source, None, True, lambda: None)


def _tag(answer: Any) -> str:
    """The ETag a store answered a write with ("" when unknown: keep no copy rather than guess)."""
    tag = (answer.get("ETag") or answer.get("etag")) if isinstance(answer, dict) else None
    return str(tag) if tag else ""


class S3Writer(Writer):
    """S3: ``If-Match`` on the version read, ``If-None-Match`` (create-only) where there was none."""

    extra = "s3"
    conditional = True
    bucket = "bucket"

    def with_timeouts(self, options: dict[str, Any], seconds: float) -> dict[str, Any]:
        config = {"connect_timeout": seconds, "read_timeout": seconds, **options.get("config_kwargs", {})}
        return {**options, "config_kwargs": config}

    def ask_about_bucket(self, fs: Any, bucket: str) -> None:
        """``HeadBucket`` (s3fs 2024.12 to 2025.7 at least take an empty bucket for a missing one in ``info``)."""
        fs.call_s3("head_bucket", Bucket=bucket)

    def put(self, fs: Any, path: str, source: Path, expected: Version | None, unconditional: bool,
            version: Callable[[], Version | None]) -> str:
        if expected is not None and not expected.tag:
            raise NoConditionalWrite()
        import fsspec.asyn

        bucket, key, _ = fs.split_path(path)
        condition = {"IfMatch": expected.tag} if expected is not None else {"IfNoneMatch": "*"}
        answer = fsspec.asyn.sync(fs.loop, self._put_object, fs, bucket, key, source, condition)
        fs.invalidate_cache(path)
        return _tag(answer)

    @staticmethod
    async def _put_object(fs: Any, bucket: str, key: str, source: Path, condition: dict[str, str]) -> Any:
        """One ``PUT`` of the file ``source`` (up to 5 GiB) with the file system's own settings, retried by botocore
        alone, which sends the file again from its first byte (s3fs's retries would send it from where the failed
        attempt stopped reading it: a part of the bundle, stored under the condition)."""
        from botocore.exceptions import ClientError
        from s3fs.errors import translate_boto_error

        await fs.set_session()
        client = await fs.get_s3(bucket)
        accepted = client.meta.service_model.operation_model("PutObject").input_shape.members
        if not set(condition) <= set(accepted):
            raise OSError(f"this botocore has no {' or '.join(condition)} on PutObject, which conditional writes need; "
                          "pip install -U 'pytest-compilecache[s3]' botocore aiobotocore")
        settings = {k: v for k, v in {**fs.s3_additional_kwargs, **fs.req_kw}.items()
                    if k in accepted and v is not None}  # None: a setting s3fs is told to leave out
        try:
            with open(source, "rb") as body:
                return await client.put_object(**{**settings, "Bucket": bucket, "Key": key, "Body": body,
                                                  "ContentLength": source.stat().st_size, **condition})
        except ClientError as exc:
            raise translate_boto_error(exc) from exc


class AzureWriter(Writer):
    """Azure Blob: the ETag read must still match, or create-only where there was none."""

    extra = "azure"
    conditional = True
    bucket = "container"

    def with_timeouts(self, options: dict[str, Any], seconds: float) -> dict[str, Any]:
        whole = max(int(math.ceil(seconds)), 1)
        return {"connection_timeout": whole, "read_timeout": whole, **options}

    #: A blob larger than this is sent as blocks of this size (what an upload holds in memory), then committed.
    block: ClassVar[int] = 4 * 1024 * 1024

    def put(self, fs: Any, path: str, source: Path, expected: Version | None, unconditional: bool,
            version: Callable[[], Version | None]) -> str:
        if expected is not None and not expected.tag:
            raise NoConditionalWrite()
        from azure.core import MatchConditions  # adlfs depends on it

        if source.stat().st_size <= self.block:
            condition: dict[str, Any] = {"mode": "create"} if expected is None else {
                "etag": expected.tag, "match_condition": MatchConditions.IfNotModified}
            return _tag(fs.pipe_file(path, source.read_bytes(), **condition))
        import fsspec.asyn

        condition = ({"match_condition": MatchConditions.IfMissing} if expected is None else
                     {"etag": expected.tag, "match_condition": MatchConditions.IfNotModified})

        container, blob, _ = fs.split_path(path)
        answer = fsspec.asyn.sync(fs.loop, self._in_blocks, fs, container, blob, source, condition)
        fs.invalidate_cache(path)
        return _tag(answer)

    async def _in_blocks(self, fs: Any, container: str, blob: str, source: Path, condition: dict[str, Any]) -> Any:
        """Stage ``source`` a block at a time under names no other writer uses, then commit them if ``condition``
        still holds: the blob is replaced whole, or not at all."""
        from azure.core.exceptions import HttpResponseError
        from azure.storage.blob import BlobBlock

        names = uuid.uuid4().hex
        async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
            blocks = []
            with open(source, "rb") as f:
                for number, data in enumerate(iter(lambda: f.read(self.block), b"")):
                    block = base64.b64encode(f"{names}{number:08d}".encode()).decode()
                    await client.stage_block(block, data, length=len(data))
                    blocks.append(BlobBlock(block_id=block))
            try:
                return await client.commit_block_list(blocks, metadata={"is_directory": "false"}, **condition)
            except HttpResponseError as exc:
                if getattr(exc, "error_code", None) == "InvalidBlockList":  # another writer's commit discarded ours
                    raise Conflict(str(exc)) from None
                raise


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

    def put(self, fs: Any, path: str, source: Path, expected: Version | None, unconditional: bool,
            version: Callable[[], Version | None]) -> str:
        with self._writes:
            if version() != expected:
                raise Conflict("changed")
            fs.pipe_file(path, source.read_bytes())  # the object lives in this process's memory anyway
            return (version() or Version("", 0)).tag


_WRITERS: dict[str, type[Writer]] = {
    "s3": S3Writer, "s3a": S3Writer, "az": AzureWriter, "abfs": AzureWriter, "abfss": AzureWriter,
    "gs": GcsWriter, "gcs": GcsWriter, "http": HttpWriter, "https": HttpWriter, "memory": MemoryWriter,
}


def writer_for(protocol: str) -> Writer:
    """The writer of ``protocol`` (a URL's scheme, lower case)."""
    return _WRITERS.get(protocol, Writer)(protocol)
