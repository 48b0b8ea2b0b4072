"""A warm test's FX graph and AOTAutograd entries and C++ binaries, linked into its folder from the template
when torch first asks for their key or folder, the template's entries written from the bundle at that moment
(docs/design.md says why); a process the test starts finds only what was asked for so far, unless the test
calls :func:`link_whole` first."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol

from .. import files
from ..caught import caught
from . import patches
from .layout import BINARY, SOURCE, TRITON

#: The folder under a cache folder each wrapped cache keeps its entries in, by the patched attribute.
_FOLDERS = {"FxGraphCache._get_tmp_dir_for_key": "fxgraph", "AOTAutogradCache._get_tmp_dir_for_key": "aotautograd"}
#: Sources torch writes itself, when absent, before it builds or loads their binaries (never linked); built
#: binaries are found beside the source torch names through ``get_path`` (other files of the two-character folders,
#: as autotune results, are found by other paths: linked when a test starts).
_WRITTEN_BY_TORCH = (SOURCE,)
#: The Mega-Cache type of the entries each of those folders holds.
_KINDS = {"fxgraph": "inductor", "aotautograd": "aot_autograd"}

_lock = threading.RLock()


class EntrySource(Protocol):
    """Where a template's on-demand entries come from (a bundle's entry, read in part)."""

    def contents(self, kind: str, key: str) -> list[bytes]:
        """The checked contents torch keeps under ``key`` (none: torch misses, and compiles)."""

    def keys(self) -> Iterable[tuple[str, str]]:
        """Every (type, key) it holds."""

    def place_folder(self, name: str, template: str) -> bool:
        """Put the carried binaries of the two-character folder ``name`` into ``template`` (none: torch builds);
        False when one could not be written (the next ask tries again)."""

    def folders(self) -> Iterable[str]:
        """The two-character folders whose binaries :meth:`place_folder` puts in place."""

    def close(self) -> None:
        """Let go of what it reads from (no more is asked of it)."""


#: Per template (its real path): the source of its entries and the (type, key) written into it so far.
_sources: dict[str, tuple[EntrySource, set[tuple[str, str]]]] = {}


@dataclasses.dataclass
class _Placing:
    template: str
    folder: str
    placed: set[str] = dataclasses.field(default_factory=set)
    whole: bool = False


_active: _Placing | None = None
#: The C++ kernels torch asked for in this process, by key (the carried files' names less folder and suffixes).
_asked: set[str] = set()


def wrap_tmp_dir_for_key(original: Callable[..., Any]) -> Callable[..., Any]:
    """``FxGraphCache``'s or ``AOTAutogradCache``'s ``_get_tmp_dir_for_key``, placing the key's entries first."""

    @functools.wraps(original)
    def get_tmp_dir_for_key(cls: Any, *args: Any, **kwargs: Any) -> Any:
        path = original(cls, *args, **kwargs)
        place(str(path))
        return path

    return get_tmp_dir_for_key


def wrap_get_path(original: Callable[..., Any]) -> Callable[..., Any]:
    """``codecache.get_path``, placing the binaries of the folder it names first."""

    @functools.wraps(original)
    def get_path(*args: Any, **kwargs: Any) -> Any:
        found = original(*args, **kwargs)
        subdir = found[1] if isinstance(found, tuple) and len(found) == 3 else None
        if isinstance(subdir, str) and len(os.path.basename(subdir)) == 2:
            extension = args[1] if len(args) > 1 else kwargs.get("extension", "")
            if isinstance(extension, str) and extension.endswith("cpp"):  # not the Python, Triton, autotune files
                _asked.add(str(found[0]))
            place(subdir, without=_WRITTEN_BY_TORCH)
        return found

    return get_path


