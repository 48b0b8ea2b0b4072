"""Mega-Cache bytes: recording, saving, loading, describing and merging them through torch."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import re
import time
from typing import Any, Iterable, Iterator

from ..caught import caught
from ..environment import SavedEnv, point_cache_dirs_at
from .core import torch_module
from .isolation import bootstrap


class MegaCacheError(RuntimeError):
    """torch could not read, load or write Mega-Cache bytes."""


def _manager() -> Any:
    bootstrap()
    from torch.compiler._cache import CacheArtifactManager

    return CacheArtifactManager


def fresh_recording() -> Any:
    """Context manager: artifacts recorded inside go to a collection of their own (torch 2.7 through
    the register's backport of ``with_fresh_cache``; where neither is there, to the process's one)."""
    fresh = getattr(_manager(), "with_fresh_cache", None)
    return fresh() if fresh is not None else contextlib.nullcontext()


def backport_fresh_cache(_: None) -> Any:
    """``CacheArtifactManager.with_fresh_cache`` for torch 2.7: its four collections swapped for empty ones inside."""
    from torch.compiler._cache import CacheArtifact, CacheInfo
    from torch.utils._appending_byte_serializer import AppendingByteSerializer
    from torch.utils._ordered_set import OrderedSet

    names = ("_new_cache_artifacts", "_seen_artifacts", "_serializer", "_cache_info")

    @contextlib.contextmanager
    def with_fresh_cache(cls: Any) -> Iterator[None]:
        saved = [getattr(cls, name) for name in names]
        serializer = AppendingByteSerializer(serialize_fn=CacheArtifact.serialize)
        for name, value in zip(names, ([], OrderedSet(), serializer, CacheInfo())):
            setattr(cls, name, value)
        try:
            yield
        finally:
            for name, value in zip(names, saved):
                setattr(cls, name, value)

    return classmethod(with_fresh_cache)


def can_leave_out() -> bool:
    """Whether :func:`fresh_recording` really records apart on this torch."""
    return getattr(_manager(), "with_fresh_cache", None) is not None


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What :func:`save_artifacts` got from torch: Mega-Cache bytes (``None``: nothing) and what was not saved."""

    data: bytes | None
    #: One sentence per kind of artifact left out of ``data`` (how many, and why).
    not_saved: tuple[str, ...] = ()


#: A C++ wrapper loading a GPU kernel by the absolute path of its binary in the cache folder it was compiled in
#: (``cpp_wrapper`` on a GPU, torch 2.11 and earlier): torch reuses that source on a hit, and elsewhere the file
#: is missing.
_KERNEL_BY_PATH = re.compile(rb'loadKernel\(\s*"[^"]+\.(?:cubin|hsaco|fatbin|spv|zebin)"')


def save_artifacts() -> Recorded:
    """``torch.compiler.save_cache_artifacts()`` as bytes, less the FX graphs that could load only in this cache
    folder (a C++ wrapper naming a GPU kernel's binary by its path here)."""
    torch = torch_module()
    result = torch.compiler.save_cache_artifacts()
    if result is None:
        return Recorded(None)
    data = result[0] if isinstance(result, tuple) else result
    not_saved: tuple[str, ...] = ()
    if b"loadKernel" in data:
        data, not_saved = _portable(data)
    return Recorded(data if describe_artifacts(data) else None, not_saved)


def _portable(data: bytes) -> tuple[bytes, tuple[str, ...]]:
    """``data`` less the FX graphs loading kernels by path (:data:`_KERNEL_BY_PATH`) and the AOTAutograd entries
    naming one of them (they could only miss) or holding such a graph themselves (a bundled AOTAutograd cache);
    what was left out, in words."""
    groups = _deserialize(data)
    graphs = groups.get("inductor", [])
    gone = {str(a.key) for a in graphs if _KERNEL_BY_PATH.search(bytes(a.content))}
    entries = groups.get("aot_autograd", [])
    kept_entries = [a for a in entries if not _KERNEL_BY_PATH.search(bytes(a.content))
                    and not any(key.encode() in bytes(a.content) for key in gone)]
    if not gone and len(kept_entries) == len(entries):
        return data, ()
    groups["inductor"] = [a for a in graphs if str(a.key) not in gone]
    groups["aot_autograd"] = kept_entries
    parts = [f"{len(gone)} fx_graph{'s' if len(gone) != 1 else ''}" if gone else "",
             f"{len(entries) - len(kept_entries)} aot_autograd" if len(kept_entries) < len(entries) else ""]
    return _serialize(groups), (f"{' and '.join(p for p in parts if p)} compiled with cpp_wrapper: on a GPU, this "
                                "torch's C++ wrapper loads kernels by their path in the cache folder they were "
                                "compiled in, so these fail in any other folder and compile again in each test "
                                "and run instead",)


