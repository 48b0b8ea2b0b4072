"""The load-or-warm-up protocol: what a process does under the publishing lock (:class:`.warmup.Preparer` does it)."""

from __future__ import annotations

import enum

from .marker import Outcome


class Published(enum.Enum):
    """What the place the warmup publishes to holds for this machine, as read under the lock."""

    #: No bundle there (or none that could be read and may be rebuilt).
    NOTHING = "no bundle"
    #: A bundle with no entry for this machine.
    NO_ENTRY = "no entry for here"
    #: An entry for this machine written by an earlier run.
    EARLIER_ENTRY = "an entry of an earlier run"
    #: An entry for this machine written by this run (another process of this session published it).
    THIS_RUNS_ENTRY = "an entry of this run"


class Next(enum.Enum):
    """What the process does next."""

    SAY_FAILED = "say the warmup failed in another process, and do not run it again"
    LOAD_KEPT_APART = "load what the process that ran the warmup kept apart"
    LOAD_PUBLISHED = "load the published entry"
    NOTHING = "load nothing"
    WARM_UP = "run the warmup and publish"


def decide(marker: Outcome | None, published: Published, update: bool, rebuild: bool, to_path: bool) -> Next:
    """The step after taking the lock, from the session's warmup marker (``None``: no warmup ended yet), what the
    place holds, the session's flags and whether the warmup publishes to PATH itself (``to_path``): once a warmup
    ended, its outcome says what to load; before, an entry at PATH is loaded unless the session updates it."""
    if marker in (Outcome.FAILED, Outcome.KEPT_APART):
        return Next.SAY_FAILED if marker is Outcome.FAILED else Next.LOAD_KEPT_APART
    entry = published in (Published.EARLIER_ENTRY, Published.THIS_RUNS_ENTRY)
    usable = entry and not (rebuild and to_path and published is Published.EARLIER_ENTRY)
    appeared = entry and not update and to_path
    if marker is not None or appeared:
        return Next.LOAD_PUBLISHED if usable else Next.NOTHING
    return Next.WARM_UP
