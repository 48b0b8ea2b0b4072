"""The process environment as it concerns compile caches, read and restored without importing torch."""

from __future__ import annotations

import os
from typing import Mapping

#: Variables that decide where torch.compile keeps its on-disk caches.
CACHE_DIR_VARS: tuple[str, ...] = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")

_ON, _OFF = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off"})
#: Variables that switch caches off in a way ``config.patch`` cannot override: the values that do, and what they do.
_DISABLING_VARS: tuple[tuple[str, frozenset[str], str], ...] = (
    ("TORCHINDUCTOR_FORCE_DISABLE_CACHES", _ON, "disables every compile cache"),
    ("TORCH_COMPILE_FORCE_DISABLE_CACHES", _ON, "disables every compile cache"),
    ("TORCHINDUCTOR_FX_GRAPH_CACHE", _OFF, "disables the FX graph cache"),
    ("TORCHINDUCTOR_AUTOGRAD_CACHE", _OFF, "disables the AOTAutograd cache"),
)


def caches_disabled_by_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per variable that force-disables a cache, e.g. ``TORCHINDUCTOR_FX_GRAPH_CACHE=0 disables ...``."""
    environ = os.environ if environ is None else environ
    return [f"{name}={environ[name]} {effect}" for name, disabling, effect in _DISABLING_VARS
            if environ.get(name, "").strip().lower() in disabling]


class SavedEnv:
    """The exact values (or absence) of some variables, to be put back later."""

    def __init__(self, names: tuple[str, ...] = CACHE_DIR_VARS) -> None:
        self._values = {name: os.environ.get(name) for name in names}

    def restore(self) -> None:
        """Put every saved variable back, deleting those that were unset."""
        for name, value in self._values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def point_cache_dirs_at(path: str) -> None:
    """Point torch's Inductor and Triton cache variables at ``path`` and ``path/triton``."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    os.environ["TRITON_CACHE_DIR"] = os.path.join(path, "triton")
