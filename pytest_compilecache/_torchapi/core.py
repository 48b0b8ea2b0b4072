"""Importing torch, the error raised when it is missing or too old, and whether its compiler is loaded."""

from __future__ import annotations

import sys
from types import ModuleType

MIN_TORCH = "2.7"


class TorchUnavailable(RuntimeError):
    """torch is missing or lacks the compile-cache API this plugin needs."""


def torch_module() -> ModuleType:
    """Import torch, or raise :class:`TorchUnavailable` naming the version found and the one needed."""
    try:
        import torch
    except ImportError as exc:
        raise TorchUnavailable(f"pytest-compilecache needs torch >= {MIN_TORCH}, but torch cannot be imported "
                               f"({exc})") from None
    compiler = getattr(torch, "compiler", None)
    if not hasattr(compiler, "save_cache_artifacts") or not hasattr(compiler, "load_cache_artifacts"):
        version = getattr(torch, "__version__", "of unknown version")
        raise TorchUnavailable(f"pytest-compilecache needs torch >= {MIN_TORCH} (for "
                               f"torch.compiler.save_cache_artifacts), but found torch {version}")
    return torch


def compiler_loaded() -> bool:
    """Whether torch's compiler (Dynamo, with the cache counters) was imported in this process; imports nothing."""
    return "torch._dynamo.utils" in sys.modules


def inductor_config_loaded() -> bool:
    """Whether Inductor's config module was imported (settings made before that are read at its import)."""
    return "torch._inductor.config" in sys.modules
