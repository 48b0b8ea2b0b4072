"""What decides whether cached artifacts can hit here, read without initialising CUDA."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import platform
import sys
from typing import Any

from .core import torch_module
from .devices import gpu_names
from .isolation import bootstrap


def _portable(config: Any) -> dict[str, Any]:
    save = getattr(config, "save_config_portable", None)
    if save is None:
        return dict(config.get_config_copy())
    for kwargs in ({"ignore_private_configs": False, "readonly_values": True}, {"ignore_private_configs": False}, {}):
        try:
            return dict(save(**kwargs))
        except TypeError:
            continue
    return dict(save())


def _config_hash() -> str:
    """A hash of the config values torch hashes into FX graph and AOTAutograd keys, serialised as torch does."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    parts = []
    modules = [inductor_config]
    with contextlib.suppress(ImportError):
        modules.append(importlib.import_module("torch._inductor.config_comms"))
    for config in modules:
        for key, value in sorted(_portable(config).items()):
            text = repr(value)
            if " at 0x" not in text:
                parts.append(f"{config.__name__}.{key}={text}")
    digest = hashlib.sha256("\n".join(parts).encode())
    save = getattr(functorch_config, "save_config", None)
    if save is not None:
        digest.update(save())
    return digest.hexdigest()[:16]


def _triton_version() -> str:
    from importlib import metadata

    for dist in ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "none"


def environment_fingerprint() -> dict[str, str]:
    """What torch's FX graph, AOTAutograd and autotune keys depend on outside the graph itself (``torch_build``:
    torch's ``torch_key()``; ``num_threads`` and ``default_dtype``, which only torch >= 2.13 keys, kept so code
    for other settings is never reused); never initialises CUDA, so forked children can still use it."""
    bootstrap()
    torch = torch_module()
    torch_key = getattr(importlib.import_module("torch._inductor.codecache"), "torch_key", None)
    build = torch_key().hex()[:16] if torch_key is not None else str(getattr(torch.version, "git_version", ""))
    names = gpu_names()
    return {
        "torch": str(torch.__version__),
        "torch_build": build,
        "triton": _triton_version() if names else "none",
        "device": names[0] if names else "cpu",
        "cuda": str(torch.version.cuda or "none"),
        "python": "%d.%d" % sys.version_info[:2],
        "platform": f"{sys.platform}-{platform.machine()}",
        "cache_key_tag": str(getattr(getattr(torch.compiler, "config", None), "cache_key_tag", "")),
        "config_hash": _config_hash(),
        "default_dtype": str(torch.get_default_dtype()),
        "num_threads": str(torch.get_num_threads()),
    }


def made_with() -> dict[str, str]:
    """The torch version and device (the first GPU's name, or ``cpu``) compile expectations are recorded with."""
    torch = torch_module()
    names = gpu_names()
    return {"torch": str(torch.__version__), "device": names[0] if names else "cpu"}
