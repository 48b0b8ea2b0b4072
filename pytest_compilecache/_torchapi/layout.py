"""Where torch and Triton keep compiled files in a cache folder, and how to read them: C++ binaries and
their sources in two-character folders, Triton's kernel folders with their group files, the
max-autotune GEMM timings. Nothing here imports torch."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

from ..caught import caught

#: What a carried file may be called, relative to a cache folder: ``<subdir>/<name>`` (a C++
#: binary or source) or ``triton/<key>/<name>`` (a file of Triton's own kernel cache).
_PATH = re.compile(r"^([A-Za-z0-9_]{1,8}|triton/[A-Za-z0-9_-]{8,128})/[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")
TRITON = "triton"
_TIMINGS = "cache"
BINARY = (".so", ".o")
#: Triton's compiled C modules (its driver's helpers, kernel launchers): one per folder, with no group file.
_MODULE = (".so", ".pyd")
#: How far a file time may lag the clock (the kernel stamps files with a clock that ticks every few ms).
_CLOCK_TICK = 0.02
SOURCE = ".cpp"


def is_group_file(name: str) -> bool:
    """Whether a file of a Triton kernel's folder is its group file (which names the others)."""
    return name.startswith("__grp__")


def valid_path(path: str) -> bool:
    """Whether ``path`` is a name a carried file may have (inside a cache folder, nothing else)."""
    return bool(_PATH.match(path)) and ".." not in path


def find_binaries(folder: Path, since: float = 0.0) -> dict[str, Path]:
    """``{relative path: file}`` for every built binary in a cache folder (with ``since``, only in folders
    changed since then): C++ binaries with their sources, Triton's kernel folders (complete ones) and the
    max-autotune GEMM timings, but not a binary whose source names this folder (torch 2.7's kernels)."""
    found = _triton_files(Path(folder) / TRITON, since)
    with contextlib.suppress(OSError):
        found.update({f"{_TIMINGS}/{e.name}": Path(e.path) for e in os.scandir(Path(folder) / _TIMINGS)
                      if e.is_file(follow_symlinks=False) and valid_path(f"{_TIMINGS}/{e.name}")})
    try:
        subdirs = [d for d in os.scandir(folder) if len(d.name) == 2 and d.is_dir(follow_symlinks=False)
                   and _changed_since(d, since)]
    except OSError:
        return found
    here = {str(folder).encode(), os.path.realpath(folder).encode()}
    for sub in subdirs:
        try:
            names = {e.name: e for e in os.scandir(sub.path) if e.is_file(follow_symlinks=False)}
        except OSError as exc:  # removed while scanned: its binaries are not carried
            caught("scanning a C++ kernel folder", exc)
            continue
        stems = {n.rsplit(".", 1)[0] for n in names if n.endswith(BINARY)}
        local = {stem for stem in stems if _names_folder(Path(sub.path) / (stem + SOURCE), here)}
        for name in names:
            stem, _, ext = name.rpartition(".")
            built = "." + ext in BINARY or ("." + ext == SOURCE and stem in stems)
            if built and stem not in local and not name.startswith(".") and valid_path(f"{sub.name}/{name}"):
                found[f"{sub.name}/{name}"] = Path(sub.path) / name
    return found


def _names_folder(source: Path, folders: set[bytes]) -> bool:
    """Whether a C++ source names the cache folder it lies in (torch 2.7's kernels: their key differs per folder)."""
    try:
        text = source.read_bytes()
    except OSError as exc:
        caught("reading a C++ kernel's source", exc)
        return False
    return any(folder in text for folder in folders)


def _changed_since(entry: os.DirEntry[str], since: float) -> bool:
    """Whether a folder's entries may have changed since ``since`` (file times lag the clock by up to a tick)."""
    if not since:
        return True
    try:
        return entry.stat(follow_symlinks=False).st_mtime >= since - _CLOCK_TICK
    except OSError:
        return True


def _triton_files(root: Path, since: float = 0.0) -> dict[str, Path]:
    found: dict[str, Path] = {}
    try:
        kernels = [d for d in os.scandir(root) if d.is_dir(follow_symlinks=False) and _changed_since(d, since)]
    except OSError:
        return found
    for kernel in kernels:
        try:
            files = [e for e in os.scandir(kernel.path) if e.is_file(follow_symlinks=False)]
        except OSError as exc:
            caught("scanning a Triton kernel folder", exc)
            continue
        groups = [e for e in files if is_group_file(e.name)]
        if not groups:
            if not all(e.name.endswith(_MODULE) for e in files):
                continue  # a kernel being written (its group file comes last)
        elif not all(_complete(Path(g.path), {e.name for e in files}) for g in groups):
            continue
        for entry in files:
            rel = f"{TRITON}/{kernel.name}/{entry.name}"
            if valid_path(rel) and not entry.name.startswith("."):
                found[rel] = Path(entry.path)
    return found


def _complete(group: Path, present: set[str]) -> bool:
    """Whether every file a Triton group file names is in its folder (a kernel being written is not)."""
    try:
        children = json.loads(group.read_bytes())["child_paths"].values()
        return all(os.path.basename(str(child)) in present for child in children)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def in_order(files: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``files`` with each Triton group file after the files it names (a reader never sees it before them)."""
    return sorted(files.items(), key=lambda item: (is_group_file(item[0].rsplit("/", 1)[-1]), item[0]))


def is_timings(path: str) -> bool:
    """Whether a carried file is torch's max-autotune GEMM timing cache (merged, never replaced)."""
    return path.startswith(_TIMINGS + "/")


def merge_timings(first: bytes, second: bytes) -> bytes:
    """Two GEMM timing files as one: every timing of both, ``first``'s where both have one (a side that is
    not a timing file, JSON with a ``cache`` object, is left out)."""
    def load(data: bytes) -> dict[str, Any] | None:
        try:
            value = json.loads(data)
        except ValueError:
            return None
        return value if isinstance(value, dict) and isinstance(value.get("cache"), dict) else None

    def union(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        merged = dict(b)
        for key, value in a.items():
            merged[key] = union(value, b[key]) if isinstance(value, dict) and isinstance(b.get(key), dict) else value
        return merged

    one, two = load(first), load(second)
    if one is None or two is None:
        return first if two is None else second
    return json.dumps(union(one, two), indent=4).encode()


def in_subdir(path: str) -> bool:
    """Whether a carried file lies in one of torch's two-character folders (C++ binaries and their sources)."""
    folder, _, name = path.partition("/")
    return len(folder) == 2 and bool(name) and "/" not in name


def is_cpp(path: str) -> bool:
    """Whether a carried file is a C++ binary (not a source, not a Triton kernel file)."""
    return path.endswith(BINARY) and not path.startswith(TRITON + "/")


def relocated_group(data: bytes, folder: Path) -> bytes:
    """A Triton group file naming its kernel's files by absolute path, pointed at ``folder``."""
    try:
        group = json.loads(data)
        paths = group["child_paths"]
        group["child_paths"] = {name: str(folder / os.path.basename(str(path))) for name, path in paths.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return data
    return json.dumps(group).encode()


def is_triton_module(path: str) -> bool:
    """Whether a carried file is one of Triton's compiled C modules."""
    return path.startswith(TRITON + "/") and path.endswith(_MODULE)
