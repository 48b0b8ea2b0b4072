"""An object at a URL read as a file by range requests (each one the client's, with its deadline)."""

from __future__ import annotations

import io
from typing import Any, Callable

#: How much of a bundle's start the first range request reads: the marker, and most manifests.
HEAD_BYTES = 64 * 1024
#: The most one range request asks for (and so holds in memory); each is reported to ``moved``.
CHUNK_BYTES = 8 * 1024 * 1024


class Ranges(io.RawIOBase):
    """An object read by range requests, counting the bytes it moves (``moved`` is told after each request)."""

    def __init__(self, read: Callable[[int, int], bytes], size: int,
                 moved: Callable[[int], None] | None = None) -> None:
        super().__init__()
        self.read_range, self.size = read, size
        self._report = moved
        self.pos = 0
        self.moved = 0
        self._whole: bytes | None = None
        self._head = b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

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

    def read_at(self, at: int, size: int) -> bytes:
        """``size`` bytes at ``at`` (fewer past the end), read when asked: a pack's section or artifact."""
        from ..bundle.format import BundleError

        try:
            return self._get(at, min(at + size, self.size)) if at < self.size else b""
        except BundleError as exc:  # as a file that cannot be read: the artifact or binary is left out, said once
            raise OSError(str(exc)) from None

    def known(self) -> bytes:
        """The object's first bytes, as read already (the whole object, from a server that ignores ranges)."""
        return self._whole if self._whole is not None else self._head

    def _get(self, start: int, end: int) -> bytes:
        head = self._head
        if head and start < len(head):
            return bytes(head[start:min(end, len(head))]) + (self._get(len(head), end) if end > len(head) else b"")
        if self._whole is None:
            data = self._request(start, end)
            if len(data) <= end - start:
                if start == 0 and not head:
                    self._head = data
                return data
            self._whole = data
        return self._whole[start:end]

    def _request(self, start: int, end: int) -> bytes:
        """Bytes ``start:end`` (the whole object, from a server that ignores ranges), :data:`CHUNK_BYTES` a request."""
        parts = []
        for first in range(start, end, CHUNK_BYTES):
            last = min(end, first + CHUNK_BYTES)
            data = self.read_range(first, last)
            self.moved += len(data)
            if self._report is not None:
                self._report(self.moved)
            if len(data) > last - first:
                return data
            parts.append(data)
        return b"".join(parts)
