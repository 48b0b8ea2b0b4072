"""Dynamo's own counts: frames converted, graphs compiled, recompiles and graph breaks, with reasons.

Frames, graphs and graph breaks are read from ``torch._dynamo.utils.counters``, which torch keeps
itself. torch counts no recompiles, so the function Dynamo calls to learn why a frame it already
compiled must be compiled again (``get_and_maybe_log_recompilation_reason(s)`` as
``torch._dynamo.convert_frame`` names it) is wrapped: each call is one recompile, and the guard
failures it returns are the reasons, as ``TORCH_LOGS=recompiles`` would print them.

Where each graph break happened in the user's code is read where Dynamo logs a break
(``InstructionTranslatorBase.log_graph_break``): the innermost frame of the break's user stack outside
torch, as ``TORCH_LOGS=graph_breaks`` would name it.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from collections import Counter
from typing import Any, Callable

from ..stats import GRAPH_BREAK_PLACE, GRAPH_BREAK_REASON, RECOMPILE_REASON
from . import patches

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
    """``InstructionTranslatorBase.log_graph_break``, noting each break's place in the user's code.

    torch 2.10's method is given no exception (``self, code_options, reason, user_stack``) and, as
    earlier releases, logs a data-dependent branch without counting it: it is wrapped as those are."""
    if "exc" not in inspect.signature(original).parameters:

        @functools.wraps(original)
        def logged(self: Any, code_options: Any, reason: str = "", user_stack: Any = None,
                   *args: Any, **kwargs: Any) -> Any:
            _logged(str(reason), user_stack)
            return original(self, code_options, reason, user_stack, *args, **kwargs)

        return logged

    @functools.wraps(original)
    def located(self: Any, *args: Any, **kwargs: Any) -> Any:
        exc = kwargs.get("exc", args[-1] if args else None)
        if exc is not None and not getattr(exc, "logged", False):
            try:
                place = _break_place(exc)
            except Exception:
                place = ""
            if place:
                with _lock:
                    _break_places[place] += 1
        return original(self, *args, **kwargs)

    return located


#: How torch <= 2.10 begins the reason it logs for a data-dependent branch, a break it counts nowhere.
_DATA_DEPENDENT = "Data-dependent branching"
#: Graph breaks torch logged without counting them (torch <= 2.10's data-dependent branches), by reason.
_uncounted: Counter[str] = Counter()


def wrap_module_log_graph_break(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch <= 2.9's module-level ``symbolic_convert.log_graph_break``: each break's place in the user's
    code, and each data-dependent branch counted as the graph break it is (those releases log it
    without counting it; later ones count it)."""

    @functools.wraps(original)
    def logged(code_options: Any, reason: str = "", exc_info: bool = False, user_stack: Any = None,
               *args: Any, **kwargs: Any) -> Any:
        _logged(str(reason), user_stack)
        return original(code_options, reason, exc_info, user_stack, *args, **kwargs)

    return logged


def _logged(reason: str, user_stack: Any) -> None:
    """One break logged by a torch that counts data-dependent branches nowhere (<= 2.10).

    torch 2.10 puts a paragraph of its own before the exception's message (``Encountered graph break
    when attempting to trace CALL: ...:``, a blank line, then the message): the place is named by the
    message, as on other releases."""
    head, _, rest = reason.partition("\n\n")
    message = rest if rest.strip() and head.rstrip().endswith(":") and "\n" not in head.strip() else reason
    try:
        place = _place(user_stack, message)
    except Exception:
        place = ""
    uncounted = reason.startswith(_DATA_DEPENDENT) and _compiles_a_partial_graph()
    with _lock:
        if place:
            _break_places[place] += 1
        if uncounted:
            _uncounted[reason] += 1


