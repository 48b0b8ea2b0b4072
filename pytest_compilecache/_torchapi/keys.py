"""The components of every FX graph and AOTAutograd cache key this process computes, and why its lookups missed.

torch builds each key from a list of components and can print them as debug lines
(``compiled_fx_graph_hash`` always returns them; ``autograd_cache_key`` only while its logger is at
DEBUG). Both functions are wrapped: when a key has no entry in the current cache folder (a miss
is coming), its components are parsed and recorded in this process's :class:`KeyIndex` (so that a
saved bundle can carry them), and, while explaining is on, the miss is explained against the
bundle's index and this process's earlier keys (:mod:`..explain`). A key whose folder exists
costs one ``os.path.exists``; nothing more is done for hits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import sys
import threading
from collections import Counter
from typing import Any, Callable, Iterable, Iterator

from . import loglevels
from ..bundle.keyindex import KeyIndex
from ..explain import Explanation, Known, explain
from ..stats import EXPLANATION, MISS_KIND

FROM_BUNDLE_AOT = "aot_autograd.from_bundle"
FROM_BUNDLE_AUTOTUNE = "autotune.from_bundle"

_LINE = re.compile(r"^\[([A-Za-z0-9]+)\] ([^\s:\[]+(?:\[[^\]]*\])?): (.*)$", re.DOTALL)
_TRACE = re.compile(r'File "([^"]+)", line \d+, in (\S+)')

_lock = threading.RLock()
_recorded = KeyIndex()
_counts: Counter[str] = Counter()
_explaining = 0
#: Whether the current cache folder was filled from the loaded bundle (False inside an empty cache).
_filled_from_bundle = True
_bundle: Known | None = None
_cannot = ""
#: The loaded bundle's name and the function that unpacks its key index, until first needed.
_unpacked: tuple[str, Callable[[], tuple[KeyIndex | None, int, str]]] | None = None
#: AOTAutograd keys whose entries the loaded bundle put into cache folders.
_bundle_aot_keys: frozenset[str] = frozenset()
#: The loaded bundle's autotune results, by their place in a cache folder (``<xx>/<name>.best_config``).
_bundle_autotune_keys: frozenset[str] = frozenset()


def wrap_fx_hash(original: Callable[..., Any]) -> Callable[..., Any]:
    """``codecache.compiled_fx_graph_hash``, recording the components of each key that will miss."""
    import importlib

    _recorded.torch = str(getattr(sys.modules.get("torch"), "__version__", ""))
    codecache = importlib.import_module("torch._inductor.codecache")
    return _wrap_fx(original, _folder_of(getattr(codecache, "FxGraphCache", None)))


def wrap_aot_key(original: Callable[..., Any]) -> Callable[..., Any]:
    """``autograd_cache_key``, recording the components of each key that will miss."""
    import importlib

    autograd_cache = importlib.import_module("torch._functorch._aot_autograd.autograd_cache")
    logger = logging.getLogger(autograd_cache.__name__)
    return _wrap_aot(original, _folder_of(getattr(autograd_cache, "AOTAutogradCache", None)), logger)


def _folder_of(cache_class: Any) -> Callable[[str], str | None]:
    def folder(key: str) -> str | None:
        finder = getattr(cache_class, "_get_tmp_dir_for_key", None)  # at call time: it may be wrapped later
        base = getattr(cache_class, "_get_tmp_dir", None)  # torch 2.7's AOTAutograd cache has only this
        try:
            if finder is not None:
                return str(finder(key))
            return os.path.join(str(base()), key) if base is not None else None
        except Exception:
            return None

    return folder


def _missing(folder: Callable[[str], str | None], key: str) -> bool:
    """Whether the current cache folder has no entry under ``key`` (unknown counts as missing)."""
    path = folder(key)
    return path is None or not os.path.exists(path)


def _wrap_fx(original: Callable[..., Any], folder: Callable[[str], str | None]) -> Callable[..., Any]:
    def hashed(gm: Any, *args: Any, **kwargs: Any) -> Any:
        key, lines = original(gm, *args, **kwargs)
        with contextlib.suppress(Exception):
            if _missing(folder, key):
                _seen("fx_graph", key, gm, lines)
        return key, lines

    return hashed


def _wrap_aot(original: Callable[..., Any], folder: Callable[[str], str | None],
              logger: logging.Logger) -> Callable[..., Any]:
    def keyed(*args: Any, **kwargs: Any) -> Any:
        key, lines = original(*args, **kwargs)
        with contextlib.suppress(Exception):
            if key in _bundle_aot_keys and not _missing(folder, key):
                with _lock:
                    _counts[FROM_BUNDLE_AOT] += 1
            elif _missing(folder, key):
                if not lines:
                    lines = _debug_lines(original, logger, args, kwargs)
                gm = args[0] if args else kwargs.get("mod")
                _seen("aot_autograd", key, getattr(gm, "gm", gm), lines, _functorch_config())
        return key, lines

    return keyed


def _debug_lines(original: Callable[..., Any], logger: logging.Logger, args: Any, kwargs: Any) -> list[str]:
    """The key's components, from torch computing the key again with its logger at DEBUG (printing nothing)."""
    silent = logging.Filter("\0")
    logger.addFilter(silent)
    try:
        with loglevels.lowered(logger, logging.DEBUG):
            _, lines = original(*args, **kwargs)
    finally:
        logger.removeFilter(silent)
    return list(lines or [])


