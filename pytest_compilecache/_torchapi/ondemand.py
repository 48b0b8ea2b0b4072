"""A ``warm_cache`` test's FX graph and AOTAutograd entries and its C++ binaries, linked into its folder when torch first asks for their key
(and the same for the session's folder, where tests without a fixture compile).

A warm test's folder starts as hard links to the session's template, the bundle's files. Linking
every entry made each test pay for the whole bundle (a few hundred files for a suite of a few dozen
small graphs) to read the one or two it compiles. torch finds an entry's folder through
``FxGraphCache._get_tmp_dir_for_key`` and ``AOTAutogradCache._get_tmp_dir_for_key``, for its
lookups and its writes alike; wrapped, each links the template's entries for that key into the
test's folder before torch looks, so torch sees what a folder linked whole would show it. C++
binaries lie in two-character folders named by their key; torch finds such a folder through
``codecache.get_path`` (for the source it writes, then the binary beside it, which it builds only
where it is missing): wrapped, it links the template's binaries of that folder first. The other
files of those folders (autotune results, found beside a kernel's source by another path) are
linked when the test starts. Where a torch lacks one of these functions, what it would find is
linked whole, as before.

A process the test starts (``subprocess``, ``multiprocessing``) has no such wrapper: it finds what
the test has asked for so far, and compiles the rest, unless the test makes its folder whole first
(:func:`link_whole`, ``warm_cache.link_whole_bundle()``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
from typing import Any, Callable, Iterator

from .. import files
from . import patches

#: The folder under a cache folder each wrapped cache keeps its entries in, by the patched attribute.
_FOLDERS = {"FxGraphCache._get_tmp_dir_for_key": "fxgraph", "AOTAutogradCache._get_tmp_dir_for_key": "aotautograd"}
#: Sources torch writes itself, when absent, before it builds or loads what they make (``codecache.write``);
#: they lie in the two-character folders of a cache folder, beside their binaries.
_WRITTEN_BY_TORCH = (".cpp",)
#: Built C++ binaries: torch looks for one only beside the source it has just written through ``get_path``.
#: The two-character folders hold other files too (autotune results beside a Triton kernel's source),
#: which torch finds by other paths: those are linked when a test starts.
_BUILT = (".so", ".o")

_lock = threading.RLock()


@dataclasses.dataclass
class _Placing:
    template: str
    folder: str
    placed: set[str] = dataclasses.field(default_factory=set)
    whole: bool = False


_active: _Placing | None = None


def wrap_fx_folder(original: Callable[..., Any]) -> Callable[..., Any]:
    """``FxGraphCache._get_tmp_dir_for_key``, placing the key's entries first (see :mod:`.patches`)."""
    return _placing(original)


def wrap_aot_folder(original: Callable[..., Any]) -> Callable[..., Any]:
    """``AOTAutogradCache._get_tmp_dir_for_key``, placing the key's entries first (see :mod:`.patches`)."""
    return _placing(original)


def wrap_get_path(original: Callable[..., Any]) -> Callable[..., Any]:
    """``codecache.get_path``, placing the binaries of the folder it names first (see :mod:`.patches`)."""

    @functools.wraps(original)
    def get_path(*args: Any, **kwargs: Any) -> Any:
        found = original(*args, **kwargs)
        subdir = found[1] if isinstance(found, tuple) and len(found) == 3 else None
        if isinstance(subdir, str) and len(os.path.basename(subdir)) == 2:
            _place(subdir, without=_WRITTEN_BY_TORCH)
        return found

    return get_path


def on_demand() -> frozenset[str]:
    """The top-level folders of a cache folder whose entries are placed when torch asks for them."""
    return frozenset(folder for attribute, folder in _FOLDERS.items() if patches.took(attribute))


def _binaries_on_demand() -> bool:
    return patches.took("get_path")


