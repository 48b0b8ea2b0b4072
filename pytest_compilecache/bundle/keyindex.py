"""What a bundle knows about each artifact key (the components torch built it from) and its usage, kept as a
section of an entry: a compressed head, then the keys' components in groups of one layer and code, each compressed
alone, read when one of its keys is asked for and copied as stored when rewritten (docs/file-format.md#the-key-index).
This module never imports torch."""

from __future__ import annotations

import hashlib
import json
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

from ..caught import caught

FORMAT = 2
#: Components whose names start so are config values, stored once per distinct set.
CONFIG_PREFIXES = ("inductor_config[", "inductor_config_comms[", "functorch_config[")
#: Longest text kept for one component (a graph's code gets more, for showing which nodes differ).
MAX_TEXT = 2000
MAX_GRAPH_TEXT = 30000
#: How many updating runs are remembered per entry.
MAX_RUNS = 200
#: How many dropped keys are remembered (the most recently dropped).
MAX_DROPPED = 10000
#: Largest index accepted when decompressed (a bomb is refused, not inflated).
MAX_UNPACKED = 256 * 1024 * 1024

Components = Mapping[str, "tuple[str, str] | list[str]"]
T = TypeVar("T")


class KeyIndexError(ValueError):
    """A bundle's key index is malformed; the entry's artifacts stay usable, only explanations are lost."""


def clip(name: str, text: str) -> str:
    """``text`` cut to the length kept for the component ``name``."""
    limit = MAX_GRAPH_TEXT if name == "gm" else MAX_TEXT
    return text if len(text) <= limit else text[:limit] + "..."


def artifact_id(kind: str, key: str) -> str:
    """How an artifact is named in usage records: ``<artifact type>/<key>``."""
    return f"{kind}/{key}"


#: The type under which carried C++ kernels are named in usage records: ``cpp/<key>``.
BINARY = "cpp"


def binary_id(path: str) -> str:
    """How a carried C++ file (``xx/<key>.main.so``, ``xx/<key>.cpp``; or a kernel's key) is named in usage records:
    by its key alone (an object torch builds for one kernel may lie in another kernel's folder)."""
    return artifact_id(BINARY, path.rpartition("/")[2].split(".", 1)[0])


class _Group:
    """Components of keys (``configs``: ``{key: config id}``) of one layer and code: made here, or compressed as a
    key index stores them and parsed when first asked."""

    def __init__(self, layer: str, code: str, configs: dict[str, str], stored: bytes = b"",
                 parsed: dict[str, dict[str, list[str]]] | None = None) -> None:
        self.layer, self.code, self.configs, self.stored, self._parsed = layer, code, configs, stored, parsed

    def components(self, key: str) -> dict[str, list[str]]:
        """The key's own components; raises :class:`KeyIndexError` when the group is malformed."""
        if self._parsed is None:
            try:
                data = json.loads(_inflated(self.stored).decode("utf-8"))
            except (zlib.error, UnicodeDecodeError, ValueError, RecursionError):
                raise KeyIndexError(f"the key details of {_short(self.code)} are not valid compressed JSON") from None
            try:
                self._parsed = {_str(k): _components(v) for k, v in _dict(data).items()}
            except TypeError as exc:
                raise KeyIndexError(f"the key details of {_short(self.code)} are malformed: {exc}") from None
        if key not in self._parsed:
            raise KeyIndexError(f"the key details of {_short(self.code)} lack a key they list")
        return self._parsed[key]