def _functorch_config() -> dict[str, tuple[str, str]]:
    """functorch's config values (hashed into AOTAutograd keys as one opaque blob), one component each."""
    try:
        from torch._functorch import config

        values = config.save_config_portable()
    except Exception:
        return {}
    out = {}
    for name, value in values.items():
        text = repr(value)
        out[f"functorch_config[{name}]"] = (hashlib.sha256(text.encode()).hexdigest()[:20], text)
    return out


def parse(lines: list[str]) -> dict[str, tuple[str, str]]:
    """``{component: (hash, text)}`` from torch's debug lines (``[hash] name: text``)."""
    out = {}
    for line in lines:
        match = _LINE.match(str(line))
        if match:
            out[match.group(2)] = (match.group(1), match.group(3))
    return out


def code_of(gm: Any) -> str:
    """What Dynamo compiled: ``function (file)`` from the first node with a stack trace into user
    code, else ``the Module module`` from the outermost module a node came from."""
    nodes = list(getattr(getattr(gm, "graph", None), "nodes", ()))
    for node in nodes:
        trace = getattr(node, "meta", {}).get("stack_trace")
        match = _TRACE.search(trace) if isinstance(trace, str) else None
        if match:
            return f"{match.group(2)} ({os.path.basename(match.group(1))})"
    for node in nodes:
        stack = getattr(node, "meta", {}).get("nn_module_stack")
        if isinstance(stack, dict) and stack:
            first = next(iter(stack.values()))
            kind = first[1] if isinstance(first, tuple) and len(first) > 1 else first
            name = getattr(kind, "__qualname__", None) or str(kind).rsplit(".", 1)[-1].strip("'>")
            return f"the {name} module"
    return "unknown code"


def _seen(layer: str, key: str, gm: Any, lines: list[str], extra: dict[str, tuple[str, str]] | None = None) -> None:
    """A key with no entry in the current cache folder: explain it (while explaining), then record it."""
    components = {**parse(lines), **(extra or {})}
    code = code_of(gm)
    with _lock:
        if _explaining:
            loaded = _loaded_bundle()
            bundle = dataclasses.replace(loaded, fills=_filled_from_bundle) if loaded is not None else None
            known = [*([bundle] if bundle is not None else []), Known("this session's earlier compiles", _recorded)]
            found = explain(layer, key, code, components, known, "" if loaded is not None else _cannot,
                            starts_empty=not _filled_from_bundle)
            _count(layer, found)
        if components:
            _recorded.add(key, layer, code, components)


