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
import sys
import threading
import time
from typing import Any, Callable, Iterator

_depth = 0
_started = 0.0
_total = 0.0
_main = threading.main_thread()
_sources: list[str] = []


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


def _wrap_method(owner: Any, name: str) -> bool:
    method = owner.__dict__.get(name) if owner is not None else None
    if method is None or not callable(method) or getattr(method, "_compilecache", False):
        return method is not None

    def timed(*args: Any, **kwargs: Any) -> Any:
        with compiling():
            return method(*args, **kwargs)

    timed._compilecache = True  # type: ignore[attr-defined]
    timed.__wrapped__ = method  # type: ignore[attr-defined]
    setattr(owner, name, timed)
    return True


def install() -> list[str]:
    """Start counting (idempotent); returns the spans this torch lets us see."""
    if _sources:
        return list(_sources)
    import torch._dynamo

    handler = getattr(torch._dynamo, "callback_handler", None)
    install_callbacks = getattr(handler, "install_callbacks", None)
    if install_callbacks is not None:

        @contextlib.contextmanager
        def timed_callbacks(*args: Any, **kwargs: Any) -> Iterator[None]:
            with compiling(), install_callbacks(*args, **kwargs):
                yield

        # An attribute of the handler itself: torch._dynamo.reset() clears registered callbacks.
        setattr(handler, "install_callbacks", timed_callbacks)
        _sources.append("dynamo")
    else:
        convert_frame = sys.modules.get("torch._dynamo.convert_frame")
        compile_fn: Callable[..., Any] | None = getattr(convert_frame, "_compile", None)
        if compile_fn is not None:

            def timed_compile(*args: Any, **kwargs: Any) -> Any:
                with compiling():
                    return compile_fn(*args, **kwargs)

            setattr(convert_frame, "_compile", timed_compile)
            _sources.append("dynamo (frames only)")
    _sources.append("c++")
    try:
        from torch._inductor.runtime import triton_heuristics
    except Exception:  # no Triton, or a torch that cannot import it here
        return list(_sources)
    autotuner = getattr(triton_heuristics, "CachingAutotuner", None)
    for name in ("precompile", "benchmark_all_configs"):
        if _wrap_method(autotuner, name):
            _sources.append(f"triton {name}")
    return list(_sources)