class Records(Mapping[str, dict[str, Any]]):
    """Each key's record (``layer``, ``code``, ``config``, ``components``), by the group holding it; a key's layer,
    code and config set are known without reading its group."""

    def __init__(self, groups: dict[str, _Group] | None = None) -> None:
        self._groups = groups if groups is not None else {}

    def __getitem__(self, key: str) -> dict[str, Any]:
        group = self._groups[key]
        return {"layer": group.layer, "code": group.code, "config": group.configs[key],
                "components": group.components(key)}

    def __contains__(self, key: object) -> bool:
        return key in self._groups

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)

    def about(self, key: str) -> tuple[str, str, str]:
        """The key's layer, code and config set, its components unread."""
        group = self._groups[key]
        return group.layer, group.code, group.configs[key]

    def put(self, key: str, layer: str, code: str, config: str, components: dict[str, list[str]]) -> None:
        """Record ``key`` made here."""
        self._groups[key] = _Group(layer, code, {key: config}, parsed={key: components})

    def only(self, keys: set[str]) -> "Records":
        """Those of ``keys`` (groups shared, nothing read)."""
        return Records({k: g for k, g in self._groups.items() if k in keys})

    def merged(self, other: "Records") -> "Records":
        """These and those of ``other`` these lack (groups shared, nothing read)."""
        return Records({**self._groups, **{k: g for k, g in other._groups.items() if k not in self._groups}})

    def packed(self) -> tuple[list[list[Any]], list[bytes]]:
        """The head's listing of groups, and each group as stored: a stored group all of whose keys are here is
        copied as it is; any other is read and compressed again (one that cannot be read is left out, with its
        keys), keys made here in one group per layer and code."""
        listing: list[list[Any]] = []
        blobs: list[bytes] = []
        by_group: dict[object, list[tuple[str, _Group]]] = {}
        for key, group in self._groups.items():
            by_group.setdefault(id(group) if group.stored else (group.layer, group.code), []).append((key, group))
        for pairs in by_group.values():
            first = pairs[0][1]
            if first.stored and len(pairs) == len(first.configs):
                blob = first.stored
            else:
                try:
                    blob = _deflated({k: g.components(k) for k, g in pairs})
                except KeyIndexError as exc:  # this group's key details are left out
                    caught("packing a group of key details", exc)
                    continue
            listing.append([first.layer, first.code, len(blob), [[k, g.configs[k]] for k, g in pairs]])
            blobs.append(blob)
        return listing, blobs


