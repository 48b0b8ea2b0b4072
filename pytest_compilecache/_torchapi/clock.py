"""The wall time a process spends compiling, as the user waits for it: the union of the main thread's
spans in Dynamo, C++ builds and loads, and Triton's compiles, loads and benchmarks on a kernel's first
launch (nested spans count once, and what torch's own frame timers leave out is in)."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from typing import Any, Callable, Iterator

_depth = 0
_started = 0.0
_total = 0.0
_main = threading.main_thread()


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """Count the time inside as compile time (once, however deeply nested)."""
    global _depth, _started, _total
    if threading.current_thread() is not _main:
        yield
        return
    if _depth == 0:
        _started = time.perf_counter()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            _total += time.perf_counter() - _started


def compile_seconds() -> float:
    """Wall seconds spent compiling on the main thread so far, including a span still open."""
    if _depth and threading.current_thread() is _main:
        return _total + time.perf_counter() - _started
    return _total


def wrap_timed(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original``, its calls counted as compile time."""

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        with compiling():
            return original(*args, **kwargs)

    return timed


def wrap_callbacks(install_callbacks: Callable[..., Any]) -> Callable[..., Any]:
    """Dynamo's ``callback_handler.install_callbacks`` (patched on the handler itself, since
    ``torch._dynamo.reset()`` clears registered callbacks): its span counted as compile time."""

    def timed_callbacks(*args: Any, **kwargs: Any) -> Any:
        inner = install_callbacks(*args, **kwargs)
        if not (hasattr(inner, "__enter__") and hasattr(inner, "__exit__")):
            raise TypeError(f"install_callbacks returned a {type(inner).__name__}, not a context manager")
        return _timed(inner)

    return timed_callbacks


@contextlib.contextmanager
def _timed(inner: Any) -> Iterator[None]:
    with compiling(), inner:
        yield
