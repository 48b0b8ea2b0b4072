"""The register of patches: every attribute of torch the plugin replaces at run time, declared in one table
(where, and the feature lost where it does not take), installed by :func:`install`, which records what took and
imports torch, and undone by :func:`undo`. Every replacement runs in one guard (:func:`_guarded`): a wrapper's own
failure never reaches torch's caller."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
import sys
import threading
from typing import Any, Callable


#: The newest torch release the register was checked on (scripts/compat.sh's newest end).
NEWEST_SEEN = "2.15.0"


@dataclasses.dataclass(frozen=True)
class Patch:
    """``module``'s ``attribute`` (dotted, as ``"FxGraphCache._save_graph"``) replaced by what ``wrapper``
    (``"module:function"`` of this package) makes of torch's original; ``fallback_for``: only where that
    attribute's patch did not take; ``backport``: added where missing."""

    module: str
    attribute: str
    wrapper: str
    feature: str
    fallback_for: str = ""
    backport: bool = False

    @property
    def name(self) -> str:
        """``module.attribute``, as the patch is reported."""
        return f"{self.module}.{self.attribute}"


_FX = "torch._inductor.codecache"
_AOT = "torch._functorch._aot_autograd.autograd_cache"
_HEURISTICS = "torch._inductor.runtime.triton_heuristics"
_ISA = "torch._inductor.cpu_vec_isa"

_SHARED = "no files in the shared /tmp/torchinductor_<user>"

#: Every attribute the plugin replaces, in the order they are installed (docs/compatibility.md says why each, and
#: on which torch releases it was seen to work).
PATCHES: tuple[Patch, ...] = (
    Patch("torch._inductor.runtime.cache_dir_utils", "default_cache_dir", "defaultdir:wrap_default_cache_dir", _SHARED),
    Patch("torch._inductor.runtime.runtime_utils", "default_cache_dir", "defaultdir:wrap_default_cache_dir", _SHARED),
    Patch(_FX, "default_cache_dir", "defaultdir:wrap_default_cache_dir", _SHARED),
    Patch("torch.compiler._cache", "CacheArtifactManager.with_fresh_cache", "megacache:backport_fresh_cache",
          "cold_cache compiles kept out of the bundle", backport=True),
    Patch(_FX, "FxGraphCache._get_tmp_dir_for_key", "ondemand:wrap_tmp_dir_for_key",
          "warm folders filled on demand (FX graphs)"),
    Patch(_AOT, "AOTAutogradCache._get_tmp_dir_for_key", "ondemand:wrap_tmp_dir_for_key",
          "warm folders filled on demand (AOTAutograd)"),
    Patch(_FX, "get_path", "ondemand:wrap_get_path", "warm folders filled on demand (C++ binaries)"),
    Patch("torch._dynamo.pgo", "get_local_code_state", "counters:wrap_pgo_lookup", "pgo layer counts"),
    Patch("torch._dynamo.pgo", "put_local_code_state", "counters:wrap_pgo_save", "pgo saved counts"),
    Patch(_FX, "FxGraphCache._save_graph", "counters:wrap_fx_save", "fx_graph saved counts"),
    Patch(_FX, "CppCodeCache.load_async", "binaries:wrap_load_async", "cpp layer counts; carried C++ binaries"),
    Patch(_FX, "_precompile_header", "binaries:wrap_precompile_header",
          "headers kept in the plugin's home; header build time in the summary"),
    Patch(_ISA, "valid_vec_isa_list", "binaries:wrap_valid_vec_isa_list", "CPU probes kept between runs"),
    Patch(_ISA, "VecISA.check_build", "binaries:wrap_check_build", "CPU probes kept between runs"),
    Patch("torch._dynamo", "callback_handler.install_callbacks", "clock:wrap_callbacks", "compile wall time"),
    Patch("torch._dynamo.convert_frame", "_compile", "clock:wrap_timed", "compile wall time (frames only)",
          fallback_for="callback_handler.install_callbacks"),
    Patch(_HEURISTICS, "CachingAutotuner.precompile", "clock:wrap_timed", "compile wall time (Triton)"),
    Patch(_HEURISTICS, "CachingAutotuner.benchmark_all_configs", "clock:wrap_timed", "compile wall time (autotuning)"),
    Patch("torch._inductor.runtime.autotune_cache", "AutotuneCache.create", "autotune:wrap_create",
          "autotune results in the test's own folder"),
    Patch("torch._inductor.runtime.autotune_cache", "AutotuneCache._read", "autotune:wrap_read",
          "autotune from_bundle counts"),
    Patch(_HEURISTICS, "check_autotune_cache", "autotune:wrap_check", "coordinate descent's results kept on reload"),
    Patch(_HEURISTICS, "CachingAutotuner.recheck_autotune_cache", "autotune:wrap_recheck",
          "coordinate descent's results kept on reload"),
    Patch("triton.runtime.cache", "FileCacheManager.__init__", "ondemand:wrap_cache_manager_init",
          "warm folders filled on demand (C++ binaries)"),
    Patch("torch._inductor.triton_bundler", "TritonBundler.read_and_emit", "binaries:wrap_read_and_emit",
          "triton layer counts of carried kernels"),
    Patch("torch._dynamo.convert_frame", "get_and_maybe_log_recompilation_reasons", "dynamo:wrap_recompilation_reasons",
          "Dynamo recompile counts and reasons"),
    Patch("torch._dynamo.symbolic_convert", "InstructionTranslatorBase.log_graph_break", "dynamo:wrap_log_graph_break",
          "where each graph break happened; data-dependent branches counted"),
    Patch("torch._dynamo.symbolic_convert", "log_graph_break", "dynamo:wrap_log_graph_break",
          "where each graph break happened; data-dependent branches counted",
          fallback_for="InstructionTranslatorBase.log_graph_break"),
    Patch(_FX, "compiled_fx_graph_hash", "keys:wrap_fx_hash", "explained FX graph misses; the bundle's key index"),
    Patch(_AOT, "autograd_cache_key", "keys:wrap_aot_key", "explained AOTAutograd misses; the bundle's key index"),
)


