"""How long a store may take: every network operation runs against a deadline; one that passes is
said with the store, the operation and the wait, and the store is not asked again (the same message)."""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

from ..bundle.format import BundleError

#: Seconds a store may take to answer a request (connect and first byte), and to go on sending.
DEFAULT_TIMEOUT = 30.0
#: The slowest transfer rate waited for (bytes a second): a transfer of N bytes gets N / MIN_RATE
#: seconds more than the timeout, so a link trickling at twice this still works.
MIN_RATE = 25_000
#: How many times a read that failed or stalled midway is tried again, from a fresh read.
READ_ATTEMPTS = 3

T = TypeVar("T")


class StoreTimeout(BundleError):
    """A store did not answer within its deadline (or gave no answer earlier in this process)."""


class Deadlines:
    """The deadlines of one store's operations: ``timeout`` seconds, plus the time a transfer of its
    size takes at :data:`MIN_RATE`; after one passes, every later operation fails at once."""

    def __init__(self, name: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.name = name
        self.timeout = timeout
        #: The message of the deadline that passed ("" while the store answers); every later operation
        #: fails at once with it.
        self.gave_up: str = ""

    def seconds(self, size: int = 0) -> float:
        """The deadline of an operation moving ``size`` bytes."""
        return self.timeout + size / MIN_RATE

    def run(self, doing: str, action: Callable[[], T], size: int = 0) -> T:
        """``action()``, or :class:`StoreTimeout` if it has not returned within :meth:`seconds` (it is
        left to finish on its own, its result unused). Its own exceptions pass through."""
        if self.gave_up:
            raise StoreTimeout(self.gave_up)
        seconds = self.seconds(size)
        outcome: list[tuple[bool, object]] = []

        def attempt() -> None:
            try:
                outcome.append((True, action()))
            except BaseException as exc:  # handed to the caller's thread as it is
                outcome.append((False, exc))

        worker = threading.Thread(target=attempt, name=f"compilecache: {doing}", daemon=True)
        worker.start()
        worker.join(seconds)
        if not outcome:
            self.gave_up = (f"{self.name}: no answer within {seconds:.0f} s while {doing}; this session goes on "
                            "without it (--compile-cache-network-timeout sets the wait)")
            raise StoreTimeout(self.gave_up)
        ok, value = outcome[0]
        if not ok:
            assert isinstance(value, BaseException)
            raise value
        return value  # type: ignore[return-value]

    def retried(self, doing: str, action: Callable[[], T], transient: Callable[[BaseException], bool],
                size: int = 0) -> T:
        """:meth:`run` for a read: one that fails on the way (``transient``: a reset, a stall the
        client's own timeout caught) is tried again from the start, all within one deadline."""
        started = time.monotonic()
        budget = self.seconds(size)

        def attempts() -> T:
            for attempt in range(READ_ATTEMPTS):
                try:
                    return action()
                except Exception as exc:
                    left = budget - (time.monotonic() - started)
                    if attempt + 1 == READ_ATTEMPTS or not transient(exc) or left < 1.0:
                        raise
                    time.sleep(min(0.2 * 2 ** attempt, left / 4))
            raise AssertionError("unreachable")

        return self.run(doing, attempts, size)
