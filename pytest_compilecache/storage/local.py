"""A bundle at a local path: consistent reads, and one locked read-modify-write with one merge."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator, Mapping

import filelock

from .. import files
from ..bundle.format import (Bundle, BundleError, Entry, NotABundle, NotAFile, Unreadable, encoded_size,
                             read_manifest, write_bundle)
from ..words import counted
from .interface import Look, Saved, Transfer, Version
from .merge import New, combine, stamp, what_is_new


def lock_file(path: Path) -> Path:
    """Where the writers of the bundle at ``path`` take their lock: ``.NAME.lock`` beside it, hidden,
    empty, left in place (every process that may write the bundle sees its folder)."""
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
            raise BundleError(
                f"{self.file}: could not take the lock within {self.timeout:g} s "
                f"({who}; raise --compile-cache-lock-timeout)"
            ) from None
        except OSError as exc:
            raise BundleError(f"{self.path}: cannot create its lock file {self.file}: {exc.strerror or exc}") from None
        try:
            yield
        finally:
            self._lock.release()


class LocalStore:
    """A bundle path, its lock, and the only code that reads or writes it (see :class:`.interface.BundleStore`)."""

    def __init__(self, path: Path, lock_timeout: float) -> None:
        self.path = Path(path)
        self._lock = Lock(self.path, lock_timeout)

    @property
    def name(self) -> str:
        """The bundle as the user named it, for messages."""
        return str(self.path)

    @property
    def lock_file(self) -> str:
        """``.NAME.lock`` beside the bundle (:func:`lock_file`)."""
        return self._lock.file

    @property
    def deltas(self) -> str:
        """"": deltas are left only beside bundles at URLs."""
        return ""

    @property
    def may_be_unreachable(self) -> bool:
        """A path fails only for its own sake (a corrupt file, a folder that cannot be written)."""
        return False

    @property
    def unreachable(self) -> str:
        """A path is always reached."""
        return ""

    @property
    def transfer(self) -> Transfer:
        """Nothing is moved over a network."""
        return Transfer()

    def read(self, env: Mapping[str, str] | None = None) -> Bundle | None:
        """The bundle as it is now (its file kept open for payload reads), or ``None`` if missing.

        ``env`` is not needed: the whole file is here. An empty file counts as missing: it holds
        nothing to lose, and writes always replace whole files."""
        try:
            if self.path.stat().st_size == 0:
                return None
            return read_manifest(self.path)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            blocked = next((p for p in self.path.parents if p.exists() and not p.is_dir()), self.path.parent)
            raise NotAFile(f"{self.path}: cannot be read or written: {blocked} is a file, not a folder") from None
        except OSError as exc:
            raise BundleError(f"{self.path}: cannot read: {exc.strerror or exc}") from None

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold the bundle's lock file (reentrant in one thread), or raise :class:`BundleError` naming it."""
        return self._lock.held()

    def version(self) -> Version | None:
        """The file's modification time and size, or ``None`` when it is missing (or empty, which counts as missing)."""
        try:
            info = self.path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise BundleError(f"{self.path}: cannot read: {exc.strerror or exc}") from None
        return Version(f"mtime={info.st_mtime_ns}", info.st_size) if info.st_size else None

    def holds(self, version: Version) -> bool:
        """Whether the file is ``version`` now."""
        return self.version() == version

    def describe(self) -> Look:
        """The bundle's environments and size (its manifest is read), or that it is missing."""
        try:
            bundle = self.read()
        except BundleError as exc:
            return Look(str(exc), True, str(exc), Unreadable.of(exc))
        if bundle is None:
            empty = self.path.is_file()
            return Look(f"{self.path}: {'an empty file' if empty else 'missing'}, the session will write the bundle "
                        "there", False)
        with bundle:
            size = self.path.stat().st_size
            return Look(f"{self.path}: {counted(len(bundle.entries), 'environment')}, {size / 1e6:.2f} MB", True)

    def update(self, change: Callable[[Bundle | None], list[Entry] | None],
               unconditional: bool = False) -> Bundle | None:
        """Under the lock: read PATH, let ``change`` compute the new entries, write them atomically
        (``unconditional`` changes nothing: the lock keeps every write safe). ``change`` returns ``None``
        to leave PATH as it is. Returns the bundle now at PATH."""
        return self._update(change, [])

    def _update(self, change: Callable[[Bundle | None], list[Entry] | None], dropped: list[str],
                replace_unreadable: bool = False) -> Bundle | None:
        """:meth:`update`; with ``replace_unreadable``, a PATH that is a bundle but cannot be read
        (corrupt, truncated) counts as empty, said in ``dropped``; a file that is not a bundle is never replaced."""
        with self.locked():
            files.remove_leftovers(self.path)
            try:
                current = self.read()
                if current is not None:
                    current.read_all()
            except NotABundle:
                raise
            except BundleError as exc:
                if not replace_unreadable:
                    raise
                dropped.append(f"it could not be read ({exc}); its entries were dropped and a fresh one written")
                current = None
            try:
                entries = change(current)
                if entries is None:
                    return current
                result = Bundle(self.path, entries)
                write_bundle(result)
                return result
            finally:
                if current is not None:
                    current.close()

    def add(self, additions: list[Entry], history: Mapping[str, object] | None = None, run: float | None = None,
            max_unused_runs: int = 0, rebuild: bool = False) -> Saved:
        """Merge ``additions`` into PATH, under its lock (see :meth:`.interface.BundleStore.add`)."""
        stamp(additions, history, run)
        dropped: list[str] = []
        combined = []

        new: list[New] = []

        def change(current: Bundle | None) -> list[Entry]:
            new.append(what_is_new(current, additions))
            combined.append(combine(current, additions, run=run, max_unused_runs=max_unused_runs, rebuild=rebuild))
            return combined[-1].entries

        result = self._update(change, dropped, replace_unreadable=rebuild)
        assert result is not None
        size = result.path.stat().st_size if result.path.is_file() else encoded_size(result)
        return Saved(result, size=size, dropped=(*dropped, *combined[-1].dropped), unused=combined[-1].unused,
                     added=not new[-1].nothing, added_artifacts=new[-1].counts)

    def write_warning(self) -> str:
        """Nothing: every write is made under the lock."""
        return ""

    def list_deltas(self) -> list[str]:
        """No deltas: they are left only beside bundles at URLs."""
        return []

    def remove_deltas(self, urls: list[str]) -> list[str]:
        """``urls``: no delta is ever kept beside a path."""
        return list(urls)
