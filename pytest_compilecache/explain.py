"""Why a cache lookup missed: the nearest known entry for the same code, and the key components that differ, in words.
This module never imports torch."""

from __future__ import annotations

import difflib
import re
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from .bundle.keyindex import KeyIndex, KeyIndexError

#: Differences named one by one in an explanation; the rest are counted.
SHOWN = 4
_TENSOR_FIELDS = ("dtype", "shape", "stride", "device", "layout", "requires_grad", "storage_offset", "is_coalesced")
_FIELD = re.compile(r"(\w+)=((?:torch\.Size\(\[[^\]]*\]\))|(?:\([^()]*\))|(?:device\([^()]*\))|[^,()]+)")
_INPUT = re.compile(r"^example_inputs\[(\d+)\]$")
_CONFIG = re.compile(r"^(inductor_config|inductor_config_comms|functorch_config)\[(.+)\]$")
_KWARG = re.compile(r"^fx_kwargs\[(.+)\]$")
_CODE_NOISE = re.compile(r";\s+[\w, ]+= None$")
_SYMBOL = re.compile(r"\b[su]\d+\b")
_SIZE = re.compile(r"torch\.Size\((\[.*\])\)")
_LAYER_NAMES = {"fx_graph": "FX graph", "aot_autograd": "AOTAutograd"}


@dataclass(frozen=True)
class Explanation:
    """One miss explained: ``text`` for people, ``kinds`` (short, countable) for the summary."""

    text: str
    kinds: tuple[str, ...]


@dataclass(frozen=True)
class Known:
    """A place entries are known from (the bundle, or this session's earlier compiles); ``fills``: the lookup's
    folder was filled from it; ``damaged``: the keys whose entries were found damaged when read (left out)."""

    name: str
    index: KeyIndex
    undocumented: int = 0
    fills: bool = False
    damaged: frozenset[str] = frozenset()


def explain(layer: str, key: str, code: str, components: Mapping[str, tuple[str, str]],
            known: Sequence[Known], cannot: str = "", starts_empty: bool = False) -> Explanation:
    """Why ``key`` (of ``layer``, compiled from ``code``) missed, against the entries ``known`` holds (``cannot``:
    said when none can explain). Entries of the same code sharing no graph node with it are new code: not compared."""
    where = f"{_LAYER_NAMES.get(layer, layer)} miss in {code or 'unknown code'}"
    holder = next((s for s in known if key in s.index.keys), None)
    if starts_empty and holder is not None:
        return Explanation(f"{where}: this cache starts empty by design (cold_cache, --compile-cache-isolate); "
                           f"{holder.name} holds this very entry", ("cache starts empty",))
    for source in known:
        if not starts_empty and key in source.index.dropped:
            why, when = source.index.dropped[key]
            day = time.strftime("%Y-%m-%d", time.gmtime(when))
            return Explanation(f"{where}: {source.name} held this very entry until {why} dropped it ({day}); "
                               "an updating run (--compile-cache-update) saves it again", ("dropped from the bundle",))
        if source.fills and key in source.damaged:
            return Explanation(f"{where}: {source.name} holds this very entry, but damaged: it was left out, and "
                               "torch compiled it again", ("entry damaged in the bundle",))
        if source.fills and key in source.index.keys:
            return Explanation(f"{where}: {source.name} holds an entry with this very key, but it was not in "
                               "the cache folder of this lookup", ("entry not in the cache folder",))
    ours = set(_graph_lines(components.get("gm", ("", ""))[1]))
    why_not, scored = [], []  # why_not: why it cannot explain
    for source, other in ((s, k) for s in known for k in s.index.of_code(layer, code) if k != key):
        try:
            theirs = source.index.components(other)
        except KeyIndexError as exc:
            why_not.append(f"{source.name}: {exc}")
            continue
        their_lines = set(_graph_lines(theirs.get("gm", ("", ""))[1]))
        if ours and their_lines and not ours & their_lines:  # sharing no graph node: new code
            continue
        reasons, differing = _reasons(theirs, components), _differing(theirs, components)
        # Sizes made symbolic count as one difference; on a tie, an entry differing in input shapes alone loses to
        # the dynamic one (compiled for every shape, not another one); then the fewest differing components win.
        shapes_only = _dynamic(theirs) == _dynamic(components) and all(_INPUT.match(n) for n in differing)
        scored.append((len(reasons), shapes_only, len(differing), source.name, other, reasons))
    if not scored:
        blind = ", ".join(f"{s.name} holds {s.undocumented} entries without key details" for s in known
                          if s.undocumented)
        if cannot and not any(s.index.of_layer(layer) for s in known):
            why_not.append(cannot)
        elif blind:
            why_not.append(f"no entry with key details for this code ({blind})")
        if why_not:
            return Explanation(f"{where}: cannot explain: {why_not[0]}", ("cannot explain",))
        if starts_empty:
            return Explanation(f"{where}: this cache starts empty by design (cold_cache, --compile-cache-isolate), "
                               "and no compile before it in this session was of this code", ("cache starts empty",))
        filler = next((s.name for s in known if s.fills), "")
        held = (f"; {filler} holds none: an updating run (--compile-cache-update, or --compile-cache-rebuild) runs "
                "the warmup hook and adds what it and the tests compile") if filler else ""
        return Explanation(f"{where}: no entry for this code at all (new code){held}", ("new code",))
    _, _, _, source_name, nearest, reasons = min(scored, key=lambda s: s[:3])
    more = f"; and {len(reasons) - SHOWN} more differences" if len(reasons) > SHOWN else ""
    text = (f"{where}: nearest entry in {source_name} ({nearest[:12]}...) differs: "
            + "; ".join(r.text for r in reasons[:SHOWN]) + more)
    kinds = tuple(dict.fromkeys(k for r in reasons for k in r.kinds)) or ("no component differs",)
    return Explanation(text, kinds)


