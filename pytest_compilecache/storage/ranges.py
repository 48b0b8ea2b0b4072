"""An object at a URL read as a file by range requests (each one the client's, with its deadline)."""

from __future__ import annotations

import io
from typing import Any, Callable

#: How much of a bundle's start the first range request reads: the marker, and most manifests.
HEAD_BYTES = 64 * 1024
#: The most one range request asks for (and so holds in memory).
CHUNK_BYTES = 8 * 1024 * 1024


class Ranges(io.RawIOBase):
    """An object of ``size`` bytes read by ``read(start, end)``, :data:`CHUNK_BYTES` at most a request."""

    def __init__(self, read: Callable[[int, int], bytes], size: int) -> None:
        super().__init__()
        self.read_range, self.size = read, size
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        data = self._get(self.pos, min(self.pos + len(buffer), self.size))
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)

    def read_at(self, at: int, size: int) -> bytes:
        """``size`` bytes at ``at`` (fewer past the end), read when asked: a pack's section or artifact."""
        from ..bundle.format import BundleError

        try:
            return self._get(at, min(at + size, self.size))
        except BundleError as exc:  # as a file that cannot be read: the artifact or binary is left out, said once
            raise OSError(str(exc)) from None

    def _get(self, start: int, end: int) -> bytes:
        return b"".join(self.read_range(first, min(end, first + CHUNK_BYTES))
                        for first in range(start, end, CHUNK_BYTES))
