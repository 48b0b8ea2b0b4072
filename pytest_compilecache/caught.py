"""Errors the plugin caught and went on past: counted per place in each process, said under ``-v`` and in the JSON
report, so that a degradation nobody is told of as a problem is still seen."""

from __future__ import annotations

import threading
from collections import Counter

_counts: Counter[str] = Counter()
_lock = threading.Lock()


def caught(where: str, error: BaseException) -> None:
    """Count ``error``, caught while ``where`` (a few words: what the plugin went on without)."""
    with _lock:
        _counts[f"{where} ({type(error).__name__})"] += 1


def counts() -> dict[str, int]:
    """This process's counts so far, by place and error type."""
    with _lock:
        return dict(_counts)


def since(before: dict[str, int]) -> dict[str, int]:
    """The counts added since ``before`` (an earlier :func:`counts`): one session's, in a process that runs several."""
    return {where: n - before.get(where, 0) for where, n in counts().items() if n > before.get(where, 0)}
