"""How long a store may take: every network operation has a deadline; once one passes, the store is not asked again."""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar, cast

from ..bundle.format import BundleError

#: Seconds a store may take to answer a request (connect and first byte), and to go on sending.
DEFAULT_TIMEOUT = 30.0
#: The slowest transfer rate waited for (bytes a second): a transfer of N bytes gets N / MIN_RATE seconds more.
MIN_RATE = 25_000
#: How many times a read that failed or stalled midway is tried again, from a fresh read.
READ_ATTEMPTS = 3

T = TypeVar("T")


class StoreError(BundleError):
    """A store that failed to answer, or answered with an error: the network's or the server's fault, not a pack's."""


class StoreTimeout(StoreError):
    """A store did not answer within its deadline (or gave no answer earlier in this process)."""


class Deadlines:
    """The deadlines of one store's operations: ``timeout`` seconds, plus a transfer's time at :data:`MIN_RATE`."""

    def __init__(self, name: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.name = name
        self.timeout = timeout
        #: The message of the deadline that passed ("" while the store answers), with which every later operation fails.
        self.gave_up: str = ""

    def seconds(self, size: int = 0) -> float:
        """The deadline of an operation moving ``size`` bytes."""
        return self.timeout + size / MIN_RATE

    def run(self, doing: str, action: Callable[[], T], size: int = 0) -> T:
        """``action()``, or :class:`StoreTimeout` if it has not returned within :meth:`seconds` (it is left running)."""
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
            raise cast(BaseException, value)
        return value  # type: ignore[return-value]

    def retried(self, doing: str, action: Callable[[], T], transient: Callable[[BaseException], bool],
                size: int = 0) -> T:
        """:meth:`run`, trying ``action`` again where it fails on the way (``transient``), all within one deadline."""
        started = time.monotonic()
        budget = self.seconds(size)

        def attempts() -> T:
            for attempt in range(READ_ATTEMPTS - 1):
                try:
                    return action()
                except Exception as exc:
                    left = budget - (time.monotonic() - started)
                    if not transient(exc) or left < 1.0:
                        raise
                    time.sleep(min(0.2 * 2 ** attempt, left / 4))
            return action()

        return self.run(doing, attempts, size)