def _differing(theirs: Mapping[str, tuple[str, str]], ours: Mapping[str, tuple[str, str]]) -> list[str]:
    return [n for n in dict.fromkeys([*ours, *theirs]) if theirs.get(n, ("", ""))[0] != ours.get(n, ("", ""))[0]]


def _dynamic(components: Mapping[str, tuple[str, str]]) -> bool:
    """Whether a key's inputs have symbolic sizes (``s33``, ``u0``): a graph compiled for dynamic shapes."""
    return any(_INPUT.match(name) and _SYMBOL.search(value[1]) for name, value in components.items())


_ENTRY_DYNAMIC = Explanation(
    "the entry has dynamic (symbolic) sizes and this compile static ones: Dynamo recompiled this code "
    "with symbolic sizes after it met other shapes earlier in the run that built the entry (automatic "
    "dynamic shapes, e.g. a warmup that ran two models through one forward); mark the dimension dynamic "
    "here too (torch._dynamo.mark_dynamic, or torch.compile(dynamic=True)), or warm up each model "
    "through a code object of its own", ("static sizes, the entry dynamic",))
_ENTRY_STATIC = Explanation(
    "this compile has dynamic (symbolic) sizes and the entry static ones: Dynamo recompiled this code with "
    "symbolic sizes after it met other shapes earlier in this run, while the entry was compiled for one "
    "shape; warm up with the same sequence of shapes, or mark the dimension dynamic in both",
    ("dynamic sizes, the entry static",))


def _reasons(theirs: Mapping[str, tuple[str, str]], ours: Mapping[str, tuple[str, str]]) -> list[Explanation]:
    names = _differing(theirs, ours)
    if _dynamic(theirs) != _dynamic(ours):
        # Inputs, graph and AOT config all follow from the sizes becoming symbolic: say that, and the rest.
        rest = [n for n in names if not _INPUT.match(n) and n not in ("gm", "aot_config")]
        return [_ENTRY_DYNAMIC if _dynamic(theirs) else _ENTRY_STATIC,
                *(_reason(n, theirs.get(n), ours.get(n)) for n in rest)]
    if any(n.startswith("functorch_config[") for n in names):
        names = [n for n in names if n != "autograd_config"]
    inputs = [n for n in names if _INPUT.match(n)]
    out = [_reason(n, theirs.get(n), ours.get(n)) for n in names if not _INPUT.match(n)]
    if inputs:
        out.insert(0, _inputs(inputs, theirs, ours))
    return sorted(out, key=lambda r: "graph changed" not in r.kinds)  # the graph's change first


