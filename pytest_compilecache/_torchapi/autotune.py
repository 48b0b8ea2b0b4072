"""Autotune results found where the cache is now, not where the kernel was first compiled.

torch keys a kernel's local autotune result by a file beside the kernel's source, and a kernel
loaded from the FX graph cache keeps the absolute path of the folder it was first compiled in
(seen on torch 2.11 with an H200: after a Mega-Cache reload, every lookup went to the folder of
the process that saved the bundle). Mega-Cache writes the results into the *current* cache folder,
under the same ``<xx>/<name>.best_config`` tail, so a lookup through the old path misses whenever
that folder is gone (another machine, a removed test folder) and reads or writes another test's
folder when it is not. :func:`install` maps such a path onto the current cache folder, keeping
the tail, which is exactly where Mega-Cache put the result.
"""

from __future__ import annotations

import os
import sys
from typing import Any


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


def install() -> bool:
    """Patch ``AutotuneCache.create`` (idempotent); False where this torch has none."""
    try:
        from torch._inductor.runtime import autotune_cache
    except ImportError:
        return False
    cache_class = getattr(autotune_cache, "AutotuneCache", None)
    create = getattr(cache_class, "create", None)
    if create is None:
        return False
    if getattr(create, "_compilecache", False):
        return True

    def create_here(inductor_meta: Any, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], str) and args[0]:
            args = (_current(args[0]), *args[1:])
        elif isinstance(kwargs.get("filename"), str) and kwargs["filename"]:
            kwargs["filename"] = _current(kwargs["filename"])
        return create(inductor_meta, *args, **kwargs)

    create_here._compilecache = True  # type: ignore[attr-defined]
    setattr(cache_class, "create", staticmethod(create_here))
    return "torch._inductor.runtime.autotune_cache" in sys.modules
