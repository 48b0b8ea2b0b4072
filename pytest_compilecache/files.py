"""Files the plugin writes and locks: atomic, under unpredictable names, never through a symlink.

Every file the plugin writes goes through :func:`write_atomic`: a temporary file with a random
name is created beside the target with ``O_EXCL`` (so a planted file or symlink is never opened or
followed), given the user's umask, fsynced, and renamed over the target. A reader sees the old file
or the new one. Where the rename fails because another process holds the target open (Windows),
it is retried for a short while before the error is reported. Nothing is left behind on failure;
what a killed writer left is removed by the next writer that holds the target's lock.
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

#: How long a rename onto a file another process holds open is retried (Windows), in seconds.
REPLACE_RETRY_SECONDS = 2.0


def umask() -> int:
    """The process's umask: read from ``/proc`` where the OS tells it, else set and restored at once
    (which other threads could see for a moment)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, chunks: bytes | Iterable[bytes], fsync: bool = True) -> int:
    """Write ``chunks`` to ``path`` atomically; return the size. Raises :class:`OSError` (with
    ``filename`` set to ``path``) after removing the temporary file."""
    path = Path(path)
    prefix, suffix = temporary_name(path)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
                f.write(chunk)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
            size = f.tell()
        os.chmod(tmp, 0o666 & ~umask())
        replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)
        raise
    return size


def temporary_name(path: Path) -> tuple[str, str]:
    """The prefix and suffix of :func:`write_atomic`'s temporary files for ``path``."""
    return f".{path.name}.", ".tmp"


def remove_leftovers(path: Path) -> list[Path]:
    """Remove temporary files a killed writer of ``path`` left beside it; the removed ones.

    Call it only while holding the lock every writer of ``path`` takes: then no temporary file of
    ``path`` can belong to a writer still at work.
    """
    prefix, suffix = temporary_name(path)
    exact = re.compile(re.escape(prefix) + "[a-z0-9_]{8}" + re.escape(suffix))
    removed = []
    for leftover in path.parent.glob(f"{glob.escape(prefix)}*{suffix}"):
        if not exact.fullmatch(leftover.name):
            continue
        try:
            leftover.unlink()
            removed.append(leftover)
        except OSError:
            pass
    return removed


def replace(source: str | Path, target: str | Path, sleep: Callable[[float], None] = time.sleep) -> None:
    """``os.replace``, retried with backoff while the target is held open elsewhere (Windows
    ``PermissionError``); the last error is raised when that lasts past :data:`REPLACE_RETRY_SECONDS`."""
    waited, delay = 0.0, 0.01
    while True:
        try:
            os.replace(source, target)
            return
        except PermissionError:
            if os.name != "nt" or waited >= REPLACE_RETRY_SECONDS:
                raise
            sleep(delay)
            waited += delay
            delay = min(delay * 2, 0.25)


def lock_holders(lock_file: str | Path) -> list[str]:
    """Who holds a lock on ``lock_file``, as ``pid N (command line)``, where the OS can tell (Linux
    lists file locks in ``/proc/locks``); an empty list where it cannot."""
    try:
        st = os.stat(lock_file)
        ident_here = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except (OSError, AttributeError):
        return []
    holders = []
    for line in lines:
        fields = line.split()
        if "->" in fields:
            continue
        try:
            pid, ident = fields[4], fields[5]
        except IndexError:
            continue
        if ident != ident_here or not pid.isdigit():
            continue
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            command = ""
        if len(command) > 120:
            command = command[:117] + "..."
        holders.append(f"pid {pid} ({command})" if command else f"pid {pid}")
    return list(dict.fromkeys(holders))
