"""Progress of long work (a bundle's download or upload, the warmup) on a terminal, as pytest shows "collecting ...".

One line, rewritten in place while the work lasts and erased when it ends (the summary then says
what happened). Shown only by the process that owns the terminal (a run without xdist, the
controller), only while :meth:`Progress.showing` (so never inside a test's captured output), only on a
terminal, and not with ``-q -q``. Work shorter than a moment shows nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator

import pytest

from ..storage.client import Client
from ..storage.interface import BundleStore

#: A transfer shows progress once it has lasted this long (seconds); a fast one shows nothing.
TRANSFER_AFTER = 1.0
#: The warmup shows progress once it has lasted this long (seconds).
WARMUP_AFTER = 3.0
#: Seconds between two rewrites of the line.
INTERVAL = 0.5


class Progress:
    """The progress display of one process; shows nothing without a terminal (``terminal`` ``None``)."""

    def __init__(self, terminal: Any | None, name: str = "") -> None:
        self._terminal = terminal
        self.name = name
        self._on = False
        self._lock = threading.Lock()

    @classmethod
    def of_store(cls, config: pytest.Config, store: BundleStore | None) -> "Progress":
        """The display of a process that owns the terminal (live on a terminal, unless ``-q -q``), told
        of ``store``'s downloads and uploads (a bundle at a URL; a local path moves nothing)."""
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if terminal is None or not getattr(terminal, "isatty", False) or config.get_verbosity() < -1:
            terminal = None
        progress = cls(terminal, store.name if store is not None else "")
        progress.attach(store)
        return progress

    def attach(self, store: BundleStore | None) -> None:
        """Be told of ``store``'s downloads and uploads (a bundle at a URL; a local path moves nothing)."""
        client = getattr(store, "client", None)
        if isinstance(client, Client):
            client.progress = self

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

    @contextlib.contextmanager
    def warmup(self) -> Iterator[None]:
        """The warmup hook running."""
        with self._line(lambda elapsed: f"compilecache: pytest_compilecache_warmup running, {elapsed:.0f} s",
                        WARMUP_AFTER):
            yield

    @contextlib.contextmanager
    def _line(self, text: Callable[[float], str], after: float) -> Iterator[None]:
        """Rewrite ``text(seconds so far)`` from a thread of its own while the work inside runs; erase it at the end."""
        if not self._on or self._terminal is None:
            yield
            return
        stop = threading.Event()
        ticker = _Ticker(self._terminal, text, after, stop)
        thread = threading.Thread(target=ticker.run, name="compilecache-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            ticker.erase()


class _Ticker:
    """The thread that rewrites one progress line until told to stop."""

    def __init__(self, terminal: Any, text: Callable[[float], str], after: float, stop: threading.Event) -> None:
        self.terminal = terminal
        self.text = text
        self.after = after
        self.stop = stop
        self.start = time.monotonic()
        self.shown = False

    def run(self) -> None:
        if self.stop.wait(self.after):
            return
        writer = self.terminal._tw
        if writer.width_of_current_line:  # mid-line (the last test's dots): begin a line of our own
            writer.write("\n")
        while True:
            line = self.text(time.monotonic() - self.start)[: writer.fullwidth - 1]
            self.terminal.rewrite(line, erase=True)
            writer.flush()
            self.shown = True
            if self.stop.wait(INTERVAL):
                return

    def erase(self) -> None:
        """Blank the line (after the thread ended), leaving the cursor at its start."""
        if self.shown:
            self.terminal.rewrite("", erase=True)
            self.terminal._tw.write("\r")
            self.terminal._tw.flush()
