"""The GPUs torch can use here, read without initialising CUDA (through NVML where torch has not yet)."""

from __future__ import annotations

import ctypes
import os
from typing import Any

from .core import torch_module

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


def gpu_count() -> int:
    """How many GPUs torch can use here; never initialises CUDA."""
    return len(gpu_names())
