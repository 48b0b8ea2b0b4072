"""torch's C++ builds: what a binary's fit depends on, and counting, timing and guarding their loads (a
carried binary or CPU feature probe that cannot be loaded is removed and built here, not failing the compile); and
the Triton kernels an FX cache hit finds already in Triton's folder, counted as hits file by file as torch counts
its own (its ``TritonBundler.read_and_emit`` counts only the kernels it writes)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .. import files
from ..caught import caught
from ..environment import SavedEnv
from . import clock, counters, defaultdir, ondemand

_carried_names: set[str] = set()
_carried_kernels: set[str] = set()
#: ``{file name: what was said}`` of the binaries that could not be loaded and were rebuilt.
_rejected: dict[str, str] = {}
_lock = threading.Lock()
_header_seconds = 0.0


def _run(args: list[str]) -> str:
    try:
        done = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr


def _native_flags(compiler: str) -> str:
    """What ``-march=native`` means to this compiler on this CPU: the resolved target and a hash of its flags."""
    out = _run([compiler, "-march=native", "-###", "-E", "-x", "c++", os.devnull])
    line = next((ln for ln in out.splitlines() if "cc1" in ln), "")
    flags = sorted(t for t in (word.strip('"') for word in line.split())
                   if t.startswith(("-", "+")) and ("=" in t or t.startswith(("-m", "+", "-target-feature"))))
    march = re.search(r'-march=([\w.-]+)|"-target-cpu" "([\w.-]+)"', line)
    name = next((g for g in march.groups() if g), "") if march else ""
    digest = hashlib.sha256(" ".join(flags).encode()).hexdigest()[:12] if flags else "unknown"
    return f"{name or '?'} ({digest})"


@functools.lru_cache(maxsize=1)
def build_identity() -> dict[str, str]:
    """Everything a C++ binary's fit depends on that torch's own key (source and full command line)
    does not cover: the compiler, what ``-march=native`` means on this CPU, the machine, the torch build."""
    import torch
    from torch._inductor import cpp_builder

    try:
        name = cpp_builder.get_cpp_compiler()
    except Exception:  # torch raises its own error when no C++ compiler is found
        name = ""
    real = os.path.realpath(shutil.which(name) or name) if name else "none"
    version = next(iter(_run([real, "--version"]).splitlines()), "unknown") if name else "none"
    native = _native_flags(real) if name else "none"
    if native.startswith("?") or "(unknown)" in native:
        native += f" cpu flags {_cpu_flags()}"
    return {
        "compiler": real,
        "compiler_version": version.strip(),
        "native": native,
        "machine": platform.machine(),
        "libc": " ".join(platform.libc_ver()) or "unknown",
        "torch": f"{torch.__version__} ({getattr(torch.version, 'git_version', '') or 'unknown'})",
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def _cpu_flags() -> str:
    """A hash of this CPU's feature flags, for when the compiler cannot say what ``-march=native`` means."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith(("flags", "Features"))), "")
    except OSError:
        line = ""
    return hashlib.sha256(line.encode()).hexdigest()[:12] if line else f"unknown {os.getpid()}"


def wrap_load_async(function: Callable[..., Any]) -> Callable[..., Any]:
    """``CppCodeCache.load_async`` (a classmethod's function), its load counted, timed and guarded the first time."""

    @functools.wraps(function)
    def load_async(cls: Any, *args: Any, **kwargs: Any) -> Any:
        asked, load = time.time(), function(cls, *args, **kwargs)
        done: list[bool] = []

        def first_load() -> Any:
            if done:
                return load()
            with clock.compiling():
                try:
                    lib = load()
                except (OSError, ImportError) as exc:
                    _remove_unloadable(exc)
                    lib = load()
            done.append(True)
            path = getattr(lib, "__file__", None) or getattr(lib, "_name", None)
            try:
                existed = path is not None and os.stat(path).st_mtime < asked
            except OSError:
                existed = False
            counters.count("cpp.hits" if existed else "cpp.misses")
            if existed and os.path.basename(str(path)) in _carried_names:
                counters.count("cpp.from_bundle")
            return lib

        return first_load

    return load_async


