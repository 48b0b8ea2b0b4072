"""The merge of bundle entries: one entry per environment, the union of their artifacts; and what a write drops."""

from __future__ import annotations

import json
import time
from typing import Iterable, Mapping, NamedTuple

from .. import _torchapi
from . import signing
from .._torchapi.layout import is_cpp
from .binaries import CarriedBinaries
from .format import Bundle, BundleError, Entry, entry_of, members_of
from .labels import env_label
from .writing import encoded_size
from .members import WHOLE, Member, MemberDamaged, Members
from .keyindex import BINARY, KeyIndex, artifact_id, binary_id
from ..words import counted


def env_id(env: Mapping[str, str]) -> str:
    """A canonical text for an environment, to group entries by."""
    return json.dumps(dict(env), sort_keys=True)


def union(entries: Iterable[Entry]) -> list[Entry]:
    """One entry per environment holding the union of the entries' artifacts; with the signing key set, an entry
    not vouched for is dropped beside one that is (with none, kept unmerged). Every section must be read."""
    return _union(entries)[0]


def merge_input(bundle: Bundle) -> list[Entry]:
    """The entries of one input of ``merge``, every payload read; a :class:`BundleError` where a signing key
    refuses one."""
    bundle.read_all()
    secret = signing.key()
    for entry in bundle.entries:
        if refused := bundle.signature_problem(entry, secret) if secret else "":
            raise BundleError(f"{refused}; merge refuses it")
    return list(bundle.entries)


def merged(entries: Iterable[Entry], inputs: str, output: str) -> list[Entry]:
    """:func:`union`, whose :class:`BundleError` names the ``inputs`` and the ``output`` left unchanged."""
    try:
        return union(entries)
    except BundleError as exc:
        raise BundleError(f"{inputs}: {exc}; {output} is unchanged") from None


def _union(entries: Iterable[Entry]) -> tuple[list[Entry], list[str]]:
    """The union (merged over type, key and content; the earliest history wins) and what it dropped, in words."""
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
            dropped += [f"dropped a bundle entry for {env_label(e.env)}: {why[id(e)]} ({signing.KEY_ENV} is set); "
                        "it was not merged into the signed one" for e in group if why[id(e)]]
            group = trusted
        group.sort(key=lambda e: e.created or float("inf"))
        history: dict[str, object] = {}
        tests: dict[str, object] = {}
        for entry in reversed(group):
            history.update(entry.history)
            if isinstance(entry.history.get("tests"), dict):
                tests.update(entry.history["tests"])
        if tests:
            history["tests"] = tests
        if len(group) == 1:
            merged.append(group[0])
            continue
        try:
            members = _merged([mergeable(e) for e in group])
        except _torchapi.MegaCacheError as exc:
            raise BundleError(f"cannot merge the entries for {env_label(group[0].env)}: {exc}") from None
        created = min((e.created for e in group if e.created), default=0.0)
        binaries = CarriedBinaries.union(e.binaries for e in reversed(group) if e.binaries is not None)
        keys = {member.key for member in members.table}
        index = KeyIndex.union(e.index for e in group if e.index is not None).restricted(keys)
        entry = entry_of(group[0].env, members, created, binaries, index)
        entry.history = history
        merged.append(entry)
    return merged, dropped


def mergeable(entry: Entry) -> Members:
    """An entry's members, its artifacts' keys checked; an entry torch could not take apart is taken apart now."""
    members = members_of(entry, "the bundle")
    whole = [m for m in members.table if m.kind == WHOLE]
    if whole:
        try:
            members = Members.packed(_torchapi.artifact_contents(members.read(whole[0])))
        except MemberDamaged as exc:
            raise BundleError(f"the bundle's entry for {env_label(entry.env)}: {exc}") from None
    _torchapi.check_artifact_keys((m.kind, m.key) for m in members.table)
    return members


