"""Every touch of torch's private compile-cache API, feature-detected, in one package.

A torch upgrade that moves a private name should change this package and nothing else. Each module
imports torch lazily, and this package imports its modules only when a name is first asked for, so
that the plugin's package can import :mod:`.patches` (its register of patches) before anything else.
No private torch module is named outside it. ``core`` is the bottom module every other one builds
on; no module imports one that imports it back.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .binaries import build_identity, cpu_probe_sources, cpu_probes_in, header_build_seconds, mark_carried
    from .binaries import rejected as rejected_binaries
    from .binaries import rejected_names as rejected_binary_names
    from .core import MIN_TORCH, TorchUnavailable, compiler_loaded, inductor_config_loaded, torch_module
    from .counters import compile_seconds, read_counts, record_bypass_reasons, unobservable_fields, unobservable_layers
    from .defaultdir import headers_at, redirect
    from .devices import gpu_count
    from .fingerprint import environment_fingerprint, made_with
    from .isolation import bootstrap, caches_disabled_by_config, remote_caches_on, reset_in_memory, without_remote_caches
    from .keys import empty_folder, note_bundle_keys
    from .megacache import (
        MegaCacheError,
        artifact_identities,
        artifact_sizes,
        can_leave_out,
        check_keys,
        describe_artifacts,
        fresh_recording,
        load_artifacts,
        merge_artifacts,
        ready_to_read,
        save_artifacts,
        select_artifacts,
    )
    from .ondemand import complete_warm_folder, fill_warm_folder, link_whole, placing_from


#: Where each name of this package lives: ``{name: (module, name there)}``.
_WHERE: dict[str, tuple[str, str]] = {
    "build_identity": ("binaries", "build_identity"),
    "cpu_probe_sources": ("binaries", "cpu_probe_sources"),
    "cpu_probes_in": ("binaries", "cpu_probes_in"),
    "header_build_seconds": ("binaries", "header_build_seconds"),
    "mark_carried": ("binaries", "mark_carried"),
    "rejected_binaries": ("binaries", "rejected"),
    "rejected_binary_names": ("binaries", "rejected_names"),
    "MIN_TORCH": ("core", "MIN_TORCH"),
    "TorchUnavailable": ("core", "TorchUnavailable"),
    "compiler_loaded": ("core", "compiler_loaded"),
    "inductor_config_loaded": ("core", "inductor_config_loaded"),
    "torch_module": ("core", "torch_module"),
    "compile_seconds": ("counters", "compile_seconds"),
    "read_counts": ("counters", "read_counts"),
    "record_bypass_reasons": ("counters", "record_bypass_reasons"),
    "unobservable_fields": ("counters", "unobservable_fields"),
    "unobservable_layers": ("counters", "unobservable_layers"),
    "headers_at": ("defaultdir", "headers_at"),
    "redirect": ("defaultdir", "redirect"),
    "gpu_count": ("devices", "gpu_count"),
    "environment_fingerprint": ("fingerprint", "environment_fingerprint"),
    "made_with": ("fingerprint", "made_with"),
    "bootstrap": ("isolation", "bootstrap"),
    "caches_disabled_by_config": ("isolation", "caches_disabled_by_config"),
    "remote_caches_on": ("isolation", "remote_caches_on"),
    "reset_in_memory": ("isolation", "reset_in_memory"),
    "without_remote_caches": ("isolation", "without_remote_caches"),
    "empty_folder": ("keys", "empty_folder"),
    "note_bundle_keys": ("keys", "note_bundle_keys"),
    "MegaCacheError": ("megacache", "MegaCacheError"),
    "artifact_identities": ("megacache", "artifact_identities"),
    "artifact_sizes": ("megacache", "artifact_sizes"),
    "can_leave_out": ("megacache", "can_leave_out"),
    "check_keys": ("megacache", "check_keys"),
    "describe_artifacts": ("megacache", "describe_artifacts"),
    "fresh_recording": ("megacache", "fresh_recording"),
    "load_artifacts": ("megacache", "load_artifacts"),
    "merge_artifacts": ("megacache", "merge_artifacts"),
    "ready_to_read": ("megacache", "ready_to_read"),
    "save_artifacts": ("megacache", "save_artifacts"),
    "select_artifacts": ("megacache", "select_artifacts"),
    "complete_warm_folder": ("ondemand", "complete_warm_folder"),
    "fill_warm_folder": ("ondemand", "fill_warm_folder"),
    "placing_from": ("ondemand", "placing_from"),
    "link_whole": ("ondemand", "link_whole"),
}


def __getattr__(name: str) -> Any:
    """Import the module that holds ``name`` when it is first asked for."""
    if name in _WHERE:
        module, attribute = _WHERE[name]
        value = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
    elif name == "keys":
        value = importlib.import_module(f"{__name__}.keys")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "artifact_identities", "artifact_sizes", "bootstrap", "build_identity", "caches_disabled_by_config",
    "can_leave_out", "check_keys", "compile_seconds", "compiler_loaded", "complete_warm_folder", "describe_artifacts", "empty_folder",
    "environment_fingerprint", "fill_warm_folder", "fresh_recording", "gpu_count", "headers_at",
    "inductor_config_loaded", "load_artifacts", "made_with", "mark_carried", "MegaCacheError",
    "cpu_probe_sources", "cpu_probes_in", "header_build_seconds", "merge_artifacts", "MIN_TORCH", "note_bundle_keys", "placing_from", "link_whole", "read_counts", "ready_to_read", "record_bypass_reasons",
    "redirect", "rejected_binaries", "rejected_binary_names", "remote_caches_on", "reset_in_memory",
    "save_artifacts", "select_artifacts", "torch_module", "TorchUnavailable", "unobservable_fields",
    "unobservable_layers", "without_remote_caches",
]
