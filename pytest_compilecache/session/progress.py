"""Progress of long work (a bundle's transfer, the warmup) as one line rewritten in place, as pytest's "collecting ...":
only on this process's terminal, inside :meth:`Progress.showing` (never in a test's output), not with ``-q -q``."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator

import pytest

from ..storage.interface import BundleStore

#: Seconds a transfer, or the warmup, lasts before its progress shows (shorter work shows nothing).
TRANSFER_AFTER, WARMUP_AFTER = 1.0, 3.0
#: Seconds between two rewrites of the line.
INTERVAL = 0.5


class Progress:
    """The progress display of one process; shows nothing without a terminal (``terminal`` ``None``)."""

    def __init__(self, terminal: Any | None, name: str = "") -> None:
        self._terminal, self.name = terminal, name
        self._on = False

    @classmethod
    def of_store(cls, config: pytest.Config, store: BundleStore | None) -> "Progress":
        """The display of a process that owns the terminal (unless ``-q -q``), told of ``store``'s transfers."""
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if terminal is None or not getattr(terminal, "isatty", False) or config.get_verbosity() < -1:
            terminal = None
        progress = cls(terminal, store.name if store is not None else "")
        progress.attach(store)
        return progress

    def attach(self, store: BundleStore | None) -> None:
        """Be told of ``store``'s downloads and uploads (a bundle at a URL; a local path moves nothing)."""
        if store is not None:
            store.watch(self.transfer)

    @contextlib.contextmanager
    def showing(self) -> Iterator[None]:
        """Show progress of the work done inside (outside, nothing is shown)."""
        before, self._on = self._on, self._terminal is not None
        try:
            yield
        finally:
            self._on = before

    @contextlib.contextmanager
    def transfer(self, verb: str, total: int) -> Iterator[Callable[[int], None] | None]:
        """A download or upload of ``total`` bytes (0: unknown), as :class:`~..storage.interface.TransferProgress`
        (``None`` where nothing is shown: off a terminal, outside :meth:`showing`)."""
        if not self._on or self._terminal is None:
            yield None
            return
        moved = [0]

        def line(elapsed: float) -> str:
            size = f"{moved[0] / 1e6:.1f} of {total / 1e6:.1f} MB ({100 * moved[0] // total}%)" if total \
                else f"{moved[0] / 1e6:.1f} MB"
            if verb == "uploading":
                size = f"{total / 1e6:.1f} MB to" if total else "to"
                return f"compilecache: uploading {size} {self.name}, {elapsed:.0f} s"
            return f"compilecache: {verb} {self.name}: {size}, {elapsed:.0f} s"

        def update(n: int) -> None:
            moved[0] = n

        with self._line(line, TRANSFER_AFTER):
            yield update

    def warmup(self) -> contextlib.AbstractContextManager[None]:
        """The warmup hook running."""
        return self._line(lambda elapsed: f"compilecache: pytest_compilecache_warmup running, {elapsed:.0f} s",
                          WARMUP_AFTER)

    @contextlib.contextmanager
    def _line(self, text: Callable[[float], str], after: float) -> Iterator[None]:
        """Rewrite ``text(seconds so far)`` from a thread of its own while the work inside runs; erase it at the end."""
        terminal = self._terminal
        if not self._on or terminal is None:
            yield
            return
        stop, start, shown = threading.Event(), time.monotonic(), [False]

        def tick() -> None:
            if stop.wait(after):
                return
            writer = terminal._tw
            if writer.width_of_current_line:  # mid-line (the last test's dots): begin a line of our own
                writer.write("\n")
            while True:
                terminal.rewrite(text(time.monotonic() - start)[: writer.fullwidth - 1], erase=True)
                writer.flush()
                shown[0] = True
                if stop.wait(INTERVAL):
                    return

        thread = threading.Thread(target=tick, name="compilecache-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            if shown[0]:  # blank the line, leaving the cursor at its start
                terminal.rewrite("", erase=True)
                terminal._tw.write("\r")
                terminal._tw.flush()
