"""What decides whether cached artifacts can hit here (among it the GPUs torch can use), read without initialising
CUDA (through NVML where torch has not yet)."""

from __future__ import annotations

import contextlib
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
    out: list[Any] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        if not item.lstrip("-").isdigit():
            out.append(item)
        elif 0 <= int(item) < count:
            out.append(int(item))
        else:
            break
    return out


def _nvml_names() -> list[str] | None:
    """Names of the CUDA devices torch would see, through NVML (no CUDA context); ``None`` without NVML."""
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


def gpu_names() -> list[str]:
    """Names of the GPUs torch can use here; never initialises CUDA."""
    torch = torch_module()
    if getattr(torch.version, "cuda", None):
        if getattr(torch.cuda, "is_initialized", lambda: False)():
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return _nvml_names() or []
    if getattr(torch.version, "xpu", None) and torch.xpu.is_available():
        return ["xpu"] * torch.xpu.device_count()
    return []


def _portable(config: Any) -> dict[str, Any]:
    save = config.save_config_portable
    for kwargs in ({"ignore_private_configs": False, "readonly_values": True}, {"ignore_private_configs": False}):
        with contextlib.suppress(TypeError):  # an older torch's takes fewer of them
            return dict(save(**kwargs))
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
    digest.update(functorch_config.save_config())
    return digest.hexdigest()[:16]


def _triton_version() -> str:
    from importlib import metadata

    for dist in ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
    return "none"


def environment_fingerprint() -> dict[str, str]:
    """What torch's FX graph, AOTAutograd and autotune keys depend on outside the graph itself (``torch_build``:
    torch's ``torch_key()``; ``num_threads`` and ``default_dtype``, which only torch >= 2.13 keys, kept so code
    for other settings is never reused); never initialises CUDA, so forked children can still use it."""
    bootstrap()
    torch = torch_module()
    build = importlib.import_module("torch._inductor.codecache").torch_key().hex()[:16]
    names = gpu_names()
    return {
        "torch": str(torch.__version__),
        "torch_build": build,
        "triton": _triton_version() if names else "none",
        "device": names[0] if names else "cpu",
        "cuda": str(torch.version.cuda or "none"),
        "python": "%d.%d" % sys.version_info[:2],
        "platform": f"{sys.platform}-{platform.machine()}",
        "cache_key_tag": str(torch.compiler.config.cache_key_tag),
        "config_hash": _config_hash(),
        "default_dtype": str(torch.get_default_dtype()),
        "num_threads": str(torch.get_num_threads()),
    }

