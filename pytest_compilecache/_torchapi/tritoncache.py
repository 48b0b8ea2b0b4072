"""Triton kernels an FX cache hit finds already in Triton's own cache folder (carried or pooled), counted
here as hits (``from_bundle`` when a bundle carried them), file by file as torch counts its own: torch's
``TritonBundler.read_and_emit`` counts only the kernels it writes."""

from __future__ import annotations

import functools
import importlib
import os
import threading
from collections import Counter
from typing import Any, Callable

from ..caught import caught
from . import ondemand, patches

_counts: Counter[str] = Counter()
_carried_kernels: set[str] = set()
_lock = threading.Lock()


def wrap_read_and_emit(original: Callable[..., Any]) -> Callable[..., Any]:
    """``TritonBundler.read_and_emit``, counting the kernels already present as hits first."""
    module = importlib.import_module("torch._inductor.triton_bundler")
    bundler = getattr(module, "TritonBundler")
    cache_dir = getattr(module, "triton_cache_dir", None)
    if cache_dir is None:
        raise patches.NotApplicable("this torch's Triton bundler has no triton_cache_dir")

    @functools.wraps(original)
    def read_and_emit(bundle: Any, *args: Any, **kwargs: Any) -> Any:
        if bundler.is_enabled():
            _count_present(bundle, cache_dir)
        return original(bundle, *args, **kwargs)

    return read_and_emit


def wrap_cache_manager_init(original: Callable[..., Any]) -> Callable[..., Any]:
    """Triton's ``FileCacheManager.__init__``, placing a carried kernel's folder before Triton looks into it."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        folder = getattr(self, "cache_dir", None)
        if isinstance(folder, str) and folder:  # a dump or override folder lies outside the test's: never placed
            ondemand.place(folder)

    return __init__


def _count_present(bundle: Any, cache_dir: Any) -> None:
    for artifacts in getattr(bundle, "kernel_artifacts", ()):
        try:
            folder = os.path.join(cache_dir(artifacts.device), artifacts.kernel_hash)
            ondemand.place(folder)  # a carried kernel's folder, where its placing waits for this ask
            present = os.path.isdir(folder) and bool(os.listdir(folder))
        except (OSError, AttributeError, TypeError) as exc:  # this kernel's files are not counted
            caught("counting a Triton kernel's files torch found", exc)
            continue
        if present:
            files = len(getattr(artifacts, "artifacts", ()))
            with _lock:
                _counts["triton.hits"] += files
                if artifacts.kernel_hash in _carried_kernels:
                    _counts["triton.from_bundle"] += files


def mark_carried(kernel_hashes: set[str]) -> None:
    """Remember the Triton cache folders (kernel hashes) placed from a bundle, to count hits as ``from_bundle``."""
    with _lock:
        _carried_kernels.update(kernel_hashes)


def counts() -> dict[str, int]:
    """Hits on kernels found in Triton's cache folder, so far in this process."""
    with _lock:
        return {"triton.hits": _counts["triton.hits"], "triton.from_bundle": _counts["triton.from_bundle"]}
