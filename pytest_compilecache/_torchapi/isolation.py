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


#: The config value (module, name) that switches each of torch's remote (Redis) cache layers on.
REMOTE_SWITCHES = {"remote_fx_graph": ("torch._inductor.config", "fx_graph_remote_cache"),
                   "remote_aot_autograd": ("torch._functorch.config", "enable_remote_autograd_cache"),
                   "remote_autotune": ("torch._inductor.config", "autotune_remote_cache")}


def remote_caches(on: bool) -> contextlib.ExitStack:
    """torch's remote caches switched ``on`` (or off) through each config's ``patch``, in a torch already imported
    (the environment is read only at import), until the stack returned is closed (a value that is so already is left
    alone, so a session without remote caches keeps its cache keys; the bundled autotune cache is only ever switched
    off)."""
    bundled = [] if on else [("torch._inductor.config", "bundled_autotune_remote_cache")]
    stack = contextlib.ExitStack()
    for module, name in [*REMOTE_SWITCHES.values(), *bundled]:
        config = importlib.import_module(module)
        if hasattr(config, name) and bool(getattr(config, name)) != on:
            stack.enter_context(config.patch({name: on}))
    return stack


def caches_disabled_by_config() -> list[str]:
    """One line per torch config value that switches a cache layer off right now."""
    torch = torch_module()
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    found = []
    forcing = (torch.compiler.config, inductor_config)
    if any(getattr(config, "force_disable_caches", False) for config in forcing):
        found.append("force_disable_caches is on: every compile cache is disabled")
    if not getattr(inductor_config, "fx_graph_cache", True):
        found.append("torch._inductor.config.fx_graph_cache is off: the FX graph cache is disabled")
    if not getattr(functorch_config, "enable_autograd_cache", True):
        found.append("torch._functorch.config.enable_autograd_cache is off: the AOTAutograd cache is disabled")
    return found

