"""Every touch of torch's private compile-cache API, feature-detected, in one package.

A torch upgrade that moves a private name should change this package and nothing else. Each module
imports torch lazily; importing the package is cheap. No private torch module is named outside it.
``core`` is the bottom module every other one builds on; no module imports one that imports it back.
"""

from ..bundle.keyindex import KeyIndex
from . import keys
from .binaries import build_identity, cpu_probe_sources, cpu_probes_in, header_build_seconds, mark_carried
from .binaries import rejected as rejected_binaries
from .binaries import rejected_names as rejected_binary_names
from .core import MIN_TORCH, TorchUnavailable, compiler_loaded, inductor_config_loaded, torch_module
from .counters import compile_seconds, read_counts, record_bypass_reasons, unobservable_fields, unobservable_layers
from .defaultdir import headers_at, redirect
from .devices import gpu_count
from .fingerprint import environment_fingerprint, made_with
from .isolation import bootstrap, caches_disabled_by_config, remote_caches_on, reset_in_memory, without_remote_caches
from .keys import empty_folder, explaining, note_bundle_keys, unpack_bundle_index, use_bundle_index
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
from .ondemand import complete_warm_folder, fill_warm_folder, placing_from, processes_read_no_entries


def index_for(payload: bytes) -> KeyIndex:
    """What this process knows about the artifact keys in Mega-Cache bytes (see :func:`keys.index_of`)."""
    return keys.index_of(key for _, key, _ in artifact_identities(payload))


__all__ = [
    "artifact_identities", "artifact_sizes", "bootstrap", "build_identity", "caches_disabled_by_config",
    "can_leave_out", "check_keys", "compile_seconds", "compiler_loaded", "complete_warm_folder", "describe_artifacts", "empty_folder",
    "environment_fingerprint", "explaining", "fill_warm_folder", "fresh_recording", "gpu_count", "headers_at",
    "index_for", "inductor_config_loaded", "load_artifacts", "made_with", "mark_carried", "MegaCacheError",
    "cpu_probe_sources", "cpu_probes_in", "header_build_seconds", "merge_artifacts", "MIN_TORCH", "note_bundle_keys", "placing_from", "processes_read_no_entries", "read_counts", "ready_to_read", "record_bypass_reasons",
    "redirect", "rejected_binaries", "rejected_binary_names", "remote_caches_on", "reset_in_memory",
    "save_artifacts", "select_artifacts", "torch_module", "TorchUnavailable", "unobservable_fields",
    "unobservable_layers", "unpack_bundle_index", "use_bundle_index", "without_remote_caches",
]