def ready_to_read() -> float:
    """Import what reading and writing Mega-Cache bytes needs; the seconds that took (about 0 where a
    test in this process compiled already, several seconds in an xdist controller that never did)."""
    start = time.perf_counter()
    getattr(_manager(), "_ensure_cache_artifacts_registered", lambda: None)()
    return time.perf_counter() - start


def _deserialize(data: bytes) -> dict[str, list[Any]]:
    """``{artifact type: artifacts}`` in Mega-Cache bytes, read without 2.7's ``deserialize`` (which writes them)."""
    ready_to_read()
    manager = _manager()
    from torch.compiler import _cache
    from torch.utils._appending_byte_serializer import AppendingByteSerializer

    logger = logging.getLogger("torch.compiler._cache")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        if hasattr(_cache, "_deserialize_single_cache"):
            groups = manager.deserialize(data)
        else:
            read: Any = _cache.CacheArtifact.deserialize  # 2.7's takes the reader alone
            groups = {}
            for artifact in AppendingByteSerializer.to_list(data, deserialize_fn=read):
                kind: Any = artifact.type  # 2.7's is an enum member
                groups.setdefault(str(kind.name).lower(), []).append(artifact)
    except Exception as exc:
        raise MegaCacheError(f"torch could not deserialize the artifacts ({type(exc).__name__}: {exc})") from None
    finally:
        logger.setLevel(level)
    if groups is None:
        raise MegaCacheError("torch could not deserialize the artifacts")
    return dict(groups)


_KEY_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$")
_KEY_SHAPES = {"inductor": re.compile(r"^f[a-z0-9]{20,100}$"), "aot_autograd": re.compile(r"^a[a-z0-9]{20,100}$")}


def check_artifact_keys(pairs: Iterable[tuple[str, Any]]) -> None:
    """Raise :class:`MegaCacheError` naming the (type, key) pairs whose key could reach outside the cache folder or
    is not of its form."""
    problems = []
    for kind, key in pairs:
        shape = _KEY_SHAPES.get(kind)
        parts = key.replace("\\", "/").split("/") if isinstance(key, str) else []
        if not isinstance(key, str) or not key or len(key) > 512 or len(parts) > 4 \
                or not all(_KEY_PART.match(part) for part in parts):
            problems.append(f"{kind} artifact key {key!r} could write outside the cache folder")
        elif shape is not None and not shape.match(key):
            problems.append(f"{kind} artifact key {key!r} is not of the form torch gives {kind} keys")
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise MegaCacheError("rejected, nothing of it loaded: " + "; ".join(problems[:3]) + more)


def _pairs(groups: dict[str, list[Any]]) -> Iterator[tuple[str, Any]]:
    return ((kind, getattr(artifact, "key", None)) for kind, items in groups.items() for artifact in items)


def check_keys(data: bytes) -> None:
    """:func:`check_artifact_keys` for the artifacts of Mega-Cache bytes."""
    check_artifact_keys(_pairs(_deserialize(data)))


def artifact_contents(data: bytes) -> list[tuple[str, str, bytes]]:
    """``(type, key, content)`` of every artifact in Mega-Cache bytes, in their order."""
    return [(kind, str(a.key), bytes(a.content)) for kind, items in _deserialize(data).items() for a in items]