def _merged(sources: list[Members]) -> Members:
    """The union of ``sources`` over (type, key, content), the last met kept; one key may hold several entries
    (one per guard variant), but an autotune result is one per kernel, coordinate descent's over a heuristic one."""
    picked: dict[tuple[str, str, str], tuple[Members, Member]] = {}
    autotune: dict[str, tuple[Members, Member, bool]] = {}
    for members in sources:
        for member in members.table:
            if member.kind != "autotune":  # the last copy: one made here replaces a damaged one stored before
                picked[(member.kind, member.key, member.sha256)] = (members, member)
                continue
            try:
                coordesc = _torchapi.found_by_coordinate_descent(members.read(member))
            except MemberDamaged:  # said when it was loaded; left out
                continue
            if member.key not in autotune or coordesc or not autotune[member.key][2]:
                autotune[member.key] = (members, member, coordesc)
    return Members.chosen([*picked.values(), *((m, member) for m, member, _ in autotune.values())])


class New(NamedTuple):
    """What additions bring: whether a write would change nothing, and ``{artifact type: count}`` under new keys."""

    nothing: bool
    counts: dict[str, int]


class Combined(NamedTuple):
    """The entries a write leaves, what it dropped (in words), the artifacts it dropped as unused, and what was new."""

    entries: list[Entry]
    dropped: tuple[str, ...]
    #: ``{artifact type: count}`` dropped as unused in too many updating runs.
    unused: dict[str, int]
    new: New


def stamp(additions: list[Entry], history: Mapping[str, object] | None, run: float | None,
          counted: bool = True) -> None:
    """Give new entries the session's history and creation time and, with ``run``, a note that it used them all
    (``counted``: a run that ran the whole suite, one of those ``compile_cache_max_unused_runs`` counts)."""
    now = time.time()
    for entry in additions:
        entry.history = {**(history or {}), **({"run": run} if run is not None else {}), **entry.history}
        entry.created = entry.created or now
        if run is not None:
            used = [artifact_id(m.kind, m.key) for m in members_of(entry, "the bundle").table]
            entry.index = KeyIndex.union([entry.index or KeyIndex()])
            entry.index.note_run(run, used, counted)
            entry.reset_index()


def combine(current: Bundle | None, additions: list[Entry], *, run: float | None = None, max_unused_runs: int = 0,
            rebuild: bool = False) -> Combined:
    """The entries of ``current`` (read whole) with the (stamped) ``additions`` merged in, less artifacts unused in
    ``max_unused_runs``; with ``rebuild``, what ``current`` holds for them is replaced unless ``run`` wrote it."""
    touched = {env_id(e.env) for e in additions}
    existing = list(current.entries) if current else []
    if rebuild:
        existing = [e for e in existing if env_id(e.env) not in touched or e.history.get("run") == run]
    merged, dropped = _union([*existing, *additions])
    unused: dict[str, int] = {}
    if max_unused_runs > 0:
        carried: dict[str, set[str]] = {}  # the kernels each environment's entry carried before this write
        for e in existing:
            carried.setdefault(env_id(e.env), set()).update(_kernel_ids(e.binaries))
        merged = [_without_unused(e, max_unused_runs, unused, carried.get(env_id(e.env), set()))
                  if env_id(e.env) in touched else e for e in merged]
    return Combined(merged, tuple(dropped), unused, what_is_new(current, additions))


def what_is_new(current: Bundle | None, additions: list[Entry]) -> New:
    """What ``additions`` bring that ``current`` (read whole) lacks."""
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
            mine = {(m.kind, m.key, m.sha256) for m in mergeable(entry).table}
            held = {(m.kind, m.key, m.sha256) for m in mergeable(have).table}
            if (secret is not None and have.vouched(secret)) or not mine <= held:
                nothing = False
            held_keys = {(kind, key) for kind, key, _ in held}
            for kind, key in {(kind, key) for kind, key, _ in mine} - held_keys:
                counts[kind] = counts.get(kind, 0) + 1
        carried = entry.binaries.files if entry.binaries else {}
        kept = have.binaries.files if have is not None and have.binaries else {}
        fresh = [path for build, path in carried if (build, path) not in kept]
        nothing = nothing and not fresh
        probes = entry.binaries.probes(_torchapi.cpu_probe_sources()) if entry.binaries else set()
        binaries = sum(1 for path in fresh if is_cpp(path) and path not in probes)
        if binaries:
            counts["cpp"] = counts.get("cpp", 0) + binaries
    return New(nothing, counts)