def header_build_seconds() -> float:
    """Wall seconds this process spent building torch's precompiled C++ headers and CPU probes (not finding them)."""
    return _header_seconds


def wrap_precompile_header(original: Callable[..., Any]) -> Callable[..., Any]:
    """``codecache._precompile_header``, in the headers' folder in force, timing the builds that write a header."""
    codecache = sys.modules.get("torch._inductor.codecache")

    @functools.wraps(original)
    def precompile_header(*args: Any, **kwargs: Any) -> Any:
        with defaultdir.headers_in_force():
            return _timing_builds(getattr(codecache, "_HEADER_DIR", None), lambda: original(*args, **kwargs))

    return precompile_header


def _timing_builds(folder: Any, build: Callable[[], Any]) -> Any:
    """``build()``, its wall seconds counted in :func:`header_build_seconds` where it added files to ``folder``."""
    global _header_seconds

    def count() -> int:
        return sum(len(names) for _, _, names in os.walk(folder)) if isinstance(folder, str) else 0

    before, started = count(), time.perf_counter()
    try:
        return build()
    finally:
        if count() > before:  # built here, not found
            with _lock:
                _header_seconds += time.perf_counter() - started


#: The ``(folder, here)`` of each active :func:`cpu_probes_in`, innermost last.
_probes_at: list[tuple[str, bool]] = []


@contextlib.contextmanager
def cpu_probes_in(folder: str, here: bool) -> Iterator[None]:
    """Inside, the CPU probes a process builds (about 7 s) are kept in ``folder``: built there (``here``), or in the
    cache folder of the moment (a bundle carries them) after placing the kept ones, and linked into ``folder``."""
    _probes_at.append((folder, here))
    try:
        yield
    finally:
        _probes_at.remove((folder, here))


def wrap_valid_vec_isa_list(original: Callable[..., Any]) -> Callable[..., Any]:
    """``cpu_vec_isa.valid_vec_isa_list``, building the probes where :func:`cpu_probes_in` says."""
    learned = getattr(original, "cache_info")  # whether the CPU was learned already

    @functools.wraps(original)
    def valid_vec_isa_list() -> Any:
        told = next(reversed(_probes_at), None)
        if told is None or not told[1] or learned().currsize:
            return original()
        saved = SavedEnv(("TORCHINDUCTOR_CACHE_DIR",))
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = told[0]
        try:
            return _timing_builds(told[0], original)  # a cost of the home, as the headers
        finally:
            saved.restore()

    return valid_vec_isa_list


def wrap_check_build(original: Callable[..., Any]) -> Callable[..., Any]:
    """``VecISA.check_build``, placing kept probes first and building again a carried one that will not load."""

    @functools.wraps(original)
    def check_build(self: Any, code: str, *args: Any, **kwargs: Any) -> Any:
        placed = _link_probe(code, keeping=False)
        ok = original(self, code, *args, **kwargs)
        if ok:
            _link_probe(code, keeping=True)
            return ok
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        binaries = [s.with_suffix(suffix) for s in _probe_sources(Path(cache_dir()), code) for suffix in (".so", ".o")]
        carried = [p for p in binaries if p.exists() and (p.name in _carried_names or p.name in placed)]
        if not carried:
            return ok
        for path in carried:
            path.unlink(missing_ok=True)
        ok = original(self, code, *args, **kwargs)
        if ok:
            for path in carried:
                _reject(path.name, "(a CPU feature probe) could not be loaded; rebuilt")
        return ok

    return check_build


def cpu_probe_sources() -> frozenset[str]:
    """The C++ sources torch builds its CPU feature probes from (every ``*_code`` text of its ISA classes)."""
    try:
        from torch._inductor import cpu_vec_isa
        from torch._inductor.cpu_vec_isa import VecISA
    except ImportError:
        return frozenset()
    classes = [c for c in vars(cpu_vec_isa).values() if isinstance(c, type) and issubclass(c, VecISA)]
    return frozenset(value for c in classes for name, value in vars(c).items()
                     if name.endswith("_code") and isinstance(value, str))