@dataclass
class KeyIndex:
    """Key components per artifact key, config sets stored once, and usage."""

    torch: str = ""
    configs: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    keys: Records = field(default_factory=Records)
    runs: list[float] = field(default_factory=list)
    used: dict[str, float] = field(default_factory=dict)
    #: ``{key: (why, when)}``: keys whose artifacts were dropped from the bundle, and what dropped them.
    dropped: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: Of ``runs``, those that ran the whole suite: what ``compile_cache_max_unused_runs`` counts (a bundle written
    #: before they were told apart has none, so its earlier runs never count).
    whole_runs: list[float] = field(default_factory=list)
    #: The first run that recorded which C++ kernels torch asked for (0: none did); none is judged unused before.
    kernels_since: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.keys or self.runs or self.used)

    def add(self, key: str, layer: str, code: str, components: Components) -> None:
        """Record the components of ``key`` (a key already recorded is kept as it was)."""
        self.dropped.pop(key, None)
        if key in self.keys:
            return
        config = {n: [str(v[0]), clip(n, str(v[1]))] for n, v in components.items() if n.startswith(CONFIG_PREFIXES)}
        rest = {n: [str(v[0]), clip(n, str(v[1]))] for n, v in components.items() if not n.startswith(CONFIG_PREFIXES)}
        cid = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
        self.configs.setdefault(cid, config)
        self.keys.put(key, layer, code, cid, rest)

    def components(self, key: str) -> dict[str, tuple[str, str]]:
        """Every component of ``key``: its own and its config set's (its group read, if stored, when first asked);
        raises :class:`KeyIndexError` when that group is malformed."""
        record = self.keys[key]
        both = {**self.configs.get(record["config"], {}), **record["components"]}
        return {n: (v[0], v[1]) for n, v in both.items()}

    def of_layer(self, layer: str) -> list[str]:
        """The keys recorded for ``layer``."""
        return [k for k in self.keys if self.keys.about(k)[0] == layer]

    def of_code(self, layer: str, code: str) -> list[str]:
        """The keys recorded for ``layer`` compiled from ``code`` (nothing of their components read)."""
        return [k for k in self.keys if self.keys.about(k)[:2] == (layer, code)]

    def restricted(self, keys: Iterable[str], dropped_by: str = "", when: float = 0.0) -> "KeyIndex":
        """A copy holding only ``keys`` (their config sets and usage); the others noted as dropped by ``dropped_by``."""
        wanted = set(keys)
        kept = self.keys.only(wanted)
        referenced = {kept.about(k)[2] for k in kept}
        configs = {c: v for c, v in self.configs.items() if c in referenced}
        used = {a: t for a, t in self.used.items() if a.split("/", 1)[-1] in wanted or a.startswith(BINARY + "/")}
        dropped = {k: d for k, d in self.dropped.items() if k not in wanted}
        if dropped_by:
            dropped.update({k: (dropped_by, when) for k in self.keys if k not in wanted})
        return KeyIndex(self.torch, configs, kept, list(self.runs), used, _newest(dropped), list(self.whole_runs),
                        self.kernels_since)

    def note_run(self, when: float, used: Iterable[str], counted: bool = True) -> None:
        """An updating run at ``when`` used the artifacts ``used`` (as :func:`artifact_id` names them); only a
        ``counted`` run (one that ran the whole suite) is one of the runs :meth:`unused_for` counts."""
        if when not in self.runs:
            self.runs = sorted([*self.runs, when])[-MAX_RUNS:]
        if counted and when not in self.whole_runs:
            self.whole_runs = sorted([*self.whole_runs, when])[-MAX_RUNS:]
        self.note_used(when, used)

    def note_used(self, when: float, used: Iterable[str]) -> None:
        """The artifacts ``used`` (as :func:`artifact_id` names them) were used by a run at ``when``."""
        for name in used:
            self.used[name] = max(self.used.get(name, 0.0), when)

    def note_kernels(self, when: float, keys: Iterable[str]) -> None:
        """A run at ``when`` recorded the C++ kernels torch asked for (``keys``, none maybe: it still recorded)."""
        self.kernels_since = min(self.kernels_since or when, when)
        self.note_used(when, (binary_id(key) for key in keys))

    def unused_kernels(self, runs: int, kernels: Iterable[str]) -> set[str]:
        """Those of ``kernels`` (as :func:`binary_id` names them) none of the last ``runs`` whole runs asked for, where
        every one of those runs recorded its asks; else none."""
        if runs <= 0 or len(self.whole_runs) < runs or not self.kernels_since:
            return set()
        since = self.whole_runs[-runs]
        if self.kernels_since > since:
            return set()
        return {k for k in kernels if self.used.get(k, 0.0) < since}

    def forget(self, names: Iterable[str]) -> None:
        """Drop the usage records of ``names`` (artifacts no longer held)."""
        for name in names:
            self.used.pop(name, None)

    def unused_for(self, runs: int, artifacts: Iterable[str]) -> set[str]:
        """Those of ``artifacts`` none of the last ``runs`` updating runs of the whole suite used (no record: used at
        the first run)."""
        if runs <= 0 or len(self.whole_runs) < runs:
            return set()
        since = self.whole_runs[-runs]
        first = min(self.runs[0], self.whole_runs[0]) if self.runs else self.whole_runs[0]
        return {a for a in artifacts if self.used.get(a, first) < since}

    @staticmethod
    def union(parts: Iterable["KeyIndex"]) -> "KeyIndex":
        """All keys, config sets and runs of ``parts``; for each artifact its latest use. Earlier parts win on a key."""
        out = KeyIndex()
        for part in parts:
            out.torch = out.torch or part.torch
            out.configs = {**part.configs, **out.configs}
            out.keys = out.keys.merged(part.keys)
            out.runs = sorted(set(out.runs) | set(part.runs))[-MAX_RUNS:]
            out.whole_runs = sorted(set(out.whole_runs) | set(part.whole_runs))[-MAX_RUNS:]
            out.kernels_since = min(filter(None, (out.kernels_since, part.kernels_since)), default=0.0)
            for name, when in part.used.items():
                out.used[name] = max(out.used.get(name, 0.0), when)
            out.dropped = {**part.dropped, **out.dropped}
        out.dropped = _newest({k: d for k, d in out.dropped.items() if k not in out.keys})
        return out

    def pack(self) -> bytes:
        """The form stored in a bundle: the compressed head, then each group of keys compressed alone."""
        listing, blobs = self.keys.packed()
        data: dict[str, Any] = {"format": FORMAT, "torch": self.torch, "configs": self.configs, "groups": listing,
                                "dictionary": 0, "runs": self.runs, "used": self.used}
        optional = {"dropped": {k: list(d) for k, d in self.dropped.items()}, "whole_runs": self.whole_runs,
                    "kernels_since": self.kernels_since}
        data.update({name: value for name, value in optional.items() if value})
        return b"".join([_deflated(data), *blobs])

    @classmethod
    def unpack(cls, blob: bytes) -> "KeyIndex":
        """The inverse of :meth:`pack`: the head read and checked now, each group of keys when one of its keys is
        asked for; raises :class:`KeyIndexError` on anything malformed."""
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(blob, MAX_UNPACKED)
            data = None if inflater.unconsumed_tail else json.loads(raw.decode("utf-8"))
        except (zlib.error, UnicodeDecodeError, ValueError, RecursionError):
            raise KeyIndexError("the key index is not valid compressed JSON") from None
        if inflater.unconsumed_tail:
            raise KeyIndexError(f"the key index is larger than {MAX_UNPACKED} bytes unpacked")
        if not inflater.eof:
            raise KeyIndexError("the key index is not valid compressed JSON (cut short)")
        version = data.get("format") if isinstance(data, dict) else data
        if version != FORMAT or isinstance(version, bool) or not isinstance(data, dict):
            raise KeyIndexError(f"the key index has an unknown format ({_short(version)})")
        if data.get("dictionary") != 0:  # groups compressed against a preset dictionary, no longer read
            raise KeyIndexError("written by an older version; `--compile-cache-rebuild` writes it anew")
        try:
            return cls(
                torch=_str(data.get("torch", "")),
                configs={_str(c): _components(v) for c, v in _dict(data.get("configs", {})).items()},
                keys=_groups(data.get("groups", []), inflater.unused_data),
                runs=sorted(_number(t) for t in _list(data.get("runs", [])))[-MAX_RUNS:],
                used={_str(a): _number(t) for a, t in _dict(data.get("used", {})).items()},
                dropped=_newest({_str(k): _drop(d) for k, d in _dict(data.get("dropped", {})).items()}),
                whole_runs=sorted(_number(t) for t in _list(data.get("whole_runs", [])))[-MAX_RUNS:],
                kernels_since=_number(data.get("kernels_since", 0.0)),
            )
        except TypeError as exc:
            raise KeyIndexError(f"the key index is malformed: {exc}") from None


