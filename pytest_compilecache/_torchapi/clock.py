"""The wall time a process spends compiling, as the user waits for it.

Counted on the main thread, as the union of the spans in which it is compiling: Dynamo compiling a
frame or a lazy backward (torch's compile callbacks, which fire once for nested compiles), waiting
for and loading a C++ binary, Triton compiling, loading or benchmarking kernels on their first
launch. Nested spans count once, so the figure never exceeds the time the thread was busy, and it
includes what torch's own frame timers leave out (C++ builds and kernel loads deferred to the first
call).
"""

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


def _enter() -> None:
    global _depth, _started
    if threading.current_thread() is not _main:
        return
    if _depth == 0:
        _started = time.perf_counter()
    _depth += 1


def _leave() -> None:
    global _depth, _total
    if threading.current_thread() is not _main or _depth == 0:
        return
    _depth -= 1
    if _depth == 0:
        _total += time.perf_counter() - _started


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """Count the time inside as compile time (once, however deeply nested)."""
    _enter()
    try:
        yield
    finally:
        _leave()


def seconds() -> float:
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

    @contextlib.contextmanager
    def timed_callbacks(*args: Any, **kwargs: Any) -> Iterator[None]:
        with compiling(), install_callbacks(*args, **kwargs):
            yield

    return timed_callbacks

