"""Importing torch's compiler once without touching the shared directory, and resetting its in-memory state."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import shutil
import tempfile
from typing import Iterator

from ..environment import SavedEnv
from . import defaultdir, patches
from .core import torch_module

_bootstrapped = False


def bootstrap(process_dir: str | None = None) -> None:
    """Import torch's compiler stack once per process and install the register, creating nothing in the shared
    default directory: torch's folder is ``process_dir`` meanwhile (a temporary one removed at exit by default)."""
    global _bootstrapped
    if _bootstrapped and patches.installed():
        return
    torch_module()
    if process_dir is None:
        process_dir = tempfile.mkdtemp(prefix="pytest-compilecache-")
        atexit.register(shutil.rmtree, process_dir, True)
    saved = SavedEnv()
    try:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", process_dir)  # torch's imports may ask for a cache folder
        with defaultdir.redirect(process_dir), _fork_safe_cuda_check():
            for name in ("torch._dynamo", "torch._inductor.codecache", "torch._inductor.utils",
                         "torch._inductor.compile_fx"):
                importlib.import_module(name)
            patches.install()
    finally:
        saved.restore()
    _bootstrapped = True


def reset_in_memory() -> None:
    """Forget every compile result Inductor and Dynamo hold in memory, so the next compile reads the disk caches."""
    import torch._dynamo
    import torch._inductor.utils as inductor_utils

    clear = getattr(inductor_utils, "clear_caches", None) or getattr(inductor_utils, "clear_inductor_caches")
    clear()
    with _fork_safe_cuda_check():
        torch._dynamo.reset()


@contextlib.contextmanager
def _fork_safe_cuda_check() -> Iterator[None]:
    """``torch.cuda.is_available()`` through NVML while active (its default check leaves forked children no CUDA)."""
    saved = SavedEnv(("PYTORCH_NVML_BASED_CUDA_CHECK",))
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        yield
    finally:
        saved.restore()


@contextlib.contextmanager
def without_remote_caches() -> Iterator[None]:
    """Switch off torch's remote (Redis) FX graph, AOTAutograd and autotune caches while active (only values
    that are on are changed, so a session without remote caches keeps its cache keys)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with contextlib.ExitStack() as stack:
        for config, names in (
            (inductor_config, ("fx_graph_remote_cache", "autotune_remote_cache", "bundled_autotune_remote_cache")),
            (functorch_config, ("enable_remote_autograd_cache",)),
        ):
            on = {name: False for name in names if getattr(config, name, None)}
            if on:
                stack.enter_context(config.patch(on))
        yield


def remote_caches_on() -> None:
    """Switch torch's remote caches on, in a torch already imported (the environment is read only at import)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    for config, name in ((inductor_config, "fx_graph_remote_cache"), (inductor_config, "autotune_remote_cache"),
                         (functorch_config, "enable_remote_autograd_cache")):
        if hasattr(config, name):
            setattr(config, name, True)


def caches_disabled_by_config() -> list[str]:
    """One line per torch config value that switches a cache layer off right now."""
    torch = torch_module()
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    found = []
    forcing = (getattr(torch.compiler, "config", None), inductor_config)
    if any(getattr(config, "force_disable_caches", False) for config in forcing):
        found.append("force_disable_caches is on: every compile cache is disabled")
    if not getattr(inductor_config, "fx_graph_cache", True):
        found.append("torch._inductor.config.fx_graph_cache is off: the FX graph cache is disabled")
    if not getattr(functorch_config, "enable_autograd_cache", True):
        found.append("torch._functorch.config.enable_autograd_cache is off: the AOTAutograd cache is disabled")
    return found

