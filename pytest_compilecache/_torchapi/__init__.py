"""Every touch of torch's private compile-cache API, feature-detected, in one package.

A torch upgrade that moves a private name should change this package and nothing else. Each module
imports torch lazily; importing the package is cheap. No private torch module is named outside it.
"""

from .binaries import build_identity, mark_carried
from .binaries import rejected as rejected_binaries
from .binaries import rejected_names as rejected_binary_names
from .core import MIN_TORCH, TorchUnavailable, torch_module
from .counters import (
    compile_seconds,
    read_counts,
    record_bypass_reasons,
    unobservable_fields,
    unobservable_layers,
)
from .defaultdir import headers_at, redirect
from .fingerprint import environment_fingerprint, gpu_count
from .isolation import bootstrap, caches_disabled_by_config, remote_caches_on, reset_in_memory, without_remote_caches
from .keys import empty_folder, explaining, index_for, note_bundle_keys, use_bundle_index
from .megacache import (
    MegaCacheError,
    artifact_identities,
    check_keys,
    describe_artifacts,
    fresh_recording,
    load_artifacts,
    artifact_sizes,
    can_leave_out,
    merge_artifacts,
    save_artifacts,
    select_artifacts,
)

__all__ = [
    "MIN_TORCH", "MegaCacheError", "TorchUnavailable", "artifact_identities", "bootstrap", "build_identity",
    "caches_disabled_by_config", "check_keys", "remote_caches_on", "explaining", "empty_folder", "index_for", "use_bundle_index", "note_bundle_keys", "compile_seconds", "describe_artifacts", "environment_fingerprint",
    "fresh_recording", "gpu_count", "headers_at", "load_artifacts", "mark_carried", "merge_artifacts", "read_counts", "select_artifacts", "artifact_sizes", "can_leave_out",
    "record_bypass_reasons", "redirect", "rejected_binaries", "rejected_binary_names", "reset_in_memory", "save_artifacts", "torch_module",
    "unobservable_fields", "unobservable_layers", "without_remote_caches",
]
