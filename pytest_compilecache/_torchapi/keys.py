"""The components of every FX graph and AOTAutograd cache key that is about to miss, as torch computes it.

torch builds each key from a list of components and can print them as debug lines
(``compiled_fx_graph_hash`` always returns them; ``autograd_cache_key`` only while its logger is at
DEBUG). Both functions are wrapped: when a key has no entry in the current cache folder (a miss is
coming), its components are parsed and handed, as a :class:`Miss`, to the listener the plugin set
(:func:`report_misses_to`: recording and explaining live above this package). A key whose folder
exists costs one ``os.path.exists``; nothing more is done for hits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import threading
from collections import Counter
from typing import Any, Callable, Iterable, Iterator

from . import loglevels

FROM_BUNDLE_AOT = "aot_autograd.from_bundle"
FROM_BUNDLE_AUTOTUNE = "autotune.from_bundle"

_LINE = re.compile(r"^\[([A-Za-z0-9]+)\] ([^\s:\[]+(?:\[[^\]]*\])?): (.*)$", re.DOTALL)
_TRACE = re.compile(r'File "([^"]+)", line \d+, in (\S+)')



@dataclasses.dataclass(frozen=True)
class Miss:
    """A lookup about to miss: its ``layer`` (``fx_graph``, ``aot_autograd``), ``key``, the ``code``
    Dynamo compiled (:func:`code_of`), the key's ``components`` (``{name: (hash, text)}``) and whether
    the cache folder started empty by design (:func:`empty_folder`)."""

    layer: str
    key: str
    code: str
    components: dict[str, tuple[str, str]]
    starts_empty: bool


_lock = threading.RLock()
_counts: Counter[str] = Counter()
#: Given each :class:`Miss`, answers the names of the counts it adds (see :func:`report_misses_to`).
_listener: Callable[[Miss], Iterable[str]] | None = None
#: Whether the current cache folder was filled from the loaded bundle (False inside an empty cache).
_filled_from_bundle = True
#: AOTAutograd keys whose entries the loaded bundle put into cache folders.
_bundle_aot_keys: frozenset[str] = frozenset()
#: The loaded bundle's autotune results, by their place in a cache folder (``<xx>/<name>.best_config``).
_bundle_autotune_keys: frozenset[str] = frozenset()


def wrap_fx_hash(original: Callable[..., Any]) -> Callable[..., Any]:
    """``codecache.compiled_fx_graph_hash``, reporting the components of each key that will miss."""
    import importlib

    codecache = importlib.import_module("torch._inductor.codecache")
    return _wrap_fx(original, _folder_of(getattr(codecache, "FxGraphCache", None)))


def wrap_aot_key(original: Callable[..., Any]) -> Callable[..., Any]:
    """``autograd_cache_key``, reporting the components of each key that will miss."""
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
    """A key with no entry in the current cache folder: hand it to the listener, and count what it answers."""
    with _lock:
        if _listener is None:
            return
        miss = Miss(layer, key, code_of(gm), {**parse(lines), **(extra or {})}, not _filled_from_bundle)
        _counts.update(_listener(miss))


def report_misses_to(listener: Callable[[Miss], Iterable[str]] | None) -> None:
    """From now on, hand every lookup about to miss to ``listener``, which answers the names of the
    counts it adds (as :func:`counts` gives them back; an explanation's, say); ``None``: to nobody."""
    global _listener
    with _lock:
        _listener = listener


def counts() -> dict[str, int]:
    """What was counted so far: lookups found in a folder the bundle filled, and what the listener answered."""
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