def _compiles_a_partial_graph() -> bool:
    """Whether the data-dependent branch being logged is one torch does not count: logged by the
    branch itself (``jump_graph_break``) in a translator that goes on to compile the
    graph so far. A translator that cannot (one inlining a call) raises instead, and the frame that
    made the call logs and counts that break as torch's own."""
    frame = sys._getframe(3)  # this function, _logged, the wrapper, then who logged
    if frame.f_code.co_name != "jump_graph_break":
        return False
    check = getattr(frame.f_locals.get("self"), "should_compile_partial_graph", None)
    try:
        return bool(check()) if check is not None else True
    except Exception:
        return True


def _break_place(exc: Any) -> str:
    """``file:line: first line of torch's reason`` for one graph break, the line the user's innermost frame."""
    return _place(getattr(exc, "real_stack", None), str(exc))


def _place(stack: Any, text: str) -> str:
    """``file:line: first line of the reason`` for a break whose user stack is ``stack`` (the tracing
    context's where that is empty)."""
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
    """``function (file:line): guard failure; ...`` for one recompile.

    A frame of torch's own (the wrapper Dynamo compiles around a ``torch.nn`` module) is named after
    the module and located at the user's call, the first frame outside torch on the stack."""
    code = getattr(frame, "f_code", None)
    if code is None:
        where = "a frame"
    elif _in_torch(code.co_filename):
        where = f"{_wrapped_name(frame) or code.co_name} (called at {_caller_outside_torch()})"
    else:
        where = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"
    failures = [str(r) for r in reasons] if isinstance(reasons, (list, tuple)) else [str(reasons)] if reasons else []
    return f"{where}: {'; '.join(failures) or 'torch found no guard failure'}"


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    return os.path.dirname(getattr(torch, "__file__", "") or "") + os.sep


def _in_torch(filename: str) -> bool:
    return filename.startswith(_torch_dir())


def _wrapped_name(frame: Any) -> str:
    """``Sequential.forward`` for the wrapper frame around a module (its ``fn``), else ``""``."""
    try:
        fn = (getattr(frame, "f_locals", None) or {}).get("fn")
    except Exception:
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
    """Dynamo's counts so far in this process, with one ``"<prefix><reason>"`` key per reason.

    Graph breaks add torch's ``graph_break`` counter (breaks Dynamo resumed after) and its
    ``unimplemented`` counter (breaks it could not resume from: a data-dependent branch, a break
    in a loop; the rest of the frame runs eagerly). An ``unimplemented`` entry that becomes a
    ``graph_break`` moves between them, so the sum counts it once. On torch <= 2.10, the
    data-dependent branches torch logs without counting are added (see :func:`_logged`).
    """
    from torch._dynamo.utils import counters

    stats = counters["stats"] if "stats" in counters else {}
    frames = counters["frames"] if "frames" in counters else {}
    breaks: Counter[str] = Counter()
    for group in ("graph_break", "unimplemented"):
        if group in counters:
            for reason, n in counters[group].items():
                breaks[str(reason)] += int(n)
    with _lock:
        breaks.update(_uncounted)
    out = {
        "dynamo.frames": int(frames.get("ok", 0)),
        "dynamo.graphs": int(stats.get("unique_graphs", 0)),
        "dynamo.graph_breaks": sum(breaks.values()),
        **{GRAPH_BREAK_REASON + reason: n for reason, n in breaks.items()},
    }
    with _lock:
        out["dynamo.recompiles"] = sum(_recompiles.values())
        out.update({RECOMPILE_REASON + reason: n for reason, n in _recompiles.items()})
        out.update({GRAPH_BREAK_PLACE + place: n for place, n in _break_places.items()})
    return out


def unobservable_fields() -> dict[str, str]:
    """``{"dynamo.<count>": reason}`` for the Dynamo counts this torch cannot keep."""
    if patches.took("get_and_maybe_log_recompilation_reasons"):
        return {}
    torch = str(getattr(sys.modules.get("torch"), "__version__", ""))
    return {"dynamo.recompiles": f"torch {torch}'s Dynamo has no recompilation-reason function to count recompiles at"}