def _count(layer: str, found: Explanation) -> None:
    _counts[f"{layer}{EXPLANATION}{found.text}"] += 1
    for kind in found.kinds:
        _counts[f"{layer}{MISS_KIND}{kind}"] += 1


def counts() -> dict[str, int]:
    """Explanations so far, as flat counts: ``<layer>.explanation/<text>`` and ``<layer>.miss_kind/<kind>``."""
    with _lock:
        return dict(_counts)


@contextlib.contextmanager
def empty_folder() -> Iterator[None]:
    """Inside, the cache folder starts empty (``cold_cache``, per-test isolation): an entry the bundle
    holds is not expected in it, so a miss of one is explained as for any other source."""
    global _filled_from_bundle
    with _lock:
        before, _filled_from_bundle = _filled_from_bundle, False
    try:
        yield
    finally:
        with _lock:
            _filled_from_bundle = before


@contextlib.contextmanager
def explaining() -> Iterator[None]:
    """Explain every FX graph and AOTAutograd miss inside."""
    global _explaining
    with _lock:
        _explaining += 1
    try:
        yield
    finally:
        with _lock:
            _explaining -= 1


def use_bundle_index(name: str, unpacked: Callable[[], tuple[KeyIndex | None, int, str]] | None = None,
                     cannot: str = "") -> None:
    """Explain misses against the loaded bundle's key index, which ``unpacked`` gives the first time a
    miss or a save needs it (the index, how many of the bundle's keys it does not document, and why
    there is none); without ``unpacked``, say ``cannot``."""
    global _bundle, _cannot, _unpacked
    with _lock:
        _bundle, _cannot, _unpacked = None, cannot, (name, unpacked) if unpacked is not None else None


def unpack_bundle_index() -> None:
    """Unpack the loaded bundle's key index now, not when first needed (a strict session checks
    everything about its bundle before its first test)."""
    with _lock:
        _loaded_bundle()


def _loaded_bundle() -> Known | None:
    """The loaded bundle's key index, unpacked now if not yet; call with ``_lock`` held."""
    global _bundle, _cannot, _unpacked
    if _unpacked is not None:
        (name, unpacked), _unpacked = _unpacked, None
        try:
            index, undocumented, _cannot = unpacked()
        except Exception as exc:  # never fail the compile that asked for an explanation
            index, undocumented, _cannot = None, 0, f"the bundle's key details could not be read: {exc}"
        _bundle = Known(name, index, undocumented, fills=True) if index is not None else None
    return _bundle


def note_bundle_keys(aot_keys: Iterable[str], autotune_keys: Iterable[str] = ()) -> None:
    """The AOTAutograd keys and autotune results the loaded bundle holds: a lookup that finds one of them
    in a cache folder filled from the bundle counts as ``from_bundle`` (torch counts FX graphs from a
    bundle, not AOTAutograd entries or autotune results)."""
    global _bundle_aot_keys, _bundle_autotune_keys
    with _lock:
        _bundle_aot_keys = frozenset(aot_keys)
        _bundle_autotune_keys = frozenset(os.path.normpath(k) for k in autotune_keys)


def autotune_from_bundle(path: str) -> None:
    """An autotune lookup found its result at ``path``: count it as ``autotune.from_bundle`` where the
    loaded bundle put that result there (a folder filled from the bundle, the result's place one of its)."""
    tail = os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))
    with _lock:
        if _filled_from_bundle and tail in _bundle_autotune_keys:
            _counts[FROM_BUNDLE_AUTOTUNE] += 1


def index_of(wanted: Iterable[str]) -> KeyIndex:
    """What this process knows about the artifact keys ``wanted``: the components it recorded for
    them, or those the loaded bundle's index holds."""
    wanted = set(wanted)
    with _lock:
        loaded = _loaded_bundle()
        known = [_recorded, *([loaded.index] if loaded is not None else [])]
        return KeyIndex.union(known).restricted(wanted)
