"""Autotune results looked up in the current cache folder, where Mega-Cache put them, not in the folder a
kernel loaded from the FX graph cache was first compiled in (a path torch bakes into the entry); and
coordinate descent's mark kept on a reloaded config (torch 2.11 drops it, so the kernel is tuned again)."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Any, Callable

from ..caught import caught


def _current(filename: str) -> str:
    """``filename`` moved into the current cache folder (keeping its ``<xx>/<name>`` tail) unless it lies there."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    if not os.path.isabs(filename):
        return filename
    folder = os.path.dirname(filename)
    root = os.path.abspath(cache_dir())
    with contextlib.suppress(ValueError):  # another drive
        if os.path.commonpath([folder, root]) == root:
            return filename
    return os.path.join(root, os.path.basename(folder), os.path.basename(filename))


def wrap_create(create: Callable[..., Any]) -> Callable[..., Any]:
    """``AutotuneCache.create``, its file named in the current cache folder (see :func:`_current`)."""

    @functools.wraps(create)
    def create_here(inductor_meta: Any, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], str) and args[0]:
            args = (_current(args[0]), *args[1:])
        elif isinstance(kwargs.get("filename"), str) and kwargs["filename"]:
            kwargs["filename"] = _current(kwargs["filename"])
        return create(inductor_meta, *args, **kwargs)

    return create_here


def wrap_read(read: Callable[..., Any]) -> Callable[..., Any]:
    """``AutotuneCache._read``, counting a result found in the local folder where the bundle put it."""
    from . import keys

    @functools.wraps(read)
    def reading(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = read(self, *args, **kwargs)
        local = getattr(self, "local_cache", None)
        path = local[1] if isinstance(local, tuple) and len(local) == 2 else None
        if found is not None and isinstance(path, str) and os.path.isfile(path):
            keys.autotune_from_bundle(path)
        return found

    return reading


_last_found = threading.local()


def wrap_check(check: Callable[..., Any]) -> Callable[..., Any]:
    """``check_autotune_cache``, remembering the config the cache named during a recheck."""

    @functools.wraps(check)
    def remembering(*args: Any, **kwargs: Any) -> Any:
        found = check(*args, **kwargs)
        if getattr(_last_found, "waiting", False):  # the first check of a recheck; a nested one is not it
            named = found[0] if isinstance(found, tuple) and found else None
            _last_found.config = named[0] if isinstance(named, list) and len(named) == 1 else None
            _last_found.waiting = False
        return found

    return remembering


def wrap_recheck(recheck: Callable[..., Any]) -> Callable[..., Any]:
    """``CachingAutotuner.recheck_autotune_cache``, marking the kept config as coordinate descent's
    where the cache named it so (torch 2.11 drops the mark; 2.13 keeps it). Not covered: on 2.11, a kernel
    of one config whose coordinate-descent result is another (2.11 rechecks only kernels of several)."""
    from torch._inductor.runtime.runtime_utils import triton_config_to_hashable

    @functools.wraps(recheck)
    def rechecking(self: Any, *args: Any, **kwargs: Any) -> Any:
        _last_found.config, _last_found.waiting = None, True
        try:
            return recheck(self, *args, **kwargs)
        finally:
            named = getattr(_last_found, "config", None)
            _last_found.config, _last_found.waiting = None, False
            results = getattr(self, "compile_results", None) or []
            config: Any = getattr(results[0], "config", None) if len(results) == 1 else None
            unmarked = config is not None and not getattr(config, "found_by_coordesc", False)
            if unmarked and getattr(named, "found_by_coordesc", False):
                try:
                    if triton_config_to_hashable(config) == triton_config_to_hashable(named):
                        config.found_by_coordesc = True
                except Exception as exc:  # a config torch cannot hash: left as torch left it
                    caught("comparing an autotune config with the one coordinate descent found", exc)

    return rechecking
