"""Dynamo's own counts: frames, graphs, recompiles (counted at the function Dynamo asks why a frame must
be compiled again, its guard failures the reasons) and graph breaks, each named by the user's line
where Dynamo logs it, as ``TORCH_LOGS=recompiles,graph_breaks`` would print them."""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from collections import Counter
from typing import Any, Callable

from ..caught import caught
from ..stats import GRAPH_BREAK_PLACE, GRAPH_BREAK_REASON, RECOMPILE_REASON

_recompiles: Counter[str] = Counter()
_break_places: Counter[str] = Counter()
_lock = threading.Lock()


def wrap_recompilation_reasons(original: Callable[..., Any]) -> Callable[..., Any]:
    """Dynamo's recompilation-reason function, counting each call as one recompile with its reasons."""

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        reasons = original(*args, **kwargs)
        frame = kwargs.get("frame", args[1] if len(args) > 1 else None)
        with _lock:
            _recompiles[_describe(frame, reasons)] += 1
        return reasons

    return counted


def wrap_log_graph_break(original: Callable[..., Any]) -> Callable[..., Any]:
    """Dynamo's ``log_graph_break`` (module-level to 2.9, ``InstructionTranslatorBase``'s since), noting each
    break's place in the user's code; one given no exception (torch <= 2.10) also counts a data-dependent branch
    it logs without counting."""
    signature = inspect.signature(original)
    if "exc" not in signature.parameters:

        @functools.wraps(original)
        def logged(*args: Any, **kwargs: Any) -> Any:
            given = signature.bind(*args, **kwargs).arguments
            _logged(str(given.get("reason", "")), given.get("user_stack"))
            return original(*args, **kwargs)

        return logged

    @functools.wraps(original)
    def located(self: Any, *args: Any, **kwargs: Any) -> Any:
        exc = kwargs.get("exc", args[-1] if args else None)
        if exc is not None and not getattr(exc, "logged", False):
            _note(getattr(exc, "real_stack", None), str(exc))
        return original(self, *args, **kwargs)

    return located


#: How torch <= 2.10 begins the reason it logs for a data-dependent branch, a break it counts nowhere.
_DATA_DEPENDENT = "Data-dependent branching"
#: Graph breaks torch logged without counting them (torch <= 2.10's data-dependent branches), by reason.
_uncounted: Counter[str] = Counter()


def _logged(reason: str, user_stack: Any) -> None:
    """One break logged by a torch <= 2.10, its place named by the message after 2.10's own first paragraph."""
    head, _, rest = reason.partition("\n\n")
    message = rest if rest.strip() and head.rstrip().endswith(":") and "\n" not in head.strip() else reason
    _note(user_stack, message)
    if reason.startswith(_DATA_DEPENDENT) and _compiles_a_partial_graph():
        with _lock:
            _uncounted[reason] += 1


def _compiles_a_partial_graph() -> bool:
    """Whether a data-dependent branch goes uncounted: logged by ``jump_graph_break`` that compiles the graph so far."""
    frame: Any = sys._getframe(2)  # who logged is a few frames up (the wrapper and the register's guard between)
    for _ in range(5):
        if frame is None or frame.f_code.co_name == "jump_graph_break":
            break
        frame = frame.f_back
    if frame is None or frame.f_code.co_name != "jump_graph_break":
        return False
    check = getattr(frame.f_locals.get("self"), "should_compile_partial_graph", None)
    try:
        return bool(check()) if check is not None else True
    except Exception as exc:
        caught("asking Dynamo whether a graph break compiles a partial graph", exc)
        return True


def _note(stack: Any, text: str) -> None:
    """Count a graph break at its place in the user's code, where that can be told."""
    try:
        place = _place(stack, text)
    except Exception as exc:  # the graph break is counted, without its place
        caught("finding a graph break's place in the user's code", exc)
        return
    if place:
        with _lock:
            _break_places[place] += 1


def _place(stack: Any, text: str) -> str:
    """``file:line: first line of the reason`` for a break with user stack ``stack`` (else the tracing context's)."""
    if not stack:
        guards = sys.modules.get("torch._guards")
        context = getattr(guards, "TracingContext", None)
        stack = context.extract_stack() if context is not None else []
    user = [f for f in stack if not _in_torch(f.filename) and not f.filename.startswith("<")]
    if not user:
        return ""
    lines = [line.strip() for line in text.strip().splitlines()] or ["(no reason given)"]
    reason = lines[0] + (f" ({lines[1]})" if len(lines) > 1 and lines[1].startswith("Explanation:") else "")
    return f"{user[-1].filename}:{user[-1].lineno}: {reason}"


def _describe(frame: Any, reasons: Any) -> str:
    """``function (file:line): guard failure; ...`` for one recompile (torch's wrapper named after its module)."""
    code = getattr(frame, "f_code", None)
    if code is None:
        where = "a frame"
    elif _in_torch(code.co_filename):
        where = f"{_wrapped_name(frame) or code.co_name} (called at {_caller_outside_torch()})"
    else:
        where = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"
    failures = [str(r) for r in reasons] if isinstance(reasons, (list, tuple)) else [str(reasons)] if reasons else []
    return f"{where}: {'; '.join(failures) or 'torch found no guard failure'}"


def _in_torch(filename: str) -> bool:
    return filename.startswith(os.path.dirname(getattr(sys.modules.get("torch"), "__file__", "") or "") + os.sep)


def _wrapped_name(frame: Any) -> str:
    """``Sequential.forward`` for the wrapper frame around a module (its ``fn``), else ``""``."""
    try:
        fn = (getattr(frame, "f_locals", None) or {}).get("fn")
    except Exception as exc:
        caught("naming the module a graph break is in", exc)
        return ""
    forward = getattr(type(fn), "forward", None) if fn is not None and hasattr(fn, "_modules") else None
    target = forward if forward is not None else getattr(fn, "__func__", fn)
    return str(getattr(target, "__qualname__", "") or "")


def _caller_outside_torch() -> str:
    """``file:line`` of the innermost frame on this thread's stack outside torch and this package."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not _in_torch(name) and not name.startswith(here) and not name.startswith("<"):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "an unknown place"


def counts() -> dict[str, int]:
    """Dynamo's counts so far, one ``"<prefix><reason>"`` key per reason; graph breaks are torch's ``graph_break`` and
    ``unimplemented`` counters (an entry moves between them) and the data-dependent branches torch <= 2.10 misses."""
    from torch._dynamo.utils import counters

    breaks: Counter[str] = Counter()
    for group in ("graph_break", "unimplemented"):
        for reason, n in counters.get(group, Counter()).items():
            breaks[str(reason)] += int(n)
    with _lock:
        breaks.update(_uncounted)
        return {
            "dynamo.frames": int(counters.get("frames", Counter()).get("ok", 0)),
            "dynamo.graphs": int(counters.get("stats", Counter()).get("unique_graphs", 0)),
            "dynamo.graph_breaks": sum(breaks.values()),
            **{GRAPH_BREAK_REASON + reason: n for reason, n in breaks.items()},
            "dynamo.recompiles": sum(_recompiles.values()),
            **{RECOMPILE_REASON + reason: n for reason, n in _recompiles.items()},
            **{GRAPH_BREAK_PLACE + place: n for place, n in _break_places.items()},
        }

