"""A pytest plugin (``-p peak``) that writes its process's peak resident memory, in KiB, into ``$PEAK_OUT``
at exit: one file per process (the pytest process and each xdist worker)."""

from __future__ import annotations

import os
import resource


def pytest_unconfigure() -> None:
    """Write this process's largest resident set so far."""
    folder = os.environ.get("PEAK_OUT")
    if folder:
        with open(os.path.join(folder, f"peak-{os.getpid()}"), "w") as f:
            f.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
