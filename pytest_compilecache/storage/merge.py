"""The merge of bundle entries: one entry per environment, the union of their artifacts."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from .. import _torchapi
from ..bundle import signing
from .._torchapi.layout import is_cpp
from ..bundle.binaries import CarriedBinaries
from ..bundle.format import Bundle, BundleError, Entry, env_label, make_entry
from ..bundle.keyindex import KeyIndex, artifact_id
from ..words import counted


def env_id(env: Mapping[str, str]) -> str:
    """A canonical text for an environment, to group entries by."""
    return json.dumps(dict(env), sort_keys=True)


def union(entries: Iterable[Entry]) -> list[Entry]:
    """One entry per environment holding the union of the given entries' artifacts (see :func:`combine`
    for what is dropped with the signing key set)."""
    return _union(entries)[0]


def _union(entries: Iterable[Entry]) -> tuple[list[Entry], list[str]]:
    """The union, and what it dropped, in words.

    Artifacts are merged over (type, key, content), so guard variants kept under one key survive;
    carried binaries over (build, path). History: what an earlier entry recorded wins (it
    describes the run that first built the entry); later entries only add keys, and tests.
    Every entry's payload and binaries must already be read.

    With the signing key set, an entry read without a valid signature is never merged into one
    that will be signed: beside a vouched-for entry of its environment it is dropped (and said);
    with none, it is kept as it is, unmerged and unsigned.
    """
    secret = signing.key()
    groups: dict[str, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(env_id(entry.env), []).append(entry)
    merged = []
    dropped: list[str] = []
    for group in groups.values():
        if secret is not None:
            why = {id(e): e.vouched(secret) for e in group}
            trusted = [e for e in group if not why[id(e)]]
            if not trusted:
                merged.extend(group)
                continue
            for entry in group:
                if why[id(entry)]:
                    dropped.append(f"dropped a bundle entry for {env_label(entry.env)}: {why[id(entry)]} "
                                   f"({signing.KEY_ENV} is set); it was not merged into the signed one")
            group = trusted
        group.sort(key=lambda e: e.created or float("inf"))
        payloads = list(dict.fromkeys(e.payload for e in group if e.payload is not None))
        history: dict[str, object] = {}
        tests: dict[str, object] = {}
        for entry in reversed(group):
            history.update(entry.history)
            if isinstance(entry.history.get("tests"), dict):
                tests.update(entry.history["tests"])
        if tests:
            history["tests"] = tests
        if len(payloads) == 1 and len(group) == 1:
            merged.append(group[0])
            continue
        try:
            for data in payloads:
                _torchapi.check_keys(data)
            payload = _torchapi.merge_artifacts(payloads) if len(payloads) > 1 else payloads[0]
            artifacts = _torchapi.describe_artifacts(payload)
            keys = {key for _, key, _ in _torchapi.artifact_sizes(payload)}
        except _torchapi.MegaCacheError as exc:
            raise BundleError(f"cannot merge the entries for {env_label(group[0].env)}: {exc}") from None
        created = min((e.created for e in group if e.created), default=0.0)
        binaries = CarriedBinaries.union(e.binaries for e in reversed(group) if e.binaries is not None)
        index = KeyIndex.union(e.index for e in group if e.index is not None).restricted(keys)
        entry = make_entry(group[0].env, payload, artifacts, created, binaries, index)
        entry.history = history
        merged.append(entry)
    return merged, dropped


@dataclass(frozen=True)
class Combined:
    """The entries a write leaves, what it dropped (in words), and the artifacts it dropped as unused."""

    entries: list[Entry]
    dropped: tuple[str, ...] = ()
    #: ``{artifact type: count}`` dropped as unused in too many updating runs.
    unused: dict[str, int] = field(default_factory=dict)


def stamp(additions: list[Entry], history: Mapping[str, object] | None, run: float | None) -> None:
    """Give new entries the session's history, their creation time, and (with ``run``) a note that
    this run used every artifact they hold."""
    now = time.time()
    for entry in additions:
        entry.history = {**(history or {}), **({"run": run} if run is not None else {}), **entry.history}
        entry.created = entry.created or now
        if run is not None:
            used = [artifact_id(kind, key) for kind, key, _ in _torchapi.artifact_sizes(bundle_payload(entry))]
            entry.index = KeyIndex.union([entry.index or KeyIndex()])
            entry.index.note_run(run, used)
            entry.reset_index()


def combine(current: Bundle | None, additions: list[Entry], *, run: float | None = None, max_unused_runs: int = 0,
            rebuild: bool = False) -> Combined:
    """The entries of ``current`` (read whole) with the (stamped) ``additions`` merged in.

    With ``max_unused_runs``, artifacts of the additions' environments that none of their last that
    many updating runs used are dropped. With ``rebuild``, what ``current`` holds for the additions'
    environments is replaced, unless the same ``run`` wrote it (a rebuilding session's first write
    replaces, its later writes merge). With the signing key set, an entry not vouched for is dropped
    beside a vouched-for one of its environment.
    """
    touched = {env_id(e.env) for e in additions}
    existing = list(current.entries) if current else []
    if rebuild:
        existing = [e for e in existing if env_id(e.env) not in touched or e.history.get("run") == run]
    merged, dropped = _union([*existing, *additions])
    unused: dict[str, int] = {}
    if max_unused_runs > 0:
        merged = [_without_unused(e, max_unused_runs, unused) if env_id(e.env) in touched else e for e in merged]
    return Combined(merged, tuple(dropped), unused)


def adds_nothing(current: Bundle | None, additions: list[Entry]) -> bool:
    """Whether every artifact and carried binary of ``additions`` is already in ``current`` (read whole),
    in an entry that a write would not change (with the signing key set: one that is vouched for)."""
    return what_is_new(current, additions).nothing


@dataclass(frozen=True)
class New:
    """What ``additions`` bring that a bundle lacks."""

    #: Whether a write would change nothing (see :func:`adds_nothing`).
    nothing: bool
    #: ``{artifact type: count}`` of artifacts under keys the bundle does not hold (``cpp``: carried binaries).
    counts: dict[str, int] = field(default_factory=dict)


def what_is_new(current: Bundle | None, additions: list[Entry]) -> New:
    """What ``additions`` bring that ``current`` (read whole) lacks: whether anything at all, and how
    many artifacts of each type under keys it does not hold."""
    secret = signing.key()
    nothing = current is not None
    counts: dict[str, int] = {}
    for entry in additions:
        have = current.find(entry.env) if current is not None else None
        if have is None:  # a new environment: everything in it is new, as its manifest counts it
            nothing = False
            for kind, described in entry.artifacts.items():
                counts[kind] = counts.get(kind, 0) + int(described.get("count", 0))
        else:
            mine = _torchapi.artifact_identities(bundle_payload(entry))
            held = _torchapi.artifact_identities(bundle_payload(have))
            if (secret is not None and have.vouched(secret)) or not mine <= held:
                nothing = False
            held_keys = {(kind, key) for kind, key, _ in held}
            for kind, key in {(kind, key) for kind, key, _ in mine} - held_keys:
                counts[kind] = counts.get(kind, 0) + 1
        carried = entry.binaries.files if entry.binaries else {}
        kept = have.binaries.files if have is not None and have.binaries else {}
        fresh = [path for build, path in carried if (build, path) not in kept]
        if fresh:
            nothing = False
        probes = entry.binaries.probes(_torchapi.cpu_probe_sources()) if entry.binaries else set()
        binaries = sum(1 for path in fresh if is_cpp(path) and path not in probes)
        if binaries:
            counts["cpp"] = counts.get("cpp", 0) + binaries
    return New(nothing, counts)


def _without_unused(entry: Entry, runs: int, counts: dict[str, int]) -> Entry:
    """``entry`` without the artifacts none of its last ``runs`` updating runs used (counted in ``counts``)."""
    if entry.index is None:
        return entry
    sizes = _torchapi.artifact_sizes(bundle_payload(entry))
    unused = entry.index.unused_for(runs, [artifact_id(kind, key) for kind, key, _ in sizes])
    if not unused:
        return entry
    payload, dropped = _torchapi.select_artifacts(bundle_payload(entry),
                                                  lambda kind, key: artifact_id(kind, key) not in unused)
    for kind, n in dropped.items():
        counts[kind] = counts.get(kind, 0) + n
    kept = {key for kind, key, _ in sizes if artifact_id(kind, key) not in unused}
    index = entry.index.restricted(kept, f"no test using it in {counted(runs, 'updating run')} "
                                         "(compile_cache_max_unused_runs)", time.time())
    return entry.with_payload(payload, _torchapi.describe_artifacts(payload), index)


def bundle_payload(entry: Entry) -> bytes:
    """The payload of an entry already read (or made here)."""
    if entry.payload is None:
        raise BundleError(f"the payload for {env_label(entry.env)} was not read")
    return entry.payload