def _placing(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_tmp_dir_for_key(cls: Any, *args: Any, **kwargs: Any) -> Any:
        path = original(cls, *args, **kwargs)
        _place(str(path))
        return path

    return get_tmp_dir_for_key


def _place(path: str, without: tuple[str, ...] = ()) -> None:
    with _lock:
        active = _active
        if active is None or active.whole:
            return
        relative = os.path.relpath(os.path.realpath(path), active.folder)
        if relative.startswith(os.pardir) or os.path.isabs(relative) or relative in active.placed:
            return  # placed already, or a folder torch was pointed at inside the test, not this cache's
        source = os.path.join(active.template, relative)
        try:
            if os.path.isdir(source):
                files.link_tree(source, path, without=without)
        except OSError:
            return  # not placed (a full disk, say): torch misses, and the next ask tries again
        active.placed.add(relative)


def link_whole() -> None:
    """Make the active folder whole, for a process the test starts: it cannot ask this one for entries."""
    with _lock:
        active = _active
        if active is None or active.whole:
            return
        for folder in on_demand():
            if os.path.isdir(os.path.join(active.template, folder)):
                files.link_tree(os.path.join(active.template, folder), os.path.join(active.folder, folder))
        if _binaries_on_demand():
            _link_two_character(active.template, active.folder)
        active.whole = True


def _two_character(template: str | os.PathLike[str]) -> set[str]:
    return {entry.name for entry in os.scandir(template) if len(entry.name) == 2 and entry.is_dir()}


def _link_two_character(template: str | os.PathLike[str], folder: str | os.PathLike[str], built: bool = True) -> None:
    """Link the template's two-character folders into ``folder``, but for C++ sources (and, unless
    ``built``, binaries); a folder with nothing to link is not made."""
    without = _WRITTEN_BY_TORCH if built else _WRITTEN_BY_TORCH + _BUILT
    names = _holding_more(template, without) if built else _holding_more_than_binaries(os.fspath(template))
    for name in names:
        files.link_tree(os.path.join(template, name), os.path.join(folder, name), without=without)


def _holding_more(template: str | os.PathLike[str], without: tuple[str, ...]) -> list[str]:
    """The template's two-character folders that hold a file not ending with ``without`` (or a folder)."""
    found = []
    for name in _two_character(template):
        with os.scandir(os.path.join(template, name)) as entries:
            if any(entry.is_dir() or not entry.name.endswith(without) for entry in entries):
                found.append(name)
    return found


#: Per template: its state (inode, modification time, links) and its two-character folders that hold
#: more than C++ sources and binaries. After a template is loaded, only the pool adds to those folders,
#: and only binaries and their sources, so the list stands until the template is made again.
_more_than_binaries: dict[str, tuple[tuple[int, int, int], list[str]]] = {}


def _holding_more_than_binaries(template: str) -> list[str]:
    stat = os.stat(template)
    state = (stat.st_ino, stat.st_mtime_ns, stat.st_nlink)  # a folder added within a clock tick still counts
    with _lock:
        known = _more_than_binaries.get(template)
    if known is not None and known[0] == state:
        return known[1]
    found = _holding_more(template, _WRITTEN_BY_TORCH + _BUILT)
    with _lock:
        _more_than_binaries[template] = (state, found)
    return found


def fill_warm_folder(template: str | os.PathLike[str], folder: str | os.PathLike[str]) -> None:
    """Link into ``folder`` what a warm test needs before its first compile: all of ``template`` but
    the entries and binaries :func:`placing_from` places on demand and the C++ sources torch writes itself."""
    files.link_tree(template, folder, leave_out=on_demand() | _two_character(template))
    _link_two_character(template, folder, built=not _binaries_on_demand())


def complete_warm_folder(template: str | os.PathLike[str], folder: str | os.PathLike[str]) -> None:
    """Link into ``folder`` whatever of ``template`` it lacks (a failed test's folder, kept to be looked at)."""
    files.link_tree(template, folder)


@contextlib.contextmanager
def placing_from(template: str, folder: str) -> Iterator[None]:
    """While active, entries under :func:`on_demand` folders are linked from ``template`` into
    ``folder`` (the current cache folder) as torch asks for their keys."""
    global _active
    with _lock:
        before, _active = _active, _Placing(os.path.realpath(template), os.path.realpath(folder))
    try:
        yield
    finally:
        with _lock:
            _active = before
