"""An object at a URL read by range requests (each one the client's, with its deadline), into memory or into a
file a chunk at a time, counting the bytes moved."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

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


def download(read: Callable[[int, int], bytes], size: int, spans: Iterable[tuple[int, int]], into: Path,
             moved: Callable[[int], None] | None = None, known: bytes = b"", counted: int = 0) -> int:
    """Write ``spans`` (first byte, length) of an object of ``size`` bytes into the file ``into``, each at its own
    place (the rest left as zeros), :data:`CHUNK_BYTES` bytes a request, fsynced; ``known``: its first bytes,
    read already. Returns the bytes moved (after ``counted``, told to ``moved`` after each request). A server that
    ignores ranges sends the object whole, once, and it is written whole."""
    with open(into, "wb") as f:
        f.truncate(size)
        f.write(known)
        for first, last in _requests(spans, len(known), size):
            data = read(first, last)
            counted += len(data)
            if moved is not None:
                moved(counted)
            whole = len(data) > last - first
            f.seek(0 if whole else first)
            f.write(data)
            if whole:
                break
        f.flush()
        os.fsync(f.fileno())
    return counted


def _requests(spans: Iterable[tuple[int, int]], known: int, size: int) -> Iterator[tuple[int, int]]:
    """The ranges to ask for: ``spans`` past the first ``known`` bytes, in chunks."""
    for start, length in sorted(spans):
        end = min(start + length, size)
        for first in range(max(start, known), end, CHUNK_BYTES):
            yield first, min(end, first + CHUNK_BYTES)
