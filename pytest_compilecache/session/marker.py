"""The session's warmup marker: what the process that ran the warmup hook made of it, read by the others."""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .. import files


class Outcome(enum.Enum):
    """How the session's warmup ended."""

    #: Its artifacts are in the bundle every process reads.
    PUBLISHED = "published"
    #: Its artifacts are in a bundle of the session's own, at ``detail`` (the store failed to take them).
    KEPT_APART = "kept apart"
    #: It compiled nothing to publish.
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
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, path: Path) -> None:
        note = {"outcome": self.outcome.value, "process": self.process, "detail": self.detail, "pid": os.getpid()}
        files.write_atomic(Path(path), json.dumps(note).encode(), fsync=False)