def wrap_cache_manager_init(original: Callable[..., Any]) -> Callable[..., Any]:
    """Triton's ``FileCacheManager.__init__``, placing a carried kernel's folder before Triton looks into it."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        folder = getattr(self, "cache_dir", None)
        if isinstance(folder, str) and folder:  # a dump or override folder lies outside the test's: never placed
            place(folder)

    return __init__


def on_demand() -> frozenset[str]:
    """The top-level folders of a cache folder whose entries are placed when torch asks for them."""
    return frozenset(folder for attribute, folder in _FOLDERS.items() if patches.took(attribute))


def asked_binaries() -> frozenset[str]:
    """The keys of the C++ kernels torch asked for in this process (their source, to build or load): what it used."""
    return frozenset(_asked)


def binaries_on_demand() -> bool:
    """Whether C++ binaries are put into a template only when torch asks for their folder (``get_path``)."""
    return patches.took("get_path")


def triton_on_demand() -> bool:
    """Whether carried Triton kernels (``triton/<hash>/``) go into a template only when Triton opens their folder."""
    return patches.took("FileCacheManager.__init__")


def kinds_on_demand() -> frozenset[str]:
    """The Mega-Cache types written into a template only when torch asks for their key."""
    return frozenset(_KINDS[folder] for folder in on_demand())


def fill_from(template: str | os.PathLike[str], source: EntrySource | None) -> None:
    """From now on, write ``template``'s on-demand entries from ``source`` as torch asks (``None``: no more); the
    source it replaces is closed."""
    with _lock:
        _pools.pop(os.path.realpath(template), None)  # made again (a file system may give it the same inode)
        before = _sources.pop(os.path.realpath(template), None)
        if before is not None and before[0] is not source:
            before[0].close()
        if source is not None:
            _sources[os.path.realpath(template)] = (source, set())


def _fill(template: str, relative: str) -> None:
    """Write the entries (or binaries) of the on-demand folder ``relative`` into ``template`` from its source, once."""
    known = _sources.get(template)
    if known is None:
        return
    source, written = known
    parts = relative.split(os.sep)
    if (len(parts) == 1 and len(relative) == 2) or (len(parts) == 2 and parts[0] == TRITON):
        if ("", relative) not in written and source.place_folder(relative, template):
            written.add(("", relative))
        return
    kind = _KINDS.get(parts[0]) if len(parts) == (3 if parts[0] == "fxgraph" else 2) else None
    if kind is None or (kind, parts[-1]) in written:
        return
    from torch._inductor.codecache import sha256_hash

    for content in source.contents(kind, parts[-1]):
        os.makedirs(os.path.join(template, relative), exist_ok=True)
        files.write_atomic(Path(template, relative, sha256_hash(content)), content, fsync=False)
    written.add((kind, parts[-1]))


def make_whole(template: str | os.PathLike[str]) -> None:
    """Write every entry and binary of ``template``'s source into it now (a folder copied or linked whole needs
    them)."""
    with _lock:
        real = os.path.realpath(template)
        if real not in _sources:
            return
        later = kinds_on_demand()
        for kind, key in _sources[real][0].keys():
            if kind in later:  # the key's folder, as torch's _get_tmp_dir_for_key names it
                folder = ("fxgraph", key[1:3], key) if kind == "inductor" else ("aotautograd", key)
                _fill(real, os.path.join(*folder))
        for name in _sources[real][0].folders():
            _fill(real, name)


def place(path: str, without: tuple[str, ...] = ()) -> None:
    """Put the carried files of the folder ``path`` (of the active test's cache folder) in place, once."""
    with _lock:
        active = _active
        if active is None or active.whole:
            return
        relative = os.path.relpath(os.path.realpath(path), active.folder)
        if relative.startswith(os.pardir) or os.path.isabs(relative) or relative in active.placed:
            return  # placed already, or a folder torch was pointed at inside the test, not this cache's
        source = os.path.join(active.template, relative)
        try:
            _fill(active.template, relative)
            if os.path.isdir(source):
                files.link_tree(source, path, without=without)
        except OSError as exc:  # not placed (a full disk, say): torch misses, and the next ask tries again
            caught("placing a bundle's entry where torch asked", exc)
            return
        active.placed.add(relative)


def link_whole() -> None:
    """Make the active folder whole, for a process the test starts: it cannot ask this one for entries."""
    with _lock:
        active = _active
        if active is None or active.whole:
            return
        make_whole(active.template)
        for folder in on_demand() | ({TRITON} if triton_on_demand() else set()):
            if os.path.isdir(os.path.join(active.template, folder)):
                files.link_tree(os.path.join(active.template, folder), os.path.join(active.folder, folder))
        if binaries_on_demand():
            _link_two_character(active.template, active.folder)
        active.whole = True


def _two_character(template: str | os.PathLike[str]) -> set[str]:
    return {entry.name for entry in os.scandir(template) if len(entry.name) == 2 and entry.is_dir()}


def _link_two_character(template: str | os.PathLike[str], folder: str | os.PathLike[str], built: bool = True) -> None:
    """Link the template's two-character folders into ``folder`` but for C++ sources (and binaries unless ``built``)."""
    without = _WRITTEN_BY_TORCH if built else _WRITTEN_BY_TORCH + BINARY
    names = _holding_more(template, _two_character(template), without) if built else _pool(template).holding_more
    for name in names:
        files.link_tree(os.path.join(template, name), os.path.join(folder, name), without=without)


def _holding_more(template: str | os.PathLike[str], names: Iterable[str], without: tuple[str, ...]) -> set[str]:
    """Those of the template's two-character folders ``names`` that hold a file not ending with ``without`` (or a
    folder); a temporary file (``.name.xxxxxxxx.tmp``, being written) counts for nothing."""
    found = set()
    for name in names:
        with os.scandir(os.path.join(template, name)) as entries:
            if any(entry.is_dir() or not (entry.name.endswith(without) or entry.name.startswith("."))
                   for entry in entries):
                found.add(name)
    return found


@dataclasses.dataclass
class _Pool:
    """A template's two-character folders as last seen, and those that hold more than C++ sources and binaries."""

    state: tuple[int, int, int]
    names: set[str]
    holding_more: set[str]


#: Per template: what :func:`_pool` saw. Only the pool adds to its two-character folders, and only C++ sources and
#: binaries, until the template is made again (:func:`fill_from` forgets it then): a folder is looked into once,
#: when it first appears.
_pools: dict[str, _Pool] = {}


def _pool(template: str | os.PathLike[str]) -> _Pool:
    """The template's two-character folders, looked into only where new since the last call."""
    key = os.path.realpath(template)
    stat = os.stat(key)
    state = (stat.st_ino, stat.st_mtime_ns, stat.st_nlink)  # a folder added within a clock tick still counts
    known = _pools.get(key)
    if known is not None and known.state == state:
        return known
    names = _two_character(key)
    if known is None or known.state[0] != state[0]:
        known = _pools[key] = _Pool(state, names, _holding_more(key, names, _WRITTEN_BY_TORCH + BINARY))
        return known
    new = names - known.names
    known.state, known.names = state, names
    known.holding_more = (known.holding_more & names) | _holding_more(key, new, _WRITTEN_BY_TORCH + BINARY)
    return known


def fill_warm_folder(template: str | os.PathLike[str], folder: str | os.PathLike[str]) -> None:
    """Link into ``folder`` what a warm test needs before its first compile: all of ``template`` but
    the entries and binaries :func:`placing_from` places on demand and the C++ sources torch writes itself."""
    built = not binaries_on_demand()
    files.link_tree(template, folder, leave_out=on_demand() | (_two_character(template) if built else
                                                               _pool(template).names))
    _link_two_character(template, folder, built=built)


@contextlib.contextmanager
def placing_from(template: str, folder: str) -> Iterator[None]:
    """While active, entries of :func:`on_demand` folders are linked from ``template`` into ``folder`` as torch asks."""
    global _active
    with _lock:
        before, _active = _active, _Placing(os.path.realpath(template), os.path.realpath(folder))
    try:
        yield
    finally:
        with _lock:
            _active = before
