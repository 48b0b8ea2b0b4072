"""Keep torch away from its shared default cache directory, from the moment its compiler is imported.

torch derives a few paths from ``default_cache_dir()`` (``/tmp/torchinductor_<user>``) rather than
from ``TORCHINDUCTOR_CACHE_DIR``: the cache directory itself while the variable is unset, and the
precompiled C++ headers, computed once when ``torch._inductor.codecache`` is imported. An import
hook, installed without importing torch, swaps ``default_cache_dir`` for a function that answers a
folder of the plugin's own, and points the header folder at a persistent one, whenever torch's
compiler stack is imported: in a conftest, during collection, in a test or in the plugin itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any, Callable, Sequence

_DEFAULT_DIR_MODULES = ("torch._inductor.runtime.cache_dir_utils", "torch._inductor.runtime.runtime_utils")
_CODECACHE = "torch._inductor.codecache"

_process_dir: Callable[[], str] | None = None
_headers_dir: str | None = None
_override: list[str] = []
_original: Callable[[], str] | None = None
#: torch modules already searched for a ``default_cache_dir`` bound by ``from ... import`` (a test
#: enters a cache thousands of modules after torch is imported; only new ones need a look).
_checked: dict[str, ModuleType] = {}
#: ``id()`` of every module looked at, torch's (held in ``_checked``, so their ids stay theirs) and
#: other packages' (which never bind it, and are not held): ``sys.modules`` is filtered by it first.
_seen: dict[str, int] = {}
#: ``sys.modules`` as the last search left it (its size, newest name and module): unchanged, only the
#: modules that were still being imported then need a look again. (A module put in place of another
#: under an older name, without an import, goes unseen until ``sys.modules`` changes.)
_searched: tuple[int, str | None, int] = (0, None, 0)
_initializing: set[str] = set()
#: ``codecache._HEADER_DIR`` and ``_HEADER_LOCK_DIR`` as torch set them, once replaced.
_headers_before: tuple[Any, Any] | None = None


def _redirected_default_cache_dir() -> str:
    if _override:
        return _override[-1]
    if _process_dir is not None:
        return _process_dir()
    assert _original is not None
    return _original()


def _patch_default_dir(module: ModuleType) -> None:
    global _original
    current = getattr(module, "default_cache_dir", None)
    if current is None or current is _redirected_default_cache_dir:
        return
    if _original is None:
        _original = current
    if current is _original:
        setattr(module, "default_cache_dir", _redirected_default_cache_dir)


def _patch_headers(module: ModuleType) -> None:
    global _headers_before
    if _headers_dir is not None and hasattr(module, "_HEADER_DIR"):
        if _headers_before is None:
            _headers_before = (getattr(module, "_HEADER_DIR"), getattr(module, "_HEADER_LOCK_DIR", None))
        setattr(module, "_HEADER_DIR", _headers_dir)
        setattr(module, "_HEADER_LOCK_DIR", os.path.join(_headers_dir, "locks"))


def _patch_loaded() -> None:
    for name in _DEFAULT_DIR_MODULES:
        if name in sys.modules:
            _patch_default_dir(sys.modules[name])
    if _original is not None:
        _search_modules(_original)
    if _CODECACHE in sys.modules:
        _patch_headers(sys.modules[_CODECACHE])


def _search_modules(original: Callable[[], str]) -> None:
    """Point every torch module's ``default_cache_dir`` bound to ``original`` at the redirection."""
    global _searched
    newest = next(reversed(sys.modules), None)
    now = (len(sys.modules), newest, id(sys.modules.get(newest)) if newest is not None else 0)
    if now != _searched:
        names = [name for name, module in list(sys.modules.items()) if _seen.get(name) != id(module)]
    else:
        names = list(_initializing)
    for name in names:
        module = sys.modules.get(name)
        if module is None or _checked.get(name) is module:
            _initializing.discard(name)
            continue
        if not name.startswith("torch"):
            _seen[name] = id(module)  # only torch's modules bind it
            continue
        if getattr(module, "default_cache_dir", None) is original:
            setattr(module, "default_cache_dir", _redirected_default_cache_dir)
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            _initializing.add(name)
        else:
            _checked[name] = module  # fully imported: its names are bound, checked for good
            _seen[name] = id(module)
            _initializing.discard(name)
    _searched = now


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of the few torch modules it patches after they run."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in _DEFAULT_DIR_MODULES:
            patch = _patch_default_dir
        elif fullname == _CODECACHE:
            patch = _patch_headers
        else:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


_finder: _Finder | None = None


def install(process_dir: Callable[[], str] | None, headers_dir: str | None) -> None:
    """Send torch's default-directory paths to ``process_dir()`` and its C++ headers to ``headers_dir``.

    Takes effect for modules imported later (through an import hook) and for those already loaded.
    With ``None``, torch's own answer stands except inside :class:`redirect`.
    """
    global _finder, _process_dir, _headers_dir
    _process_dir = process_dir
    _headers_dir = headers_dir
    if _finder is None:
        _finder = _Finder()
        sys.meta_path.insert(0, _finder)
    _patch_loaded()


def current() -> tuple[Callable[[], str] | None, str | None]:
    """The arguments :func:`install` was last given (for the register, to put them back)."""
    return _process_dir, _headers_dir


def uninstall() -> None:
    """Remove the import hook and put back what it replaced: torch's ``default_cache_dir`` in every
    module bound to the redirection, and the precompiled headers' folder."""
    global _finder, _process_dir, _headers_dir, _headers_before, _searched
    if _finder is not None and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None
    _process_dir = None
    _headers_dir = None
    if _original is not None:
        for name, module in list(sys.modules.items()):
            if name.startswith("torch") and getattr(module, "default_cache_dir", None) is _redirected_default_cache_dir:
                setattr(module, "default_cache_dir", _original)
    codecache = sys.modules.get(_CODECACHE)
    if codecache is not None and _headers_before is not None:
        setattr(codecache, "_HEADER_DIR", _headers_before[0])
        setattr(codecache, "_HEADER_LOCK_DIR", _headers_before[1])
    _headers_before = None
    _checked.clear()
    _seen.clear()
    _initializing.clear()
    _searched = (0, None, 0)


def installed() -> bool:
    """Whether the redirection is in force for this process."""
    return _finder is not None


class redirect:
    """Context manager: while active, torch's default directory is ``path``, whatever is installed."""

    def __init__(self, path: str) -> None:
        self._path = path

    def __enter__(self) -> None:
        _patch_loaded()
        _override.append(self._path)

    def __exit__(self, *exc: object) -> None:
        _override.pop()


class headers_at:
    """Context manager: precompiled C++ headers go to ``path`` while active (torch must be imported)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._saved: tuple[Any, Any] | None = None

    def __enter__(self) -> None:
        codecache = sys.modules.get(_CODECACHE)
        if codecache is not None and hasattr(codecache, "_HEADER_DIR"):
            self._saved = (getattr(codecache, "_HEADER_DIR"), getattr(codecache, "_HEADER_LOCK_DIR", None))
            setattr(codecache, "_HEADER_DIR", self._path)
            setattr(codecache, "_HEADER_LOCK_DIR", os.path.join(self._path, "locks"))

    def __exit__(self, *exc: object) -> None:
        codecache = sys.modules.get(_CODECACHE)
        if codecache is not None and self._saved is not None:
            setattr(codecache, "_HEADER_DIR", self._saved[0])
            setattr(codecache, "_HEADER_LOCK_DIR", self._saved[1])