def _deflated(data: Any) -> bytes:
    """``data`` as compact JSON, compressed."""
    return zlib.compress(json.dumps(data, sort_keys=True, separators=(",", ":")).encode(), 6)


def _inflated(blob: bytes) -> bytes:
    """The inverse of :func:`_deflated`, capped at :data:`MAX_UNPACKED`; raises :class:`zlib.error` or
    :class:`ValueError` where ``blob`` is not one whole stream of at most that size."""
    inflater = zlib.decompressobj()
    raw = inflater.decompress(blob, MAX_UNPACKED)
    if inflater.unconsumed_tail or not inflater.eof or inflater.unused_data:
        raise ValueError("not one whole stream of at most MAX_UNPACKED bytes")
    return raw


def _groups(listing: Any, rest: bytes) -> Records:
    """The stored records a head lists, their bytes taken from ``rest`` (what follows the head)."""
    stored: dict[str, _Group] = {}
    at = 0
    for item in _list(listing):
        group = _list(item)
        if len(group) != 4 or isinstance(group[2], bool) or not isinstance(group[2], int) or group[2] < 1:
            raise TypeError(f"a group must be [layer, code, size, keys], got {_short(item)}")
        configs = {}
        for pair in _list(group[3]):
            pair = _list(pair)
            if len(pair) != 2:
                raise TypeError(f"a group's key must be [key, config], got {_short(pair)}")
            configs[_str(pair[0])] = _str(pair[1])
        made = _Group(_str(group[0]), _str(group[1]), configs, rest[at:at + group[2]])
        at += group[2]
        stored.update(dict.fromkeys(configs, made))
    if at != len(rest):
        raise TypeError("the groups do not add up to the bytes that follow the head")
    return Records(stored)


def _newest(dropped: dict[str, tuple[str, float]]) -> dict[str, tuple[str, float]]:
    if len(dropped) <= MAX_DROPPED:
        return dropped
    return dict(sorted(dropped.items(), key=lambda item: -item[1][1])[:MAX_DROPPED])


def _drop(value: Any) -> tuple[str, float]:
    pair = _list(value)
    if len(pair) != 2:
        raise TypeError(f"a dropped key must be [why, when], got {_short(value)}")
    return _str(pair[0]), _number(pair[1])


def _short(value: Any) -> str:
    return repr(value)[:40]


def _typed(kind: type[T], what: str) -> Callable[[Any], T]:
    def check(value: Any) -> T:
        if not isinstance(value, kind):
            raise TypeError(f"expected {what}, got {_short(value)}")
        return value

    return check


_str = _typed(str, "a string")
_dict = _typed(dict, "an object")
_list = _typed(list, "a list")


def finite(value: Any) -> bool:
    """Whether ``value`` is a JSON number a float can hold (not NaN, infinite, boolean or too large)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and abs(value) <= sys.float_info.max  # compared exactly: an int too large for a float is refused


def _number(value: Any) -> float:
    if not finite(value):
        kind = "a finite number" if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
        raise TypeError(f"expected {kind}, got {_short(value)}")
    return float(value)


def _components(value: Any) -> dict[str, list[str]]:
    out = {}
    for name, pair in _dict(value).items():
        pair = _list(pair)
        if len(pair) != 2:
            raise TypeError(f"component {_short(name)} must be [hash, text]")
        out[_str(name)] = [_str(pair[0]), _str(pair[1])]
    return out
