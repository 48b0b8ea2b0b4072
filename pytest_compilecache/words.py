"""How counts are said in messages: ``1 environment``, ``2 environments``."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1."""
    return f"{n:,d} {noun}" if n == 1 else f"{n:,d} {noun}s"
