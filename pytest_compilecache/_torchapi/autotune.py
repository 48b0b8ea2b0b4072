"""Autotune results found where the cache is now, not where the kernel was first compiled.

torch keys a kernel's local autotune result by a file beside the kernel's source, and a kernel
loaded from the FX graph cache keeps the absolute path of the folder it was first compiled in
(seen on torch 2.11 with an H200: after a Mega-Cache reload, every lookup went to the folder of
the process that saved the bundle). Mega-Cache writes the results into the *current* cache folder,
under the same ``<xx>/<name>.best_config`` tail, so a lookup through the old path misses whenever
that folder is gone (another machine, a removed test folder) and reads or writes another test's
folder when it is not. :func:`wrap_create` maps such a path onto the current cache folder, keeping
the tail, which is exactly where Mega-Cache put the result.

It also keeps a kernel loaded from the FX graph cache from being tuned again. Such a kernel
(statically launchable) checks the autotune cache once more when it loads
(``CachingAutotuner.recheck_autotune_cache``). Where the result found by coordinate descent is one
of the kernel's own configs, torch 2.11 keeps that config but not the mark that coordinate descent
found it, so the kernel's first run tunes it again: a warm max-autotune test benchmarks and writes a
result (seen on an H200; it depends on whether coordinate descent moved from its starting config,
which is why it came and went). torch 2.13 sets the mark itself; :func:`wrap_recheck` sets it where the
loaded kernel's config is the one the cache named as found by coordinate descent, and does nothing
where torch already did. Not covered: on torch 2.11 a kernel compiled with a single config whose
coordinate-descent result is another config (torch 2.11 rechecks only kernels of several configs;
compiling the other config would take torch's private compile step).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Any, Callable


def _current(filename: str) -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    if not os.path.isabs(filename):
        return filename
    folder = os.path.dirname(filename)
    root = os.path.abspath(cache_dir())
    try:
        if os.path.commonpath([folder, root]) == root:
            return filename
    except ValueError:  # another drive
        pass
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
    where the cache named it so (torch 2.11 drops the mark; 2.13 keeps it)."""
    from torch._inductor.runtime.runtime_utils import triton_config_to_hashable

    @functools.wraps(recheck)
    def rechecking(self: Any, *args: Any, **kwargs: Any) -> Any:
        _last_found.config, _last_found.waiting = None, True
        try:
            return recheck(self, *args, **kwargs)
        finally:
            named = getattr(_last_found, "config", None)
            _last_found.config, _last_found.waiting = None, False
            _mark(self, named, triton_config_to_hashable)

    return rechecking


def _mark(autotuner: Any, named: Any, hashable: Callable[[Any], Any]) -> None:
    """Mark ``autotuner``'s one kept config as found by coordinate descent where the cache named it so."""
    if named is None or not getattr(named, "found_by_coordesc", False):
        return
    results = getattr(autotuner, "compile_results", None) or []
    if len(results) != 1:
        return
    config = getattr(results[0], "config", None)
    if config is None or getattr(config, "found_by_coordesc", False):
        return
    try:
        same = hashable(config) == hashable(named)
    except Exception:  # a config torch cannot hash: leave it as torch left it
        return
    if same:
        config.found_by_coordesc = True