def _link_probe(code: str, keeping: bool) -> set[str]:
    """Link the probe built from ``code`` from the machine's probe folder to the cache folder, or back (``keeping``)."""
    told = next(reversed(_probes_at), None)
    if told is None or told[1]:
        return set()
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    kept, root, placed = Path(told[0]), Path(cache_dir()), set()
    origin, destination = (root, kept) if keeping else (kept, root)
    for source in _probe_sources(origin, code):
        for path in (source, source.with_suffix(".so"), source.with_suffix(".o")):
            target = destination / path.relative_to(origin)
            if not path.exists() or target.exists():
                continue
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                files.place_file(str(path), str(target))
            except OSError as exc:  # left to torch to build
                caught("placing a carried C++ binary", exc)
                continue
            if path is not source:
                placed.add(target.name)
    return placed


def _probe_sources(folder: Path, code: str) -> list[Path]:
    """The C++ sources in ``folder``'s two-character folders whose text is the probe source ``code``."""
    found = []
    for source in folder.glob("*/*.cpp"):
        try:
            if source.read_text() == code:
                found.append(source)
        except (OSError, UnicodeDecodeError) as exc:
            caught("reading a C++ source to tell a CPU probe", exc)
    return found


def _remove_unloadable(exc: BaseException) -> None:
    """Remove the binary of the current cache folder that ``exc`` says cannot be loaded; raise ``exc`` if none."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root = os.path.realpath(cache_dir()) + os.sep
    candidates = [p for p in re.findall(r"(/[^:\s'\"()]+\.so)\b", str(exc))
                  if os.path.realpath(p).startswith(root) and os.path.exists(p)]
    if not candidates:
        raise exc
    path = candidates[-1]
    _reject(os.path.basename(path), f"could not be loaded ({exc}); rebuilt")
    for stale in Path(path).parent.glob(Path(path).name.split(".")[0] + ".*"):
        if stale.suffix in (".so", ".o"):
            stale.unlink(missing_ok=True)


def _reject(name: str, why: str) -> None:
    with _lock:
        kind = "carried binary" if name in _carried_names else "binary"
        _carried_names.discard(name)
        _rejected.setdefault(name, f"{kind} {name} {why}")


def mark_carried(paths: Iterable[str]) -> None:
    """Remember the files (cache-relative paths) placed from a bundle, to count their hits as ``from_bundle``."""
    paths = list(paths)
    with _lock:
        _carried_kernels.update(p.split("/")[1] for p in paths if p.startswith("triton/"))
        _carried_names.update(p.rsplit("/", 1)[-1] for p in paths if not p.startswith("triton/"))


def rejected_binaries() -> dict[str, str]:
    """``{file name: what to say}`` of the binaries that could not be loaded (each rebuilt) in this process."""
    with _lock:
        return dict(_rejected)


def wrap_read_and_emit(original: Callable[..., Any]) -> Callable[..., Any]:
    """``TritonBundler.read_and_emit``, counting the kernels already present as hits first."""
    module = importlib.import_module("torch._inductor.triton_bundler")
    bundler, cache_dir = module.TritonBundler, module.triton_cache_dir

    @functools.wraps(original)
    def read_and_emit(bundle: Any, *args: Any, **kwargs: Any) -> Any:
        if bundler.is_enabled():
            _count_present(bundle, cache_dir)
        return original(bundle, *args, **kwargs)

    return read_and_emit


def _count_present(bundle: Any, cache_dir: Any) -> None:
    for artifacts in getattr(bundle, "kernel_artifacts", ()):
        try:
            folder = os.path.join(cache_dir(artifacts.device), artifacts.kernel_hash)
            ondemand.place(folder)  # a carried kernel's folder, where its placing waits for this ask
            present = os.path.isdir(folder) and bool(os.listdir(folder))
        except (OSError, AttributeError, TypeError) as exc:  # this kernel's files are not counted
            caught("counting a Triton kernel's files torch found", exc)
            continue
        if present:
            count = len(getattr(artifacts, "artifacts", ()))
            counters.count("triton.hits", count)
            if artifacts.kernel_hash in _carried_kernels:
                counters.count("triton.from_bundle", count)
