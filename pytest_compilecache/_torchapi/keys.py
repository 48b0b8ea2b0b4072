"""The components of every FX graph and AOTAutograd cache key about to miss (no entry in the current cache
folder), as torch computes them, handed as a :class:`Miss` to the listener the plugin set (:func:`report_misses_to`);
a hit costs one ``os.path.exists``."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import logging
import os
import re
import threading
from typing import Any, Callable, Iterable, Iterator

from ..caught import caught
from . import counters, loglevels

_LINE = re.compile(r"^\[([A-Za-z0-9]+)\] ([^\s:\[]+(?:\[[^\]]*\])?): (.*)$", re.DOTALL)
_TRACE = re.compile(r'File "([^"]+)", line \d+, in (\S+)')


@dataclasses.dataclass(frozen=True)
class Miss:
    """A lookup about to miss: its ``layer``, ``key``, the ``code`` Dynamo compiled (:func:`code_of`), the key's
    ``components`` (``{name: (hash, text)}``) and whether the cache folder started empty by design."""

    layer: str
    key: str
    code: str
    components: dict[str, tuple[str, str]]
    starts_empty: bool


_lock = threading.RLock()
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
    codecache = importlib.import_module("torch._inductor.codecache")
    missing = _missing_in(getattr(codecache, "FxGraphCache", None))

    def hashed(gm: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(gm, *args, **kwargs)
        key, lines = result
        if missing(key):
            _seen("fx_graph", key, gm, lines)
        return result

    return hashed


def wrap_aot_key(original: Callable[..., Any]) -> Callable[..., Any]:
    """``autograd_cache_key``, reporting the components of each key that will miss."""
    autograd_cache = importlib.import_module("torch._functorch._aot_autograd.autograd_cache")
    logger = logging.getLogger(autograd_cache.__name__)
    missing = _missing_in(getattr(autograd_cache, "AOTAutogradCache", None))

    def keyed(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        key, lines = result
        if key in _bundle_aot_keys and not missing(key):
            counters.count("aot_autograd.from_bundle")
        elif missing(key):
            if not lines:
                lines = _debug_lines(original, logger, args, kwargs)
            gm = args[0] if args else kwargs.get("mod")
            _seen("aot_autograd", key, getattr(gm, "gm", gm), lines, _functorch_config())
        return result

    return keyed


def _missing_in(cache_class: Any) -> Callable[[str], bool]:
    """Whether the current cache folder of ``cache_class`` has no entry under a key (unknown counts as missing)."""
    def missing(key: str) -> bool:
        finder = getattr(cache_class, "_get_tmp_dir_for_key", None)  # at call time: it may be wrapped later
        base = getattr(cache_class, "_get_tmp_dir", None)  # torch 2.7's AOTAutograd cache has only this
        try:
            if finder is not None:
                return not os.path.exists(str(finder(key)))
            return base is None or not os.path.exists(os.path.join(str(base()), key))
        except Exception as exc:  # taken as a miss: its key details are kept
            caught("asking torch whether an AOTAutograd key is cached", exc)
            return True

    return missing


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
    except Exception as exc:  # the AOTAutograd key's explanation lacks functorch's config values
        caught("reading functorch's config for a key's details", exc)
        return {}
    texts = {f"functorch_config[{name}]": repr(value) for name, value in values.items()}
    return {name: (hashlib.sha256(text.encode()).hexdigest()[:20], text) for name, text in texts.items()}


def parse(lines: list[str]) -> dict[str, tuple[str, str]]:
    """``{component: (hash, text)}`` from torch's debug lines (``[hash] name: text``)."""
    matches = (_LINE.match(str(line)) for line in lines)
    return {match.group(2): (match.group(1), match.group(3)) for match in matches if match}


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
        for name in _listener(miss):
            counters.count(name)


def report_misses_to(listener: Callable[[Miss], Iterable[str]] | None) -> None:
    """From now on, hand every lookup about to miss to ``listener`` (``None``: to nobody), which answers the
    names of the counts it adds (as ``counters.read_counts`` gives them back)."""
    global _listener
    with _lock:
        _listener = listener


@contextlib.contextmanager
def empty_folder() -> Iterator[None]:
    """Inside, the cache folder starts empty (``cold_cache``, isolation): a miss of a bundle's entry is explained."""
    global _filled_from_bundle
    with _lock:
        before, _filled_from_bundle = _filled_from_bundle, False
    try:
        yield
    finally:
        with _lock:
            _filled_from_bundle = before


def note_bundle_keys(aot_keys: Iterable[str], autotune_keys: Iterable[str] = ()) -> None:
    """The AOTAutograd keys and autotune results the loaded bundle holds: found in a folder filled from the
    bundle, they count as ``from_bundle`` (torch counts that for FX graphs only)."""
    global _bundle_aot_keys, _bundle_autotune_keys
    with _lock:
        _bundle_aot_keys = frozenset(aot_keys)
        _bundle_autotune_keys = frozenset(os.path.normpath(k) for k in autotune_keys)


def autotune_from_bundle(path: str) -> None:
    """Count an autotune result found at ``path`` as ``autotune.from_bundle`` where the loaded bundle put it."""
    tail = os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))
    with _lock:
        if _filled_from_bundle and tail in _bundle_autotune_keys:
            counters.count("autotune.from_bundle")
