"""The load-or-warm-up protocol: the session's warmup marker, and what a process does under the publishing lock
(:class:`.preparation.BundlePreparation` does it)."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path

from .. import files
from ..caught import caught


class Outcome(enum.Enum):
    """How the session's warmup ended."""

    #: Its artifacts are in the bundle every process reads.
    PUBLISHED = "published"
    #: Its artifacts are in a bundle of the session's own, at ``detail`` (the store failed to take them).
    KEPT_APART = "kept apart"
    NOTHING = "nothing"
    #: The hook raised; ``detail`` is the error.
    FAILED = "failed"


@dataclass(frozen=True)
class WarmupMarker:
    """One warmup's outcome, written once by the process that ran it, atomically."""

    outcome: Outcome
    process: str
    detail: str = ""

    @classmethod
    def read(cls, path: Path) -> WarmupMarker | None:
        """The marker at ``path``; ``None`` while no warmup has ended (or the file is not a marker)."""
        try:
            data = json.loads(Path(path).read_text())
            return cls(Outcome(data["outcome"]), str(data.get("process", "")), str(data.get("detail", "")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:  # taken as no warmup ended: it runs again
            caught("reading the session's warmup marker", exc)
            return None

    def write(self, path: Path) -> None:
        note = {"outcome": self.outcome.value, "process": self.process, "detail": self.detail}
        files.write_atomic(Path(path), json.dumps(note).encode(), fsync=False)


class Published(enum.Enum):
    """What the place the warmup publishes to holds for this machine, as read under the lock."""

    #: No bundle there (or none that could be read and may be rebuilt).
    NOTHING = "no bundle"
    NO_ENTRY = "no entry for here"
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