def artifacts_bytes(contents: Iterable[tuple[str, str, bytes]]) -> bytes:
    """Mega-Cache bytes of ``(type, key, content)`` triples (what :func:`artifact_contents` took apart)."""
    ready_to_read()
    from torch.compiler import _cache

    factory = getattr(_cache, "CacheArtifactFactory", None)
    artifact: Any = _cache.CacheArtifact  # 2.7's is a dataclass of a type enum, a key and content
    groups: dict[str, list[Any]] = {}
    for kind, key, content in contents:
        try:
            made = (factory.create(kind, key, content) if factory is not None
                    else artifact(getattr(_cache, "CacheArtifactType")[kind.upper()], key, content))
        except (AssertionError, KeyError, ValueError, TypeError):
            raise MegaCacheError(f"torch knows no artifact type {kind!r} (of key {key!r})") from None
        groups.setdefault(kind, []).append(made)
    return _serialize(groups)


def describe_artifacts(data: bytes) -> dict[str, dict[str, int]]:
    """``{artifact type: {"count": n, "bytes": n}}`` for Mega-Cache bytes."""
    return {kind: {"count": len(items), "bytes": sum(len(getattr(a, "content", b"")) for a in items)}
            for kind, items in _deserialize(data).items() if items}


def artifact_identities(data: bytes) -> set[tuple[str, str, str]]:
    """``(type, key, sha256 of content)`` of every artifact in Mega-Cache bytes."""
    return {(kind, key, hashlib.sha256(content).hexdigest()) for kind, key, content in artifact_contents(data)}


def _serialize(groups: dict[str, list[Any]]) -> bytes:
    """Mega-Cache bytes of ``groups`` in this torch's layout (groups by type on >= 2.8, a flat list on 2.7)."""
    from torch.compiler import _cache
    from torch.utils._appending_byte_serializer import AppendingByteSerializer

    single = getattr(_cache, "_serialize_single_cache", None)
    if single is not None:
        grouped: Any = AppendingByteSerializer(serialize_fn=single)
        grouped.extend((kind, items) for kind, items in groups.items() if items)
        return bytes(grouped.to_bytes())
    flat: Any = AppendingByteSerializer(serialize_fn=_cache.CacheArtifact.serialize)
    flat.extend(artifact for items in groups.values() for artifact in items)
    return bytes(flat.to_bytes())


def found_by_coordinate_descent(content: bytes) -> bool:
    """Whether an autotune result was found by coordinate descent (kept over a heuristic one for its kernel)."""
    try:
        return json.loads(content).get("found_by_coordesc") is True
    except (ValueError, AttributeError, TypeError) as exc:  # kept as a heuristic result
        caught("reading an autotune result", exc)
        return False


def _one_result_per_kernel(groups: dict[str, list[Any]]) -> bool:
    """Keep one autotune result per kernel (in place), coordinate descent's over a heuristic one; whether any went."""
    items = groups.get("autotune") or []
    chosen: dict[str, Any] = {}
    for artifact in items:
        key = str(artifact.key)
        if (key not in chosen or found_by_coordinate_descent(bytes(artifact.content))
                or not found_by_coordinate_descent(bytes(chosen[key].content))):
            chosen[key] = artifact
    if len(chosen) == len(items):
        return False
    groups["autotune"] = list(chosen.values())
    return True


def load_artifacts(data: bytes, into: str) -> dict[str, list[str]]:
    """Write Mega-Cache bytes into the cache folder ``into``; ``{artifact type: keys}`` loaded."""
    torch = torch_module()
    groups = _deserialize(data)
    check_artifact_keys(_pairs(groups))
    if _one_result_per_kernel(groups):
        data = _serialize(groups)
    saved = SavedEnv()
    point_cache_dirs_at(into)
    try:
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as exc:
        raise MegaCacheError(f"torch failed while loading the artifacts: {type(exc).__name__}: {exc}") from exc
    finally:
        saved.restore()
    if info is None:
        raise MegaCacheError("torch could not deserialize the artifacts (load_cache_artifacts returned None)")
    loaded = getattr(info, "artifacts", None)  # torch's CacheInfo: a mapping, or on 2.7 one <type>_artifacts list each
    if not isinstance(loaded, dict):
        loaded = {name[: -len("_artifacts")]: value for name, value in vars(info).items()
                  if name.endswith("_artifacts") and isinstance(value, list)}
    return {kind: [str(k) for k in keys] for kind, keys in loaded.items() if keys}
