"""Keep torch off its shared default cache folder, ``/tmp/torchinductor_<user>``: ``default_cache_dir``
answers the folder a :class:`redirect` or the session (:func:`send_to`) names, and the precompiled
headers' folder is set around each header build (:func:`headers_in_force`)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from typing import Any, Callable, Iterator

_process_dir: Callable[[], str] | None = None
_headers_dir: str | None = None
_override: list[str] = []
_headers_override: list[str] = []
_headers_lock = threading.Lock()
#: Header builds in progress, and torch's header folders as they were before the first of them.
_building = 0
_headers_before: tuple[Any, Any] | None = None


def wrap_default_cache_dir(original: Callable[[], str]) -> Callable[[], str]:
    """``default_cache_dir``, answering the folder in force."""

    @functools.wraps(original)
    def default_cache_dir() -> str:
        if _override:
            return _override[-1]
        if _process_dir is not None:
            return _process_dir()
        return original()

    return default_cache_dir


def send_to(process_dir: Callable[[], str] | None,
            headers_dir: str | None) -> tuple[Callable[[], str] | None, str | None]:
    """From now on, torch's default folder is ``process_dir()`` and its headers go to ``headers_dir``
    (``None``: torch's own); returns what was in force, for the session's end to put back."""
    global _process_dir, _headers_dir
    before = (_process_dir, _headers_dir)
    _process_dir, _headers_dir = process_dir, headers_dir
    return before


@contextlib.contextmanager
def _pushed(stack: list[str], value: str) -> Iterator[None]:
    stack.append(value)
    try:
        yield
    finally:
        stack.pop()


def redirect(path: str) -> contextlib.AbstractContextManager[None]:
    """While active, torch's default folder is ``path``, whatever the session named."""
    return _pushed(_override, path)


def headers_at(path: str) -> contextlib.AbstractContextManager[None]:
    """While active, precompiled C++ headers go to ``path``, whatever the session named."""
    return _pushed(_headers_override, path)


@contextlib.contextmanager
def headers_in_force() -> Iterator[None]:
    """While active, torch's header folder (``codecache._HEADER_DIR``, computed at import) is the one in force,
    if one is; of the threads building headers at once, the first sets it and the last puts torch's back."""
    global _building, _headers_before
    path = _headers_override[-1] if _headers_override else _headers_dir
    codecache = sys.modules.get("torch._inductor.codecache")
    if path is None or codecache is None or not hasattr(codecache, "_HEADER_DIR"):
        yield
        return
    with _headers_lock:
        if _building == 0:
            _headers_before = (getattr(codecache, "_HEADER_DIR"), getattr(codecache, "_HEADER_LOCK_DIR", None))
            setattr(codecache, "_HEADER_DIR", path)
            setattr(codecache, "_HEADER_LOCK_DIR", os.path.join(path, "locks"))
        _building += 1
    try:
        yield
    finally:
        with _headers_lock:
            _building -= 1
            if _building == 0 and _headers_before is not None:
                setattr(codecache, "_HEADER_DIR", _headers_before[0])
                setattr(codecache, "_HEADER_LOCK_DIR", _headers_before[1])
