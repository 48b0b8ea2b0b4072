"""What this process learns from the misses ``_torchapi.keys`` hands up: each key's components, kept for the
bundle's key index, and, while explaining, why each missed (:mod:`.explain`). It never imports torch."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from typing import Callable, Iterator

from ._torchapi import artifact_identities
from ._torchapi import keys as torch_keys
from .bundle.keyindex import KeyIndex
from .explain import Known, explain
from .stats import EXPLANATION, MISS_KIND

_lock = threading.RLock()
_recorded = KeyIndex()
_explaining = 0
_bundle: Known | None = None
_cannot = ""
#: The loaded bundle's damaged entries found so far (``{key: bundle, member and why}``), and the keys that missed
#: because of it, in order.
_damaged: dict[str, str] = {}
_ran_without: list[tuple[str, str]] = []
#: The loaded bundle's name and the function that unpacks its key index, until first needed.
_unpacked: tuple[str, Callable[[], tuple[KeyIndex | None, int, str]]] | None = None


def _seen(miss: torch_keys.Miss) -> list[str]:
    """Explain ``miss`` (while explaining), then record its components; the counts its explanation adds."""
    added = []
    with _lock:
        if miss.key in _damaged and not miss.starts_empty:
            _ran_without.append((miss.key, _damaged[miss.key]))  # kept with its reason: a reload forgets _damaged
        if _explaining:
            loaded = unpack_bundle_index()
            known = [dataclasses.replace(loaded, fills=not miss.starts_empty, damaged=frozenset(_damaged))
                     ] if loaded is not None else []
            found = explain(miss.layer, miss.key, miss.code, miss.components,
                            [*known, Known("this session's earlier compiles", _recorded)],
                            "" if loaded is not None else _cannot, starts_empty=miss.starts_empty)
            added = [f"{miss.layer}{EXPLANATION}{found.text}", *(f"{miss.layer}{MISS_KIND}{k}" for k in found.kinds)]
        if miss.components:
            _recorded.torch = _recorded.torch or str(getattr(sys.modules.get("torch"), "__version__", ""))
            _recorded.add(miss.key, miss.layer, miss.code, miss.components)
    return added


torch_keys.report_misses_to(_seen)


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


def left_out_damaged(key: str, why: str) -> None:
    """The loaded bundle's entry under ``key`` is damaged (``why``: the bundle, the member and why), and left out."""
    with _lock:
        _damaged[key] = why


def ran_without_damaged() -> list[tuple[str, str]]:
    """``(key, why)`` of every lookup so far that missed because the bundle's entry was damaged, in order."""
    with _lock:
        return list(_ran_without)


def use_bundle_index(name: str, unpacked: Callable[[], tuple[KeyIndex | None, int, str]] | None = None,
                     cannot: str = "") -> None:
    """Explain misses against the loaded bundle's key index, which ``unpacked`` gives when first needed (the index,
    how many of the bundle's keys it does not document, and why there is none); without ``unpacked``, say ``cannot``."""
    global _bundle, _unpacked
    with _lock:
        _bundle, _unpacked = None, (name, unpacked or (lambda: (None, 0, cannot)))
        _damaged.clear()


def unpack_bundle_index() -> Known | None:
    """The loaded bundle's key index, unpacked now if not yet (a strict session checks it before any test)."""
    global _bundle, _cannot, _unpacked
    with _lock:
        if _unpacked is not None:
            (name, unpacked), _unpacked = _unpacked, None
            try:
                index, undocumented, _cannot = unpacked()
            except Exception as exc:  # never fail the compile that asked for an explanation
                index, undocumented, _cannot = None, 0, f"the bundle's key details could not be read: {exc}"
            _bundle = Known(name, index, undocumented, fills=True) if index is not None else None
        return _bundle


def index_for(payload: bytes) -> KeyIndex:
    """The components this process recorded, or the loaded bundle's index holds, for the keys in Mega-Cache bytes."""
    wanted = {key for _, key, _ in artifact_identities(payload)}
    with _lock:
        loaded = unpack_bundle_index()
        return KeyIndex.union([_recorded, *([loaded.index] if loaded is not None else [])]).restricted(wanted)
