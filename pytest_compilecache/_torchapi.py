"""Every touch of torch's private compile-cache API, feature-detected, in one place.

A torch upgrade that moves a private name should change this module and nothing else.
Everything here imports torch lazily; importing this module itself is cheap.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections import Counter
from types import ModuleType
from typing import Any, Callable

from .environment import SavedEnv

MIN_TORCH = "2.7"


class TorchUnavailable(RuntimeError):
    """torch is missing or lacks the compile-cache API this plugin needs."""


def torch_module() -> ModuleType:
    """Import torch, or raise :class:`TorchUnavailable` naming the version found and the one needed."""
    try:
        import torch
    except ImportError as exc:
        raise TorchUnavailable(
            f"pytest-compilecache needs torch >= {MIN_TORCH}, but torch cannot be imported ({exc})"
        ) from None
    compiler = getattr(torch, "compiler", None)
    if not hasattr(compiler, "save_cache_artifacts") or not hasattr(compiler, "load_cache_artifacts"):
        raise TorchUnavailable(
            f"pytest-compilecache needs torch >= {MIN_TORCH} (for torch.compiler.save_cache_artifacts), "
            f"but found torch {getattr(torch, '__version__', 'of unknown version')}"
        )
    return torch


# --- the default cache directory -------------------------------------------------------------
# torch computes a few paths from default_cache_dir() ("/tmp/torchinductor_<user>") rather than from
# TORCHINDUCTOR_CACHE_DIR: the directory itself when the variable is unset, precompiled C++ headers,
# and a few on-disk helper caches. One wrapper, installed once, sends them to our directory while
# ``_default_dir_target`` is set and behaves exactly like torch's own function otherwise.

_default_dir_target: str | None = None
_original_default_dir: Callable[[], str] | None = None


def _redirected_default_cache_dir() -> str:
    if _default_dir_target is not None:
        return _default_dir_target
    assert _original_default_dir is not None
    return _original_default_dir()


def _install_default_dir_hook() -> None:
    global _original_default_dir
    if _original_default_dir is None:
        for name in ("torch._inductor.runtime.cache_dir_utils", "torch._inductor.runtime.runtime_utils"):
            try:
                _original_default_dir = importlib.import_module(name).default_cache_dir
                break
            except (ImportError, AttributeError):
                continue
        else:
            return
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if name.startswith("torch") and getattr(module, "default_cache_dir", None) is _original_default_dir:
            module.default_cache_dir = _redirected_default_cache_dir  # type: ignore[attr-defined]


_bootstrapped = False


def bootstrap(process_dir: str | None = None) -> None:
    """Import torch's compiler stack once per process without creating the shared default directory.

    ``process_dir`` takes the place of ``/tmp/torchinductor_<user>`` while torch is imported and
    while an isolation is active (see :func:`redirect_default_dir`); without one, a temporary
    folder removed at exit does.
    """
    global _bootstrapped, _default_dir_target
    if _bootstrapped:
        return
    torch_module()
    if process_dir is None:
        import atexit
        import shutil
        import tempfile

        process_dir = tempfile.mkdtemp(prefix="pytest-compilecache-")
        atexit.register(shutil.rmtree, process_dir, True)
    saved = SavedEnv()
    _default_dir_target = process_dir
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", process_dir)
    try:
        for name in ("torch._dynamo", "torch._inductor.codecache", "torch._inductor.utils"):
            importlib.import_module(name)
        _install_default_dir_hook()
        _install_pgo_counter()
    finally:
        _default_dir_target = None
        saved.restore()
    _bootstrapped = True


class redirect_default_dir:
    """Context manager: send torch's default-directory paths to ``path``, precompiled headers to ``headers``.

    Precompiled C++ headers are keyed by their content and written under a lock, so one folder can
    serve every test and process; they are not a compile cache a test asserts on.
    """

    def __init__(self, path: str, headers: str) -> None:
        self._path = path
        self._headers = headers
        self._saved: tuple[str | None, Any, Any] = (None, None, None)

    def __enter__(self) -> None:
        global _default_dir_target
        codecache = sys.modules.get("torch._inductor.codecache")
        headers = self._headers
        self._saved = (
            _default_dir_target,
            getattr(codecache, "_HEADER_DIR", None),
            getattr(codecache, "_HEADER_LOCK_DIR", None),
        )
        _default_dir_target = self._path
        if codecache is not None and hasattr(codecache, "_HEADER_DIR"):
            setattr(codecache, "_HEADER_DIR", headers)
            setattr(codecache, "_HEADER_LOCK_DIR", os.path.join(headers, "locks"))

    def __exit__(self, *exc: object) -> None:
        global _default_dir_target
        codecache = sys.modules.get("torch._inductor.codecache")
        _default_dir_target, header_dir, lock_dir = self._saved
        if codecache is not None and header_dir is not None:
            setattr(codecache, "_HEADER_DIR", header_dir)
            setattr(codecache, "_HEADER_LOCK_DIR", lock_dir)


# --- in-memory caches ------------------------------------------------------------------------


def reset_in_memory() -> None:
    """Forget every compile result held in memory, so the next compile consults the disk caches.

    Clears Inductor's registered in-memory caches (loaded C++ and Python modules, Triton futures,
    path memos) and resets Dynamo (its code cache, guards and PGO state). Files are left alone.
    """
    import torch._dynamo
    import torch._inductor.utils as inductor_utils

    clear = getattr(inductor_utils, "clear_caches", None) or getattr(inductor_utils, "clear_inductor_caches")
    clear()
    torch._dynamo.reset()


# --- counters --------------------------------------------------------------------------------

_pgo_counts: Counter[str] = Counter()


def _install_pgo_counter() -> None:
    pgo = sys.modules.get("torch._dynamo.pgo") or importlib.import_module("torch._dynamo.pgo")
    get_local = getattr(pgo, "get_local_code_state", None)
    put_local = getattr(pgo, "put_local_code_state", None)
    code_state_path = getattr(pgo, "code_state_path", None)
    if get_local is None or code_state_path is None or getattr(get_local, "_compilecache", False):
        return

    def counted_get(cache_key: str) -> Any:
        result = get_local(cache_key)
        if code_state_path(cache_key) is not None:
            _pgo_counts["hits" if result is not None else "misses"] += 1
        return result

    counted_get._compilecache = True  # type: ignore[attr-defined]
    setattr(pgo, "get_local_code_state", counted_get)
    if put_local is not None:

        def counted_put(*args: Any, **kwargs: Any) -> Any:
            _pgo_counts["saved"] += 1
            return put_local(*args, **kwargs)

        setattr(pgo, "put_local_code_state", counted_put)


def _group(counters: Any, name: str) -> Any:
    return counters[name] if name in counters else {}


def _cache_stats() -> dict[str, Any]:
    remote_cache = sys.modules.get("torch._inductor.remote_cache")
    stats = getattr(remote_cache, "cache_stats", None)
    return dict(getattr(stats, "_stats", {}) or {})


def _sum_stats(stats: dict[str, Any], suffix: str, field: str) -> int:
    return sum(
        int(getattr(stat, field, 0))
        for name, stat in stats.items()
        if name.endswith(suffix) and not name.startswith("backend:")
    )


def read_counts() -> dict[str, int]:
    """Torch's process-global cache counters as flat ``"layer.kind"`` counts.

    Take two readings and subtract: torch never resets these, and an FX hit replays codegen counters,
    so only the keys read here are trusted.
    """
    from torch._dynamo.utils import counters

    inductor = _group(counters, "inductor")
    aot = _group(counters, "aot_autograd")
    dynamo_cache = _group(counters, "dynamo_cache")
    stats = _cache_stats()
    return {
        "fx_graph.hits": inductor.get("fxgraph_cache_hit", 0),
        "fx_graph.misses": inductor.get("fxgraph_cache_miss", 0),
        "fx_graph.bypasses": inductor.get("fxgraph_cache_bypass", 0),
        "fx_graph.from_bundle": inductor.get("fxgraph_lookup_write_file", 0),
        "fx_graph.saved": _sum_stats(stats, "FxGraphCache", "put"),
        "aot_autograd.hits": aot.get("autograd_cache_hit", 0),
        "aot_autograd.misses": aot.get("autograd_cache_miss", 0),
        "aot_autograd.bypasses": aot.get("autograd_cache_bypass", 0),
        "aot_autograd.saved": aot.get("autograd_cache_saved", 0),
        "autotune.hits": _sum_stats(stats, "AutotuneCache", "hit"),
        "autotune.misses": _sum_stats(stats, "AutotuneCache", "miss"),
        "autotune.saved": _sum_stats(stats, "AutotuneCache", "put"),
        "triton.hits": inductor.get("triton_bundler_read_and_emit_kernel", 0),
        "triton.from_bundle": inductor.get("triton_bundler_read_and_emit_kernel", 0),
        "triton.misses": inductor.get("triton_bundler_save_kernel", 0),
        "triton.saved": inductor.get("triton_bundler_save_kernel", 0),
        "pgo.hits": _pgo_counts["hits"],
        "pgo.misses": _pgo_counts["misses"],
        "pgo.saved": _pgo_counts["saved"],
        "precompile.hits": dynamo_cache.get("dynamo_cache_hit", 0),
        "precompile.misses": dynamo_cache.get("dynamo_cache_miss", 0),
        "precompile.bypasses": dynamo_cache.get("dynamo_cache_error", 0),
    }


def compile_seconds() -> float:
    """Seconds torch.compile has spent compiling frames (forward and backward) in this process."""
    utils = sys.modules.get("torch._dynamo.utils")
    spent = getattr(utils, "cumulative_time_spent_ns", None)
    if not spent:
        return 0.0
    return float(spent.get("entire_frame_compile", 0) + spent.get("entire_backward_compile", 0)) / 1e9


_unobservable: dict[str, str] | None = None


def has_gpu() -> bool:
    """Whether torch sees a CUDA (or XPU) device."""
    torch = torch_module()
    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def unobservable_layers() -> dict[str, str]:
    """``{layer: reason}`` for each layer this torch build or machine cannot observe."""
    global _unobservable
    if _unobservable is None:
        found: dict[str, str] = {}
        gpu = has_gpu()
        remote_cache = importlib.import_module("torch._inductor.remote_cache")
        if not hasattr(remote_cache, "cache_stats"):
            found["autotune"] = "this torch keeps no autotune cache statistics"
        elif not gpu:
            found["autotune"] = "Triton autotuning runs only on a GPU, and none is available"
        if not gpu:
            found["triton"] = "Triton kernels are compiled only for a GPU, and none is available"
        pgo = importlib.import_module("torch._dynamo.pgo")
        if not getattr(getattr(pgo, "get_local_code_state", None), "_compilecache", False):
            found["pgo"] = "this torch's PGO module has no local code-state lookup to count"
        dynamo_config = importlib.import_module("torch._dynamo.config")
        if not hasattr(dynamo_config, "caching_precompile"):
            found["precompile"] = "this torch has no precompile cache"
        _unobservable = found
    return dict(_unobservable)


def caches_disabled_by_config() -> list[str]:
    """One line per torch config value that switches a cache layer off right now."""
    torch = torch_module()
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    found = []
    compiler_config = getattr(torch.compiler, "config", None)
    if getattr(compiler_config, "force_disable_caches", False) or getattr(
        inductor_config, "force_disable_caches", False
    ):
        found.append("force_disable_caches is on: every compile cache is disabled")
    if not getattr(inductor_config, "fx_graph_cache", True):
        found.append("torch._inductor.config.fx_graph_cache is off: the FX graph cache is disabled")
    if not getattr(functorch_config, "enable_autograd_cache", True):
        found.append("torch._functorch.config.enable_autograd_cache is off: the AOTAutograd cache is disabled")
    return found


# --- bypass reasons --------------------------------------------------------------------------
# torch gives bypass reasons only to its loggers, at INFO level.

_BYPASS_LOGGERS = {
    "torch._inductor.codecache": ("fx_graph", "Bypassing FX Graph Cache because"),
    "torch._functorch._aot_autograd.autograd_cache": ("aot_autograd", "Bypassing autograd cache"),
}


class _BypassFilter(logging.Filter):
    def __init__(self, layer: str, prefix: str, passes: int, sink: dict[str, list[str]]) -> None:
        super().__init__()
        self.layer, self.prefix, self.passes, self.sink = layer, prefix, passes, sink

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(self.prefix) and record.args:
            arg = record.args[0] if isinstance(record.args, tuple) else record.args
            self.sink.setdefault(self.layer, []).append(str(arg))
        return record.levelno >= self.passes


class record_bypass_reasons:
    """Context manager collecting ``{layer: [reason, ...]}`` from torch's bypass log messages.

    Records below the loggers' own level are captured and then dropped, so nothing new is printed.
    """

    def __init__(self) -> None:
        self.reasons: dict[str, list[str]] = {}
        self._installed: list[tuple[logging.Logger, _BypassFilter, int]] = []

    def __enter__(self) -> "record_bypass_reasons":
        for name, (layer, prefix) in _BYPASS_LOGGERS.items():
            logger = logging.getLogger(name)
            level = logger.level
            filt = _BypassFilter(layer, prefix, logger.getEffectiveLevel(), self.reasons)
            logger.addFilter(filt)
            if not logger.isEnabledFor(logging.INFO):
                logger.setLevel(logging.INFO)
            self._installed.append((logger, filt, level))
        return self

    def __exit__(self, *exc: object) -> None:
        for logger, filt, level in self._installed:
            logger.removeFilter(filt)
            if logger.level != level:
                logger.setLevel(level)
        self._installed.clear()

    def snapshot(self) -> dict[str, tuple[str, ...]]:
        """The reasons recorded so far, one tuple per layer."""
        return {layer: tuple(dict.fromkeys(r)) for layer, r in self.reasons.items()}



# --- Mega-Cache ------------------------------------------------------------------------------


def _config_hash() -> str:
    import hashlib

    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    parts = []
    for config in (inductor_config, functorch_config):
        save = getattr(config, "save_config_portable", None) or getattr(config, "get_config_copy")
        for key, value in sorted(save().items()):
            text = repr(value)
            if " at 0x" not in text:
                parts.append(f"{config.__name__}.{key}={text}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _triton_version() -> str:
    from importlib import metadata

    for dist in ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "none"


def environment_fingerprint() -> dict[str, str]:
    """Everything outside a graph that decides whether cached artifacts can hit on this machine."""
    import platform

    torch = torch_module()
    codecache = importlib.import_module("torch._inductor.codecache")
    torch_key = getattr(codecache, "torch_key", None)
    build = torch_key().hex()[:16] if torch_key is not None else str(getattr(torch.version, "git_version", ""))
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
    elif has_gpu():
        device = "xpu"
    else:
        device = "cpu"
    compiler_config = getattr(torch.compiler, "config", None)
    return {
        "torch": str(torch.__version__),
        "torch_build": build,
        "triton": _triton_version(),
        "device": device,
        "cuda": str(torch.version.cuda or "none"),
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "cache_key_tag": str(getattr(compiler_config, "cache_key_tag", "")),
        "config_hash": _config_hash(),
        "default_dtype": str(torch.get_default_dtype()),
        "num_threads": str(torch.get_num_threads()),
    }


class MegaCacheError(RuntimeError):
    """torch could not read, load or write Mega-Cache bytes."""


def _manager() -> Any:
    bootstrap()
    from torch.compiler._cache import CacheArtifactManager

    return CacheArtifactManager


def fresh_recording() -> Any:
    """Context manager: artifacts recorded inside go to a collection of their own (torch >= 2.8).

    On an older torch this is a no-op and the process's one collection is used.
    """
    import contextlib

    fresh = getattr(_manager(), "with_fresh_cache", None)
    return fresh() if fresh is not None else contextlib.nullcontext()


def save_artifacts() -> bytes | None:
    """``torch.compiler.save_cache_artifacts()`` as bytes, or ``None`` when nothing was recorded."""
    torch = torch_module()
    result = torch.compiler.save_cache_artifacts()
    if result is None:
        return None
    data = result[0]
    return data if describe_artifacts(data) else None


def _deserialize(data: bytes) -> dict[str, list[Any]]:
    manager = _manager()
    getattr(manager, "_ensure_cache_artifacts_registered", lambda: None)()
    logger = logging.getLogger("torch.compiler._cache")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        artifacts = manager.deserialize(data)
    finally:
        logger.setLevel(level)
    if artifacts is None:
        raise MegaCacheError("torch could not deserialize the artifacts")
    return dict(artifacts)


def describe_artifacts(data: bytes) -> dict[str, dict[str, int]]:
    """``{artifact type: {"count": n, "bytes": n}}`` for Mega-Cache bytes."""
    return {
        kind: {"count": len(items), "bytes": sum(len(getattr(a, "content", b"")) for a in items)}
        for kind, items in _deserialize(data).items()
        if items
    }


def merge_artifacts(blobs: list[bytes]) -> bytes:
    """One Mega-Cache byte string holding the union of ``blobs``; a later artifact wins on a key clash."""
    bootstrap()
    try:
        from torch.compiler._cache import _serialize_single_cache
        from torch.utils._appending_byte_serializer import AppendingByteSerializer
    except ImportError:
        raise MegaCacheError("this torch has no Mega-Cache serializer to merge artifacts with (torch >= 2.8 has)") from None

    merged: dict[str, dict[str, Any]] = {}
    for blob in blobs:
        for kind, items in _deserialize(blob).items():
            bucket = merged.setdefault(kind, {})
            for artifact in items:
                bucket[artifact.key] = artifact
    serializer = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
    serializer.extend((kind, list(items.values())) for kind, items in merged.items() if items)
    return bytes(serializer.to_bytes())


def load_artifacts(data: bytes, into: str) -> dict[str, int]:
    """Write Mega-Cache bytes into the cache folder ``into``; ``{artifact type: count}`` loaded."""
    from .environment import point_cache_dirs_at

    torch = torch_module()
    saved = SavedEnv()
    point_cache_dirs_at(into)
    try:
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as exc:
        raise MegaCacheError(f"torch failed while loading the artifacts: {type(exc).__name__}: {exc}") from exc
    finally:
        saved.restore()
    if info is None:
        raise MegaCacheError("torch could not deserialize the artifacts (load_cache_artifacts returned None)")
    artifacts = getattr(info, "artifacts", {}) or {}
    return {kind: len(keys) for kind, keys in artifacts.items() if keys}
