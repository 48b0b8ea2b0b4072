"""torch's cache and Dynamo counters read as flat counts, plus the few counts torch does not keep."""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import sys
import threading
from collections import Counter
from typing import Any, Callable

from . import dynamo, loglevels, patches
from .core import torch_module
from .fingerprint import gpu_names
from .isolation import REMOTE_SWITCHES

#: The counts torch does not keep, as the register's wrappers count them (``"layer.kind"``).
_own_counts: Counter[str] = Counter()
_lock = threading.Lock()
_unobservable: dict[str, str] | None = None


def count(name: str, n: int = 1) -> None:
    """Add ``n`` to one of the counts torch does not keep."""
    with _lock:
        _own_counts[name] += n


def wrap_pgo_lookup(get_local: Callable[..., Any]) -> Callable[..., Any]:
    """``pgo.get_local_code_state``, counting each lookup of a local code state as a hit or a miss."""
    code_state_path = importlib.import_module("torch._dynamo.pgo").code_state_path

    @functools.wraps(get_local)
    def counted_get(cache_key: str) -> Any:
        result = get_local(cache_key)
        if code_state_path(cache_key) is not None:
            count("pgo.hits" if result is not None else "pgo.misses")
        return result

    return counted_get


def wrap_pgo_save(put_local: Callable[..., Any]) -> Callable[..., Any]:
    """``pgo.put_local_code_state``, counting each save."""
    return _counting(put_local, "pgo.saved")


def wrap_fx_save(save: Callable[..., Any]) -> Callable[..., Any]:
    """``FxGraphCache._save_graph``, counting each save."""
    return _counting(save, "fx_graph.saved")