@dataclasses.dataclass
class _Applied:
    owner: Any
    attribute: str
    before: Any  # the owner's own value, or _ABSENT where it had none
    replacement: Any


_ABSENT = object()
#: The attribute a replacement carries: what it replaced, so that a register imported again (a
#: ``pytester`` run in this process) wraps torch's original, never a wrapper.
_ORIGINAL = "_compilecache_original"
_applied: dict[str, _Applied] = {}
#: ``{patch name: why it did not take}`` for the patches :func:`install` tried and could not apply.
_missed: dict[str, str] = {}
#: What was done, in order, as ``(kind, name)``: :func:`undo` takes back what came after a checkpoint.
_done: list[tuple[str, str]] = []
#: ``{patch name: why}`` of replacements whose own work failed: each stopped there, torch's own in force since.
_faults: dict[str, str] = {}


@dataclasses.dataclass
class _Call:
    """What torch's original did within one call of a replacement."""

    returned: bool = False
    result: Any = None
    raised: BaseException | None = None


class _Calls(threading.local):
    """Per thread, what torch's original did in each replacement's call in progress (innermost last)."""

    def __init__(self) -> None:
        self.stack: list[_Call] = []


_calls = _Calls()


class _Observed:
    """torch's original as its wrapper calls it: telling the replacement's call in progress what it returned or
    raised; its other attributes are the original's (a wrapper may ask for ``cache_info``)."""

    def __init__(self, original: Callable[..., Any]) -> None:
        functools.update_wrapper(self, original)
        self.__wrapped__ = original

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = _calls.stack[-1] if _calls.stack else None
        try:
            result = self.__wrapped__(*args, **kwargs)
        except BaseException as exc:
            if call is not None and not call.returned:  # a call the wrapper makes after torch's answered is its own
                call.raised = exc
            raise
        if call is not None:
            call.returned, call.result, call.raised = True, result, None
        return result


def _guarded(name: str, original: Callable[..., Any], replacement: Callable[..., Any]) -> Callable[..., Any]:
    """``replacement`` (made from :class:`_Observed` ``original``) in the guard: where it raises what torch's
    original did not, the fault is recorded, torch's result is returned (torch is called where it was not yet),
    and from then on torch's original runs alone."""

    @functools.wraps(replacement)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if name in _faults:
            return original(*args, **kwargs)
        call = _Call()
        _calls.stack.append(call)
        try:
            return replacement(*args, **kwargs)
        except Exception as exc:
            if exc is call.raised:
                raise  # torch's own
            _faults.setdefault(name, f"{type(exc).__name__}: {exc}")
        finally:
            _calls.stack.pop()
        if call.raised is not None:
            raise call.raised
        return call.result if call.returned else original(*args, **kwargs)

    return guarded


def _function(spec: str) -> Callable[..., Any]:
    module, name = spec.split(":")
    function: Callable[..., Any] = getattr(importlib.import_module(f"{__package__}.{module}"), name)
    return function


def _unwrapped(value: Any) -> tuple[Any, type | None]:
    """The function inside a ``staticmethod``/``classmethod`` and that kind, or the value and ``None``."""
    if isinstance(value, (staticmethod, classmethod)):
        return value.__func__, type(value)
    return value, None


