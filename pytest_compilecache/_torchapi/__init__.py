"""Every touch of torch's private compile-cache API, feature-detected, in one package; its modules import
torch lazily and are imported when a name is first asked for, so that the plugin's package can import
:mod:`.patches` (the register of patches) before anything else."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .binaries import build_identity, cpu_probe_sources, cpu_probes_in, header_build_seconds, mark_carried
    from .binaries import rejected_binaries
    from .clock import compile_seconds
    from .core import MIN_TORCH, TorchUnavailable, compiler_loaded, inductor_config_loaded, torch_module
    from .counters import read_counts, record_bypass_reasons, unobservable_fields, unobservable_layers
    from .defaultdir import headers_at, redirect
    from .devices import gpu_count
    from .fingerprint import environment_fingerprint, made_with
    from .isolation import bootstrap, caches_disabled_by_config, remote_caches_on, reset_in_memory
    from .isolation import without_remote_caches
    from .keys import empty_folder, note_bundle_keys
    from .megacache import MegaCacheError, artifact_contents, artifact_identities, artifacts_bytes, can_leave_out
    from .megacache import check_artifact_keys, check_keys, describe_artifacts, found_by_coordinate_descent
    from .megacache import fresh_recording, load_artifacts, ready_to_read, save_artifacts
    from .ondemand import asked_binaries, binaries_on_demand, complete_warm_folder, fill_from, fill_warm_folder
    from .ondemand import triton_on_demand
    from .ondemand import kinds_on_demand
    from .ondemand import link_whole, make_whole, placing_from

__all__ = [
    "build_identity", "cpu_probe_sources", "cpu_probes_in", "header_build_seconds", "mark_carried",
    "rejected_binaries", "compile_seconds", "MIN_TORCH", "TorchUnavailable",
    "compiler_loaded", "inductor_config_loaded", "torch_module", "read_counts", "record_bypass_reasons",
    "unobservable_fields", "unobservable_layers", "headers_at", "redirect", "gpu_count", "environment_fingerprint",
    "made_with", "bootstrap", "caches_disabled_by_config", "remote_caches_on", "reset_in_memory",
    "without_remote_caches", "empty_folder", "note_bundle_keys", "MegaCacheError", "artifact_contents",
    "artifact_identities", "artifacts_bytes", "can_leave_out", "check_artifact_keys", "check_keys",
    "describe_artifacts", "found_by_coordinate_descent", "fresh_recording", "load_artifacts", "ready_to_read",
    "save_artifacts", "asked_binaries", "binaries_on_demand", "triton_on_demand", "complete_warm_folder",
    "fill_from", "fill_warm_folder", "kinds_on_demand", "link_whole",
    "make_whole", "placing_from",
]
#: The module of this package each name of :data:`__all__` lives in.
_MODULES = {
    "binaries": ("build_identity", "cpu_probe_sources", "cpu_probes_in", "header_build_seconds", "mark_carried",
                 "rejected_binaries"),
    "clock": ("compile_seconds",),
    "core": ("MIN_TORCH", "TorchUnavailable", "compiler_loaded", "inductor_config_loaded", "torch_module"),
    "counters": ("read_counts", "record_bypass_reasons", "unobservable_fields", "unobservable_layers"),
    "defaultdir": ("headers_at", "redirect"),
    "devices": ("gpu_count",),
    "fingerprint": ("environment_fingerprint", "made_with"),
    "isolation": ("bootstrap", "caches_disabled_by_config", "remote_caches_on", "reset_in_memory",
                  "without_remote_caches"),
    "keys": ("empty_folder", "note_bundle_keys"),
    "megacache": ("MegaCacheError", "artifact_contents", "artifact_identities", "artifacts_bytes", "can_leave_out",
                  "check_artifact_keys", "check_keys", "describe_artifacts", "found_by_coordinate_descent",
                  "fresh_recording", "load_artifacts", "ready_to_read", "save_artifacts"),
    "ondemand": ("asked_binaries", "binaries_on_demand", "triton_on_demand", "complete_warm_folder", "fill_from",
                 "fill_warm_folder", "kinds_on_demand",
                 "link_whole", "make_whole",
                 "placing_from"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    """Import the module that holds ``name`` when it is first asked for."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