def _counting(original: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        count(name)
        return original(*args, **kwargs)

    return counted


def _sum_stats(stats: dict[str, Any], suffix: str, field: str, remote: bool = False) -> int:
    return sum(int(getattr(stat, field, 0)) for name, stat in stats.items()
               if name.endswith(suffix) and not name.startswith("backend:") and name.startswith("Remote") == remote)


def _remote_counts(stats: dict[str, Any]) -> dict[str, int]:
    """Lookups of torch's remote caches (``Remote*`` in ``cache_stats``): hit, miss, put, exception."""
    layers = (("remote_fx_graph", "FxGraphCache"), ("remote_aot_autograd", "AOTAutogradCache"),
              ("remote_autotune", "AutotuneCache"))
    fields = (("hits", "hit"), ("misses", "miss"), ("saved", "put"), ("bypasses", "exception"))
    return {f"{layer}.{kind}": _sum_stats(stats, suffix, field, remote=True)
            for layer, suffix in layers for kind, field in fields}


def read_counts() -> dict[str, int]:
    """Torch's process-global cache counters as flat ``"layer.kind"`` counts: take two readings and subtract
    (torch never resets them; an FX hit replays codegen counters, so only the keys read here are trusted)."""
    from torch._dynamo.utils import counters

    inductor = counters.get("inductor", Counter())
    aot = counters.get("aot_autograd", Counter())
    dynamo_cache = counters.get("dynamo_cache", Counter())
    cache_stats = getattr(sys.modules.get("torch._inductor.remote_cache"), "cache_stats", None)
    stats = dict(getattr(cache_stats, "_stats", {}) or {})
    fx_save_failed = inductor.get("fxgraph_cache_pickle_error", 0) + inductor.get("fxgraph_cache_write_error", 0)
    with _lock:
        own = Counter(_own_counts)
    return {
        **own,
        "fx_graph.hits": inductor.get("fxgraph_cache_hit", 0),
        "fx_graph.misses": inductor.get("fxgraph_cache_miss", 0),
        "fx_graph.bypasses": inductor.get("fxgraph_cache_bypass", 0),
        "fx_graph.from_bundle": inductor.get("fxgraph_lookup_write_file", 0),
        "fx_graph.saved": own["fx_graph.saved"] - fx_save_failed,
        "aot_autograd.hits": aot.get("autograd_cache_hit", 0),
        "aot_autograd.misses": aot.get("autograd_cache_miss", 0),
        "aot_autograd.bypasses": aot.get("autograd_cache_bypass", 0),
        "aot_autograd.saved": aot.get("autograd_cache_saved", 0),
        "autotune.hits": _sum_stats(stats, "AutotuneCache", "hit"),
        "autotune.misses": _sum_stats(stats, "AutotuneCache", "miss"),
        "autotune.saved": _sum_stats(stats, "AutotuneCache", "put"),
        "triton.hits": inductor.get("triton_bundler_read_and_emit_kernel", 0) + own["triton.hits"],
        "triton.from_bundle": inductor.get("triton_bundler_read_and_emit_kernel", 0) + own["triton.from_bundle"],
        "triton.misses": inductor.get("triton_bundler_save_kernel", 0),
        "triton.saved": inductor.get("triton_bundler_save_kernel", 0),
        **{name: own[name] for name in ("pgo.hits", "pgo.misses", "pgo.saved", "cpp.hits", "cpp.misses")},
        "cpp.from_bundle": own["cpp.from_bundle"],
        "cpp.saved": own["cpp.misses"],
        "precompile.hits": dynamo_cache.get("dynamo_cache_hit", 0),
        "precompile.misses": dynamo_cache.get("dynamo_cache_miss", 0),
        "precompile.bypasses": dynamo_cache.get("dynamo_cache_error", 0),
        **_remote_counts(stats),
        **dynamo.counts(),
    }


def unobservable_layers() -> dict[str, str]:
    """``{layer: reason}`` for each layer this torch build or machine cannot observe."""
    global _unobservable
    if _unobservable is None:
        found: dict[str, str] = {}
        torch_module()
        if not gpu_names():
            found["autotune"] = "Triton autotuning runs only on a GPU, and none is available"
            found["triton"] = "Triton kernels are compiled only for a GPU, and none is available"
        if not hasattr(importlib.import_module("torch._dynamo.config"), "caching_precompile"):
            found["precompile"] = f"torch {_version()} has no precompile cache"
        if not patches.took("get_local_code_state"):  # asked once a process, so every test agrees
            found["pgo"] = f"torch {_version()}'s PGO module has no local code-state lookup to count"
        if not patches.took("CppCodeCache.load_async"):
            found["cpp"] = f"torch {_version()} has no CppCodeCache.load_async to count C++ builds at"
        _unobservable = found
    remote_off = {layer: "torch's remote cache is off here (--compile-cache-remote turns it on; cold_cache and "
                         "warm_cache switch it off)" for layer, (module, name) in REMOTE_SWITCHES.items()
                  if not getattr(importlib.import_module(module), name, None)}  # asked each time: tests switch it
    return {**_unobservable, **remote_off}


def unobservable_fields() -> dict[str, str]:
    """``{"layer.field": reason}`` for single counts this torch cannot keep (e.g. FX saves, recompiles)."""
    fields = {}
    if not patches.took("FxGraphCache._save_graph"):
        fields["fx_graph.saved"] = f"torch {_version()} has no FxGraphCache._save_graph to count saves at"
    if not patches.took("get_and_maybe_log_recompilation_reasons"):
        fields["dynamo.recompiles"] = (f"torch {_version()}'s Dynamo has no recompilation-reason function to "
                                       "count recompiles at")
    return fields


def _version() -> str:
    return str(getattr(sys.modules.get("torch"), "__version__", "")) or "(unknown version)"


# --- bypass reasons: torch gives them only to its loggers, at INFO level ---------------------

_BYPASS_LOGGERS = {
    "torch._inductor.codecache": ("fx_graph", "Bypassing FX Graph Cache because"),
    "torch._functorch._aot_autograd.autograd_cache": ("aot_autograd", "Bypassing autograd cache"),
}


class record_bypass_reasons:
    """Context manager collecting ``{layer: [reason, ...]}`` from torch's bypass log messages (records below
    the loggers' own level are captured, then dropped, so nothing new is printed)."""

    def __init__(self) -> None:
        self.reasons: dict[str, list[str]] = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "record_bypass_reasons":
        for name, (layer, prefix) in _BYPASS_LOGGERS.items():
            logger = logging.getLogger(name)
            keep = functools.partial(self._keep, layer, prefix, logger.getEffectiveLevel())
            logger.addFilter(keep)
            self._stack.callback(logger.removeFilter, keep)
            self._stack.enter_context(loglevels.lowered(logger, logging.INFO))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _keep(self, layer: str, prefix: str, passes: int, record: logging.LogRecord) -> bool:
        """Record a bypass reason; whether the record passes on (it reached the logger's own level)."""
        if isinstance(record.msg, str) and record.msg.startswith(prefix) and record.args:
            arg = record.args[0] if isinstance(record.args, tuple) else record.args
            self.reasons.setdefault(layer, []).append(str(arg))
        return record.levelno >= passes

    def snapshot(self) -> dict[str, tuple[str, ...]]:
        """The reasons recorded so far, one tuple per layer."""
        return {layer: tuple(dict.fromkeys(r)) for layer, r in self.reasons.items()}
