"""What ``prune`` keeps of a bundle: entries named or not matching dropped, unused artifacts dropped, and the rest
made to fit a size, least recently used first."""

from __future__ import annotations

from pathlib import Path

from ..words import artifact_counts, counted
from .format import Bundle, BundleError, Entry, members_of
from .labels import env_label
from .writing import encoded_size
from .keyindex import KeyIndex, artifact_id
from .merge import without, without_unused


def prune(bundle: Bundle, label: str, drop: list[str], here: dict[str, str] | None, max_unused_runs: int,
          limit: int | None) -> tuple[list[Entry], list[str]]:
    """The entries of ``bundle`` a prune keeps, and what it dropped in words; a :class:`BundleError` (naming
    ``label``) where a ``drop`` names no entry or nothing would be left."""
    dropped = set().union(*(_named(label, spec, bundle.entries) for spec in drop))
    kept = [entry for i, entry in enumerate(bundle.entries) if i not in dropped and (here is None or entry.env == here)]
    if not kept:
        raise BundleError(f"{label}: no entry would be left (delete the file to remove the bundle); {label} is "
                          "unchanged")
    said = []
    if max_unused_runs > 0:
        kept, unused = without_unused(kept, max_unused_runs)
        runs = max((len(e.index.whole_runs) for e in kept if e.index is not None), default=0)
        few = (f" (only {counted(runs, 'updating run')} of the whole suite recorded: runs that left tests out, "
               "such as CI shards, are not counted)") if runs < max_unused_runs else ""
        said.append(f"dropped as unused in the last {counted(max_unused_runs, 'updating run')}: "
                    f"{artifact_counts(unused) if unused else 'nothing'}{few}")
    if limit is not None:
        kept, lines = fit(bundle.path, kept, limit, label)
        said.extend(lines)
    return kept, said


def _named(name: str, spec: str, entries: list[Entry]) -> set[int]:
    """The numbers of the entries one ``--drop`` names; one that names none is a :class:`BundleError` that says
    why (no such number, a field no entry has, or no entry with that value)."""
    unchanged = f"{name} is unchanged"
    if spec.isdigit():
        number = int(spec)
        if number >= len(entries):
            have = f"numbered 0 to {len(entries) - 1}" if entries else "none"
            raise BundleError(f"{name}: --drop {spec}: there is no entry {number}; its entries are {have} "
                              f"(see inspect); {unchanged}")
        return {number}
    key, _, value = spec.partition("=")
    fields = sorted({field for entry in entries for field in entry.env})
    if key not in fields:
        raise BundleError(f"{name}: --drop {spec!r}: no entry has a field {key!r}; the fields are "
                          f"{', '.join(fields) or 'none'}; {unchanged}")
    matched = {i for i, entry in enumerate(entries) if entry.env.get(key) == value}
    if not matched:
        values = sorted({entry.env[key] for entry in entries if key in entry.env})
        raise BundleError(f"{name}: --drop {spec!r}: no entry has {key}={value!r}; its entries have {key}="
                          f"{', '.join(map(repr, values))}; {unchanged}")
    return matched


def fit(path: Path, entries: list[Entry], limit: int, label: str) -> tuple[list[Entry], list[str]]:
    """``entries`` made to fit in ``limit`` bytes, least recently used artifacts first (carried binaries where
    those cannot make it fit), and what was dropped; a :class:`BundleError` naming ``label`` where no artifact
    would be left."""
    start = encoded_size(Bundle(path, entries))
    plan = _plan(path, entries, limit, binaries_first=False)
    if (plan[2] and plan[2][-1].startswith("dropped the carried binaries")) or any(
            e.binaries and not e.artifacts for e in plan[0]):
        plan = _plan(path, entries, limit, binaries_first=True)
    kept, size, lines = plan
    left = [e for e in kept if e.artifacts]  # carried binaries serve artifacts: alone they are nothing usable
    if size > limit or not left:
        raise BundleError(f"{label}: cannot fit in {limit:,d} bytes with any artifact kept; {label} is unchanged")
    if len(left) < len(kept):
        lines.append(f"dropped {counted(len(kept) - len(left), 'environment')} left with no artifact")
    return left, [f"{start:,d} -> {encoded_size(Bundle(path, left)):,d} bytes", *lines]


def _plan(path: Path, entries: list[Entry], limit: int, binaries_first: bool) -> tuple[list[Entry], int, list[str]]:
    """One way to fit: (entries, size, what was dropped in words)."""
    entries, lines = list(entries), []
    size = encoded_size(Bundle(path, entries))

    def drop_binaries() -> None:
        nonlocal size
        carrying = [(number, e.binaries.counts()["bytes"]) for number, e in enumerate(entries) if e.binaries]
        for number, _ in sorted(carrying, key=lambda item: -item[1]):
            if size <= limit:
                return
            entry = entries[number]
            entries[number] = entry.with_members(members_of(entry, str(path)), entry.index, binaries=False)
            size = encoded_size(Bundle(path, entries))
            lines.append(f"dropped the carried binaries of {env_label(entry.env)}")

    if binaries_first:
        drop_binaries()
    candidates = []
    for number, entry in enumerate(entries):
        index = entry.index or KeyIndex()
        first = index.runs[0] if index.runs else 0.0
        last = index.runs[-1] if index.runs else None
        for member in members_of(entry, str(path)).table:
            kind, key, n = member.kind, member.key, member.stored
            used = index.used.get(artifact_id(kind, key), first)
            # Among artifacts used as recently: AOTAutograd first (it needs its FX graph), then the largest.
            candidates.append((used, kind != "aot_autograd", -n, number, kind, key, n,
                               last is not None and used >= last))
    total = len(candidates)
    candidates.sort()
    recent = 0
    gone_kinds: dict[str, int] = {}
    while size > limit and candidates:
        dropped: dict[int, set[str]] = {}
        excess = size - limit
        while excess > 0 and candidates:
            *_, number, kind, key, n, last_used = candidates.pop(0)
            dropped.setdefault(number, set()).add(artifact_id(kind, key))
            gone_kinds[kind] = gone_kinds.get(kind, 0) + 1
            recent += last_used
            excess -= n
        entries = [without(e, members_of(e, str(path)), dropped[i], "`prune --max-size`") if i in dropped else e
                   for i, e in enumerate(entries)]
        size = encoded_size(Bundle(path, entries))
    gone = total - len(candidates)
    if gone:
        recently = (f"; {recent} of them the last recorded run used: tests that need them miss until an updating run "
                    "saves them again") if recent else ""
        kinds = artifact_counts(gone_kinds)
        lines.append(f"dropped {counted(gone, 'least recently used artifact')} ({kinds}{recently})")
    drop_binaries()
    return entries, size, lines
