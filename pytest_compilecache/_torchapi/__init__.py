"""Every touch of torch's private compile-cache API, feature-detected, in one package; none of its modules
imports torch at its own import."""

from __future__ import annotations

from .binaries import build_identity, cpu_probe_sources, cpu_probes_in, header_build_seconds, mark_carried
from .binaries import rejected_binaries
from .clock import compile_seconds
from .core import TorchUnavailable, compiler_loaded, inductor_config_loaded
from .counters import read_counts, record_bypass_reasons, unobservable_fields, unobservable_layers
from .defaultdir import headers_at, redirect
from .fingerprint import environment_fingerprint
from .isolation import bootstrap, caches_disabled_by_config, remote_caches, reset_in_memory
from .keys import empty_folder, note_bundle_keys
from .megacache import MegaCacheError, artifact_contents, artifact_identities, artifacts_bytes, can_leave_out
from .megacache import check_artifact_keys, check_keys, describe_artifacts, found_by_coordinate_descent
from .megacache import fresh_recording, load_artifacts, ready_to_read, save_artifacts
from .ondemand import asked_binaries, binaries_on_demand, fill_from, fill_warm_folder, kinds_on_demand, link_whole
from .ondemand import make_whole, placing_from, triton_on_demand

__all__ = [
    "build_identity", "cpu_probe_sources", "cpu_probes_in", "header_build_seconds", "mark_carried",
    "rejected_binaries", "compile_seconds", "TorchUnavailable", "compiler_loaded", "inductor_config_loaded",
    "read_counts", "record_bypass_reasons", "unobservable_fields", "unobservable_layers", "headers_at", "redirect",
    "environment_fingerprint", "bootstrap", "caches_disabled_by_config", "remote_caches",
    "reset_in_memory", "empty_folder", "note_bundle_keys", "MegaCacheError",
    "artifact_contents", "artifact_identities", "artifacts_bytes", "can_leave_out", "check_artifact_keys",
    "check_keys", "describe_artifacts", "found_by_coordinate_descent", "fresh_recording", "load_artifacts",
    "ready_to_read", "save_artifacts", "asked_binaries", "binaries_on_demand", "triton_on_demand", "fill_from",
    "fill_warm_folder", "kinds_on_demand", "link_whole", "make_whole", "placing_from",
]
