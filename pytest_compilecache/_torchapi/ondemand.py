"""A ``warm_cache`` test's FX graph and AOTAutograd entries, linked into its folder when torch first asks for their key.

A warm test's folder starts as hard links to the session's template, the bundle's files. Linking
every entry made each test pay for the whole bundle (a few hundred files for a suite of a few dozen
small graphs) to read the one or two it compiles. torch finds an entry's folder through
``FxGraphCache._get_tmp_dir_for_key`` and ``AOTAutogradCache._get_tmp_dir_for_key``, for its
lookups and its writes alike; wrapped, each links the template's entries for that key into the
test's folder before torch looks, so torch sees what a folder linked whole would show it. Where a
torch lacks one of the two, that cache's entries are linked whole, as before.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from typing import Any, Callable, Iterator

from .. import files

#: The folder under a cache folder each wrapped cache keeps its entries in.
_FOLDERS = {"torch._inductor.codecache": ("FxGraphCache", "fxgraph"),
            "torch._functorch._aot_autograd.autograd_cache": ("AOTAutogradCache", "aotautograd")}

_lock = threading.Lock()
_wrapped: set[str] = set()
#: ``(template, folder, keys already placed)`` while a warm test's cache is active.
_active: tuple[str, str, set[str]] | None = None


def install() -> None:
    """Wrap each cache's key-to-folder function (idempotent); a torch without one is left alone."""
    for module_name, (class_name, folder) in _FOLDERS.items():
        if folder in _wrapped:
            continue
        try:
            cache_class = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            continue
        original = cache_class.__dict__.get("_get_tmp_dir_for_key")
        if not isinstance(original, classmethod) or getattr(original.__func__, "_compilecache", False):
            continue
        setattr(cache_class, "_get_tmp_dir_for_key", classmethod(_placing(original.__func__)))
        _wrapped.add(folder)


def on_demand() -> frozenset[str]:
    """The top-level folders of a cache folder whose entries are placed when torch asks for them."""
    with _lock:
        return frozenset(_wrapped)


def _placing(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_tmp_dir_for_key(cls: Any, key: str) -> Any:
        path = original(cls, key)
        with contextlib.suppress(Exception):
            _place(str(path))
        return path

    get_tmp_dir_for_key._compilecache = True  # type: ignore[attr-defined]
    return get_tmp_dir_for_key


def _place(path: str) -> None:
    with _lock:
        active = _active
        if active is None:
            return
        template, folder, placed = active
        relative = os.path.relpath(os.path.realpath(path), folder)
        if relative.startswith(os.pardir) or os.path.isabs(relative) or relative in placed:
            return  # a folder torch was pointed at inside the test, not this cache's
        placed.add(relative)
    source = os.path.join(template, relative)
    if os.path.isdir(source):
        files.link_tree(source, path)  # what torch already wrote there is left alone


#: Sources torch writes itself, when absent, before it builds or loads what they make (``codecache.write``).
_WRITTEN_BY_TORCH = (".cpp",)


def fill(template: str | os.PathLike[str], folder: str | os.PathLike[str]) -> None:
    """Link into ``folder`` what a warm test needs before its first compile: all of ``template`` but
    the entries :func:`placing_from` places on demand and the C++ sources torch writes itself."""
    files.link_tree(template, folder, leave_out=on_demand(), without=_WRITTEN_BY_TORCH)


@contextlib.contextmanager
def placing_from(template: str, folder: str) -> Iterator[None]:
    """While active, entries under :func:`on_demand` folders are linked from ``template`` into
    ``folder`` (the current cache folder) as torch asks for their keys."""
    global _active
    with _lock:
        before, _active = _active, (os.path.realpath(template), os.path.realpath(folder), set())
    try:
        yield
    finally:
        with _lock:
            _active = before
