"""What decides whether cached artifacts can hit here, read without initialising CUDA."""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import os
import platform
import sys
from typing import Any

from .core import torch_module
from .isolation import bootstrap

_NAME_LENGTH = 96


def _visible(count: int) -> list[int] | list[str]:
    """Indices (or UUIDs) of the devices torch will see, from ``CUDA_VISIBLE_DEVICES``."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(count))
    items = [s.strip() for s in spec.split(",") if s.strip()]
    out: list[Any] = []
    for item in items:
        if item.lstrip("-").isdigit():
            index = int(item)
            if index < 0 or index >= count:
                break
            out.append(index)
        else:
            out.append(item)
    return out


def nvml_device_names() -> list[str] | None:
    """Names of the CUDA devices torch would see, read through NVML (no CUDA context is made).

    ``None`` when NVML is not there (no NVIDIA driver).
    """
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if lib.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint()
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        names = []
        for device in _visible(count.value):
            handle = ctypes.c_void_p()
            if isinstance(device, int):
                status = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(device), ctypes.byref(handle))
            else:
                status = lib.nvmlDeviceGetHandleByUUID(device.encode(), ctypes.byref(handle))
            if status != 0:
                continue
            buffer = ctypes.create_string_buffer(_NAME_LENGTH)
            if lib.nvmlDeviceGetName(handle, buffer, ctypes.c_uint(_NAME_LENGTH)) == 0:
                names.append(buffer.value.decode(errors="replace"))
        return names
    finally:
        lib.nvmlShutdown()


def _cuda_initialized(torch: Any) -> bool:
    return bool(getattr(torch.cuda, "is_initialized", lambda: False)())


def gpu_names() -> list[str]:
    """Names of the GPUs torch can use here; never initialises CUDA."""
    torch = torch_module()
    if getattr(torch.version, "cuda", None):
        if _cuda_initialized(torch):
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return nvml_device_names() or []
    if getattr(torch.version, "xpu", None) and torch.xpu.is_available():
        return ["xpu"] * torch.xpu.device_count()
    return []


def gpu_count() -> int:
    """How many GPUs torch can use here; never initialises CUDA."""
    return len(gpu_names())


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
    """A hash of the config values torch hashes into its keys, serialised as torch serialises them.

    FX graph keys: Inductor's (and, where it exists, ``config_comms``) ``save_config_portable``
    with private values; AOTAutograd keys add functorch's ``save_config()``.
    """
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    parts = []
    modules = [inductor_config]
    try:
        modules.append(importlib.import_module("torch._inductor.config_comms"))
    except ImportError:
        pass
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
    """What torch's FX graph, AOTAutograd and autotune keys depend on outside the graph itself.

    ``torch_build`` is torch's own ``torch_key()`` (a hash of its files, so it also stands for the
    Python minor version, the platform and the CUDA build); the GPU name, CUDA version and, with a
    GPU, the Triton version enter keys through torch's ``get_system()``; ``config_hash`` mirrors
    the config torch hashes; ``num_threads`` and ``default_dtype`` enter the FX key of CPU code on
    2.13+ (on 2.11 they are not keyed at all, and kept here so code for other settings is never
    reused). The Python patch version enters no key. Device names are read through NVML, so CUDA
    is not initialised and forked children can still use it.
    """
    bootstrap()
    torch = torch_module()
    codecache = importlib.import_module("torch._inductor.codecache")
    torch_key = getattr(codecache, "torch_key", None)
    build = torch_key().hex()[:16] if torch_key is not None else str(getattr(torch.version, "git_version", ""))
    names = gpu_names()
    compiler_config = getattr(torch.compiler, "config", None)
    return {
        "torch": str(torch.__version__),
        "torch_build": build,
        "triton": _triton_version() if names else "none",
        "device": names[0] if names else "cpu",
        "cuda": str(torch.version.cuda or "none"),
        "python": "%d.%d" % sys.version_info[:2],
        "platform": f"{sys.platform}-{platform.machine()}",
        "cache_key_tag": str(getattr(compiler_config, "cache_key_tag", "")),
        "config_hash": _config_hash(),
        "default_dtype": str(torch.get_default_dtype()),
        "num_threads": str(torch.get_num_threads()),
    }