def _value(pair: tuple[str, str] | None) -> str:
    return "(absent)" if pair is None else pair[1]


def _reason(name: str, theirs: tuple[str, str] | None, ours: tuple[str, str] | None) -> Explanation:
    was, now = _value(theirs), _value(ours)
    if name == "gm":
        return Explanation(f"the graph changed ({_graph_diff(was, now)})", ("graph changed",))
    if name == "torch_version":
        return Explanation("the torch build differs (torch hashes its own source files into every key)",
                           ("torch build changed",))
    if name.startswith("system_info"):
        return Explanation("torch, Triton, CUDA or GPU versions differ (system_info)",
                           ("torch/Triton/CUDA/GPU version changed",))
    if config := _CONFIG.match(name):
        family = "functorch config" if config.group(1) == "functorch_config" else "config"
        what = f"{family} `{config.group(2)}` changed"
    elif kwarg := _KWARG.match(name):
        what = f"compile option `{kwarg.group(1)}` changed"
    elif name == "cache_key_tag":
        what, was, now = "cache_key_tag changed", repr(was), repr(now)
    else:
        what, was, now = f"`{name}` changed", _brief(was), _brief(now)
    return Explanation(f"{what} (was {was}, now {now})", (what,))


def _brief(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _inputs(names: list[str], theirs: Mapping[str, tuple[str, str]], ours: Mapping[str, tuple[str, str]]) -> Explanation:
    count_then, count_now = (sum(1 for n in side if _INPUT.match(n)) for side in (theirs, ours))
    if count_then != count_now:
        return Explanation(f"the graph takes {count_now} inputs, the entry {count_then}", ("inputs changed",))
    parts, kinds = [], []
    for index, name in sorted((int(m.group(1)), n) for n in names if (m := _INPUT.match(n))):
        was, now = ({f.group(1): _SIZE.sub(r"\1", f.group(2).strip())  # torch.Size([2, 3]) said [2, 3]
                     for f in _FIELD.finditer(_value(side.get(name)))} for side in (theirs, ours))
        fields = [f for f in _TENSOR_FIELDS if was.get(f) != now.get(f) and (f in was or f in now)]
        if not fields:
            parts.append(f"input {index} (was {_brief(_value(theirs.get(name)))}, now {_brief(_value(ours.get(name)))})")
            kinds.append("input changed")
            continue
        for f in fields:
            parts.append(f"input {index} {f} {was.get(f, '?')} -> {now.get(f, '?')}")
            kinds.append(f"input {f}s changed" if not f.endswith("s") else f"input {f} changed")
    return Explanation("; ".join(parts), tuple(dict.fromkeys(kinds)))


def _graph_lines(text: str) -> list[str]:
    lines = [line.strip() for line in text.replace("\\n", "\n").splitlines()]
    return [_CODE_NOISE.sub("", line) for line in lines if "=" in line and not line.startswith(("def ", "return"))]


def _graph_diff(was: str, now: str) -> str:
    diff = list(difflib.ndiff(_graph_lines(was), _graph_lines(now)))
    parts = []
    for label, sign in (("only in the entry", "- "), ("only now", "+ ")):
        lines = [line[2:] for line in diff if line.startswith(sign)]
        if lines:
            parts.append(f"{label}: " + ", ".join(f"`{_brief(line, 80)}`" for line in lines[:2])
                         + (f" and {len(lines) - 2} more" if len(lines) > 2 else ""))
    return "; ".join(parts) or "the same nodes, other details"
