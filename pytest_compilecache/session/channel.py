"""What the xdist controller and a worker tell each other: one dataclass each way, in one place."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..report.model import ProcessReport

_KEY = "compilecache"


@dataclasses.dataclass(frozen=True)
class BundleAtStart:
    """What the session knew of its bundle before any test: whether it existed, and why it could not be read."""

    existed: bool = False
    problem: str = ""
    #: Whether ``problem`` is damage that ``--compile-cache-rebuild`` repairs in this session (no problem then).
    repaired: bool = False


@dataclasses.dataclass(frozen=True)
class ToWorker:
    """The controller to a new worker (``workerinput``): shared folder, bundle at start, run stamp, store's silence."""

    shared: str
    at_start: BundleAtStart
    run: float
    store_unreachable: str = ""

    def put(self, workerinput: dict[str, Any]) -> None:
        """Into a worker's ``workerinput``."""
        workerinput[_KEY] = dataclasses.asdict(self)

    @classmethod
    def get(cls, workerinput: dict[str, Any]) -> "ToWorker":
        """From this worker's ``workerinput`` (defaults where the controller said nothing)."""
        said = workerinput.get(_KEY) or {}
        return cls(said.get("shared", ""), BundleAtStart(**said.get("at_start", {})), said.get("run", time.time()),
                   said.get("store_unreachable", ""))


@dataclasses.dataclass(frozen=True)
class FromWorker:
    """A worker to the controller (``workeroutput``) at its end: what its bundle preparation did, and the artifacts
    it recorded with their key index (where it writes the bundle), as pytest-cov sends its data home."""

    process: ProcessReport
    artifacts: bytes | None = None
    index: bytes | None = None

    def put(self, workeroutput: dict[str, Any]) -> None:
        """Into this worker's ``workeroutput``."""
        workeroutput[_KEY] = {"process": self.process.to_json(), "artifacts": self.artifacts, "index": self.index}

    @classmethod
    def get(cls, workeroutput: dict[str, Any]) -> "FromWorker | None":
        """From a finished worker's ``workeroutput`` (``None`` where it said nothing: it crashed)."""
        said = workeroutput.get(_KEY)
        return cls(ProcessReport.from_json(said["process"]), said["artifacts"], said["index"]) if said else None
