"""Files the plugin writes and locks: atomic, under unpredictable names, never through a symlink.
:func:`write_atomic` creates a random temporary name beside the target with ``O_EXCL`` (a planted file or
symlink is never followed) and renames it over the target: a reader sees the old file or the new one."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Collection, Iterable


#: How long a rename onto a file another process holds open is retried (Windows), in seconds.
REPLACE_RETRY_SECONDS = 2.0


def umask() -> int:
    """The process's umask: read from ``/proc`` where the OS tells it, else set and restored at once."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: Files :func:`link_tree` copies instead of linking: C++ and CUDA sources, which torch's
#: ahead-of-time and CUDA-template builds append to in place before building them.
COPIED_SUFFIXES = (".cpp", ".cu", ".h")


def link_tree(source: str | os.PathLike[str], dest: str | os.PathLike[str], replace: bool = False,
              leave_out: Collection[str] = (), without: tuple[str, ...] = ()) -> int:
    """Fill ``dest`` with ``source``'s files as hard links (see :func:`place_file`); how many were placed.
    Files ``dest`` has are left alone, or replaced with ``replace``; ``source``'s top-level entries in
    ``leave_out``, and files ending with a suffix in ``without``, are not placed (docs/design.md says why links)."""
    os.makedirs(dest, exist_ok=True)
    placed = 0
    with os.scandir(source) as entries:
        for entry in entries:
            if entry.name in leave_out:
                continue
            target = os.path.join(dest, entry.name)
            if entry.is_dir(follow_symlinks=False):
                placed += link_tree(entry.path, target, replace, (), without)
            elif entry.is_file(follow_symlinks=False) and not entry.name.endswith(without):
                if not (replace and os.path.lexists(target)):
                    placed += place_file(entry.path, target)
                elif not os.path.samefile(entry.path, target):
                    _copy_over(entry.path, target)
                    placed += 1
    return placed


def place_file(source: str, target: str) -> bool:
    """Put ``source`` at ``target`` whole: a hard link, or a copy for sources (:data:`COPIED_SUFFIXES`) and
    where a link cannot be made. False where ``target`` exists (left as it was)."""
    try:
        if target.endswith(COPIED_SUFFIXES):
            _copy_if_absent(source, target)
        else:
            os.link(source, target)  # made whole or not at all
        return True
    except FileExistsError:
        return False
    except OSError:
        pass  # another file system, a link limit, no hard links at all: copied below
    if os.path.lexists(target):
        return False
    _copy_over(source, target)
    return True


def _copy_over(source: str, target: str) -> None:
    """``source`` at ``target`` (a link, or a copy for sources and where links fail), renamed over it whole."""
    tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{os.getpid()}.{threading.get_ident()}.link")
    try:
        if target.endswith(COPIED_SUFFIXES) or not _linked(source, tmp):
            shutil.copy2(source, tmp)
        os.replace(tmp, target)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _copy_if_absent(source: str, target: str) -> None:
    """Copy ``source`` to ``target`` whole; ``FileExistsError`` where ``target`` exists (left as it was)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".link", dir=os.path.dirname(target))
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            shutil.copyfileobj(src, out)
        shutil.copystat(source, tmp)
        os.link(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _linked(source: str, link: str) -> bool:
    try:
        os.link(source, link)
    except OSError:
        return False
    return True


def write_atomic(path: Path, chunks: bytes | Iterable[bytes], fsync: bool = True, mtime: float | None = None) -> int:
    """Write ``chunks`` to ``path`` atomically (its file time ``mtime`` if given, before anyone sees it); return the
    size. Raises :class:`OSError` (with ``filename`` set to ``path``) after removing the temporary file."""
    path = Path(path)
    prefix, suffix = temporary_name(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=path.parent)
    except OSError as exc:
        exc.filename = str(path)
        raise
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
                f.write(chunk)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
            size = f.tell()
        os.chmod(tmp, 0o666 & ~umask())
        if mtime is not None:
            os.utime(tmp, (mtime, mtime))
        replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)
        raise
    return size


def cannot_write(folder: Path) -> str:
    """Why no file can be made in ``folder`` (in its nearest existing parent, where it is missing), found by making
    one; "" when one can (``os.access`` says yes to root on a read-only mount)."""
    existing = next((p for p in [folder, *folder.parents] if p.exists()), folder)
    try:
        fd, name = tempfile.mkstemp(prefix=".write-test-", dir=existing)
    except OSError as exc:
        return f"{existing}: {exc.strerror or exc}"
    os.close(fd)
    os.unlink(name)
    return ""


def checksum(path: Path) -> tuple[str, int]:
    """The sha256 (hex) and size of the file at ``path``, read a chunk at a time; raises :class:`OSError`."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1024 * 1024), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def temporary_name(path: Path) -> tuple[str, str]:
    """The prefix and suffix of :func:`write_atomic`'s temporary files for ``path``."""
    return f".{path.name}.", ".tmp"


def remove_leftovers(path: Path) -> list[Path]:
    """Remove temporary files a killed writer of ``path`` left beside it; the removed ones.
    Call it only while holding the lock every writer of ``path`` takes (no writer is still at work)."""
    prefix, suffix = temporary_name(path)
    exact = re.compile(re.escape(prefix) + "[a-z0-9_]{8}" + re.escape(suffix))
    removed = []
    for leftover in (p for p in path.parent.glob(f"{glob.escape(prefix)}*{suffix}") if exact.fullmatch(p.name)):
        with contextlib.suppress(OSError):
            leftover.unlink()
            removed.append(leftover)
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
    """Who holds a lock on ``lock_file``, as ``pid N (command line)``, where ``/proc/locks`` tells (else ``[]``)."""
    try:
        st = os.stat(lock_file)
        ident_here = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except (OSError, AttributeError):
        return []
    holders = []
    for fields in (line.split() for line in lines):
        if "->" in fields or len(fields) < 6 or fields[5] != ident_here or not fields[4].isdigit():
            continue
        pid = fields[4]
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            command = ""
        if len(command) > 120:
            command = command[:117] + "..."
        holders.append(f"pid {pid} ({command})" if command else f"pid {pid}")
    return list(dict.fromkeys(holders))