def _apply(patch: Patch) -> str:
    """Replace the attribute, or add a backport where this torch lacks it; ``""`` where it took (or a backport was
    not needed), else why not."""
    try:
        module = importlib.import_module(patch.module)
    except Exception as exc:  # a torch without the module, or without Triton to import it with
        return f"cannot import {patch.module} ({type(exc).__name__}: {exc})"
    *path, name = patch.attribute.split(".")
    try:
        owner: Any = functools.reduce(getattr, path, module)
        raw: Any = vars(owner).get(name, _ABSENT) if hasattr(owner, "__dict__") else _ABSENT
        function, kind = _unwrapped(raw if raw is not _ABSENT or patch.backport else getattr(owner, name))
    except AttributeError:
        return f"this torch has no {patch.attribute}"
    if patch.backport:
        if hasattr(owner, name):
            return ""
        installed = _function(patch.wrapper)(None)
    else:
        earlier = getattr(function, _ORIGINAL, _ABSENT)
        if earlier is None:  # an earlier copy's replacement shadowed an inherited attribute
            delattr(owner, name)
            raw = _ABSENT
            function, kind = _unwrapped(getattr(owner, name))
        elif earlier is not _ABSENT:
            raw = earlier
            function, kind = _unwrapped(earlier)
        try:
            replacement = _guarded(patch.name, function, _function(patch.wrapper)(_Observed(function)))
        except Exception as exc:  # the factory found this torch's attribute, or what it needs beside, unlike it
            return f"this torch's {patch.attribute} cannot take the patch ({type(exc).__name__}: {exc})"
        setattr(replacement, _ORIGINAL, None if raw is _ABSENT else raw)
        installed = kind(replacement) if kind is not None else replacement
    setattr(owner, name, installed)
    _applied[patch.name] = _Applied(owner, name, raw, installed)
    _done.append(("patch", patch.name))
    return ""


def install() -> None:
    """Apply every patch not applied yet (importing torch's modules); record what took and why the rest did not."""
    for patch in PATCHES:
        if patch.name in _applied or patch.name in _missed or (patch.fallback_for and took(patch.fallback_for)):
            continue
        why = _apply(patch)
        if why:
            _missed[patch.name] = why
            _done.append(("missed", patch.name))


def installed() -> bool:
    """Whether :func:`install` ran since the last :func:`undo`."""
    return bool(_applied or _missed)


def took(attribute: str) -> bool:
    """Whether the patch of ``attribute`` (as :data:`PATCHES` names it, without its module) is in force."""
    return any(p.attribute == attribute and p.name in _applied for p in PATCHES)


def checkpoint() -> int:
    """A mark of what is installed now, for :func:`undo`."""
    return len(_done)


def undo(since: int = 0) -> list[str]:
    """Put back what :func:`install` changed after the checkpoint ``since`` (everything, by default), newest
    first, and forget it; never raises: what could not be put back (or was replaced again since) is returned."""
    problems = []
    while len(_done) > since:
        kind, name = _done.pop()
        try:
            if kind == "patch":
                applied = _applied.pop(name)
                if vars(applied.owner).get(applied.attribute, _ABSENT) is not applied.replacement:
                    problems.append(f"{name} was replaced again by something else since; left as it is")
                elif applied.before is not _ABSENT:
                    setattr(applied.owner, applied.attribute, applied.before)
                else:
                    delattr(applied.owner, applied.attribute)
            else:
                _missed.pop(name, None)
            _faults.pop(name, None)
        except Exception as exc:  # one that cannot be put back must not keep the rest in force
            problems.append(f"{name} could not be put back ({type(exc).__name__}: {exc})")
    return problems


def status() -> dict[str, Any]:
    """``{"torch", "newer": whether it is newer than :data:`NEWEST_SEEN`, "took": [names], "missed": {name: why},
    "faults": {name: why}, "features_off": {feature: why}}``: features whose every patch missed (a patch whose
    fallback took is not), and those of a replacement stopped by its own fault."""
    covered = {p.fallback_for for p in PATCHES if p.fallback_for and p.name in _applied}
    missed = {p.name: _missed[p.name] for p in PATCHES if p.name in _missed and p.attribute not in covered}
    features: dict[str, list[str]] = {}
    for patch in PATCHES:
        if patch.name in missed:
            features.setdefault(patch.feature, []).append(f"{patch.name}: {missed[patch.name]}")
    off = {feature: "; ".join(whys) for feature, whys in features.items()
           if not any(p.feature == feature and p.name in _applied for p in PATCHES)}
    for patch in PATCHES:
        if patch.name in _faults:
            off[patch.feature] = f"{patch.name} failed ({_faults[patch.name]}); torch's own runs alone since"
    torch = str(getattr(sys.modules.get("torch"), "__version__", ""))
    took = [p.name for p in PATCHES if p.name in _applied]
    return {"torch": torch, "newer": _release(torch) > _release(NEWEST_SEEN), "took": took, "missed": missed,
            "faults": {n: why for n, why in _faults.items() if n in _applied}, "features_off": off}


def _release(version: str) -> tuple[int, ...]:
    """``"2.16.0.dev20261201+cu130"`` as ``(2, 16, 0)``; ``()`` where it is not a version."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(n) for n in found.groups() if n is not None) if found else ()
