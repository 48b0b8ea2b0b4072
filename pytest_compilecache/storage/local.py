"""A bundle at a local path: consistent reads, and one locked read-modify-write with one merge."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator, Mapping

import filelock

from .. import files
from ..bundle.format import Bundle, BundleError, Entry, NotABundle, NotAFile, Unreadable, Unwritable, read_manifest
from ..bundle.writing import write_bundle
from ..words import counted
from .interface import REPLACED_UNREADABLE, Look, Saved, Transfer
from ..bundle.merge import Combined, combine, stamp, written_size


def lock_file(path: Path) -> Path:
    """Where the writers of the bundle at ``path`` take their lock: ``.NAME.lock`` beside it (see docs/design.md)."""
    return path.with_name(f".{path.name}.lock")


class Lock:
    """The bundle's lock file (:func:`lock_file`), held with ``filelock``; reentrant in one thread."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.file = str(lock_file(path))
        self.timeout = timeout
        self._lock = filelock.FileLock(self.file)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock, or raise :class:`BundleError` naming it (and who holds it)."""
        folder = Path(self.file).parent
        blocked = next((p for p in [folder, *folder.parents] if p.exists() and not p.is_dir()), None)
        if blocked is not None:
            raise NotAFile(f"{self.path}: cannot create its lock file {self.file}: {blocked} is not a folder")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._lock.acquire(timeout=self.timeout)
        except filelock.Timeout:
            holders = files.lock_holders(self.file)
            who = f"held by {', '.join(holders)}" if holders else "another process holds it"
            raise BundleError(f"{self.file}: could not take the lock within {self.timeout:g} s "
                              f"({who}; raise --compile-cache-lock-timeout)") from None
        except OSError as exc:
            raise Unwritable(f"{self.path}: cannot create its lock file {self.file}: {exc.strerror or exc}") from None
        try:
            yield
        finally:
            self._lock.release()


class LocalStore:
    """A bundle path, its lock, and the only code that reads or writes it (see :class:`.interface.BundleStore`)."""

    #: A path fails only for its own sake and moves nothing over a network.
    may_be_unreachable = False
    unreachable = ""
    transfer = Transfer()

    def __init__(self, path: Path, lock_timeout: float) -> None:
        self.path = Path(path)
        lock = Lock(self.path, lock_timeout)
        self.name, self.lock_file, self.locked = str(self.path), lock.file, lock.held

    def read(self, env: Mapping[str, str] | None = None) -> Bundle | None:
        """The bundle as it is now (its file kept open), or ``None`` if missing or empty; ``env`` is not needed."""
        try:
            return read_manifest(self.path) if self.path.stat().st_size else None
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            blocked = next((p for p in self.path.parents if p.exists() and not p.is_dir()), self.path.parent)
            raise NotAFile(f"{self.path}: cannot be read or written: {blocked} is a file, not a folder") from None
        except OSError as exc:
            raise BundleError(f"{self.path}: cannot read: {exc.strerror or exc}") from None

    def describe(self) -> Look:
        """The bundle's environments and size (its manifest is read), or that it is missing."""
        try:
            bundle = self.read()
        except BundleError as exc:
            return Look(str(exc), True, str(exc), Unreadable.of(exc))
        if bundle is None:
            what = "an empty file" if self.path.is_file() else "missing"
            if why := files.cannot_write(self.path.parent):
                problem = f"{self.path}: {what}, and it cannot be written ({why})"
                return Look(problem, False, problem, Unreadable.UNWRITABLE)
            return Look(f"{self.path}: {what}, the session will write the bundle there", False)
        with bundle:
            size = self.path.stat().st_size
            return Look(f"{self.path}: {counted(len(bundle.entries), 'environment')}, {size / 1e6:.2f} MB", True)

    def update(self, change: Callable[[Bundle | None], list[Entry] | None],
               dropped: list[str] | None = None) -> Bundle | None:
        """Under the lock: :meth:`.interface.BundleStore.update`."""
        with self.locked():
            files.remove_leftovers(self.path)
            try:
                current = self.read()
                if current is not None:
                    current.read_all()
            except NotABundle:
                raise
            except BundleError as exc:
                if dropped is None:
                    raise
                dropped.append(f"{REPLACED_UNREADABLE} ({exc}); its entries were dropped and a fresh one written")
                current = None
            try:
                entries = change(current)
                if entries is None:
                    kept, current = current, None  # the caller's now
                    return kept
                write_bundle(Bundle(self.path, entries))
                return read_manifest(self.path)  # under the lock: what was just written
            finally:
                if current is not None:
                    current.release()

    def add(self, additions: list[Entry], history: Mapping[str, object] | None = None, run: float | None = None,
            max_unused_runs: int = 0, rebuild: bool = False, counted: bool = True) -> Saved:
        """Merge ``additions`` into PATH by :meth:`update`, under its lock (see :meth:`.interface.BundleStore.add`)."""
        stamp(additions, history, run, counted)
        dropped: list[str] = []
        combined: list[Combined] = []

        def change(current: Bundle | None) -> list[Entry]:
            combined.append(combine(current, additions, run=run, max_unused_runs=max_unused_runs, rebuild=rebuild))
            return combined[-1].entries

        written = self.update(change, dropped=dropped if rebuild else None)
        assert written is not None
        last = combined[-1]
        return Saved(written, size=written_size(written), dropped=(*dropped, *last.dropped), unused=last.unused,
                     added=not last.new.nothing, added_artifacts=last.new.counts)