def without_unused(entries: list[Entry], runs: int) -> tuple[list[Entry], dict[str, int]]:
    """``entries`` less what none of their last ``runs`` whole-suite updating runs used, and ``{type: count}`` of
    what went (``cpp``: C++ kernels)."""
    counts: dict[str, int] = {}
    return [_without_unused(e, runs, counts, _kernel_ids(e.binaries)) for e in entries], counts


def _kernel_ids(binaries: CarriedBinaries | None) -> set[str]:
    """The C++ kernels ``binaries`` carry, as usage records name them."""
    return {binary_id(f.path) for f in binaries.files.values() if is_cpp(f.path)} if binaries else set()


def _without_unused(entry: Entry, runs: int, counts: dict[str, int], carried: set[str]) -> Entry:
    """``entry`` without the artifacts and the C++ kernels of ``carried`` (those it carried before this write) none
    of its last ``runs`` updating runs used (counted in ``counts``)."""
    if entry.index is None:
        return entry
    members = mergeable(entry)
    unused = entry.index.unused_for(runs, [artifact_id(m.kind, m.key) for m in members.table])
    binaries = _without_unused_binaries(entry.index, entry.binaries, runs, carried)
    unread = entry.binaries is None and entry.binaries_section is not None
    held = {binary_id(f.path) for f in binaries.files.values()} if binaries else set()
    stale = set() if unread else {n for n in entry.index.used if n.startswith(BINARY + "/") and n not in held}
    if not unused and binaries is entry.binaries and not stale:
        return entry
    for member in members.table:
        if artifact_id(member.kind, member.key) in unused:
            counts[member.kind] = counts.get(member.kind, 0) + 1
    smaller = without(entry, members, unused, f"no test using it in {counted(runs, 'updating run')} "
                                              "(compile_cache_max_unused_runs)")
    assert smaller.index is not None
    smaller.index.forget(stale)  # the records of binaries it no longer carries, or never did (a cold_cache test's)
    if binaries is not entry.binaries:
        assert entry.binaries is not None and binaries is not None
        gone = {f.path for f in entry.binaries.files.values()} - {f.path for f in binaries.files.values()}
        counts["cpp"] = counts.get("cpp", 0) + sum(1 for path in gone if is_cpp(path))
    smaller.binaries = binaries or None
    return smaller


def without(entry: Entry, members: Members, names: set[str], why: str) -> Entry:
    """``entry`` (of ``members``) without the artifacts called ``names`` (see :func:`artifact_id`), its key index
    noting ``why`` they went."""
    kept = [m for m in members.table if artifact_id(m.kind, m.key) not in names]
    index = entry.index.restricted({m.key for m in kept}, why, time.time()) if entry.index else None
    return entry.with_members(Members.chosen((members, m) for m in kept), index)


def _without_unused_binaries(index: KeyIndex, binaries: CarriedBinaries | None, runs: int,
                             carried: set[str]) -> CarriedBinaries | None:
    """``binaries`` less the C++ kernels (every file of one: binary, object, source) of ``carried`` none of the last
    ``runs`` updating runs asked for (see :meth:`.KeyIndex.unused_kernels`: where a run in that window did not
    record its asks, none goes); ``binaries`` itself where none goes. A kernel this write brings stays (a child
    process may have built it, unseen), and so do torch's CPU probes."""
    unused = index.unused_kernels(runs, _kernel_ids(binaries) & carried)
    if not binaries or not unused:
        return binaries
    probes = binaries.probes(_torchapi.cpu_probe_sources())
    unused -= {binary_id(path) for path in probes}
    if not unused:
        return binaries
    return CarriedBinaries(dict(binaries.builds), {key: f for key, f in binaries.files.items()
                                                   if binary_id(f.path) not in unused})


def written_size(bundle: Bundle) -> int:
    """The size of a bundle just written (or kept), or that it would have."""
    return bundle.path.stat().st_size if bundle.path.is_file() else encoded_size(bundle)

