"""What the xdist controller and a worker tell each other, all in one place: the session's bundle, one dataclass each
way."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from . import files
from .bundle.keyindex import KeyIndex, KeyIndexError
from .caught import caught
from .report.model import Concern, Problem, ProcessReport

#: Above this many bytes, a worker's artifacts go home as a file: execnet refuses a message over 2 GiB.
INLINE_LIMIT = 1 << 30

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
    it recorded with their key index (where it writes the bundle), as pytest-cov sends its data home; artifacts
    over :data:`INLINE_LIMIT` go as a file in the session's shared folder, which the controller checks it can read."""

    process: ProcessReport
    own: tuple[bytes, KeyIndex] | None = None

    def put(self, workeroutput: dict[str, Any], shared: Path) -> None:
        """Into this worker's ``workeroutput`` (large artifacts into a file in ``shared``)."""
        artifacts, index = (self.own[0], self.own[1].pack()) if self.own else (None, None)
        said: dict[str, Any] = {"index": index}
        if artifacts is not None and len(artifacts) > INLINE_LIMIT:
            path = shared / f"artifacts-{self.process.process}"
            try:
                files.write_atomic(path, artifacts, fsync=False)
                said["artifacts_file"] = str(path)
            except OSError as exc:
                self.process.problems.append(Problem(Concern.SAVING, f"{path}: {self.process.process}'s "
                                                     f"{len(artifacts):,d} bytes of artifacts could not be written "
                                                     f"for the controller: {exc.strerror or exc}; not saved", str(path)))
            artifacts = None
        workeroutput[_KEY] = {**said, "process": self.process.to_json(), "artifacts": artifacts}

    @classmethod
    def get(cls, workeroutput: dict[str, Any]) -> "FromWorker | None":
        """From a finished worker's ``workeroutput`` (``None`` where it said nothing: it crashed)."""
        said = workeroutput.get(_KEY)
        if not said:
            return None
        process = ProcessReport.from_json(said["process"])
        if said.get("artifacts_file"):
            path = Path(said["artifacts_file"])
            try:
                said = {**said, "artifacts": path.read_bytes()}
            except OSError as exc:
                process.problems.append(Problem(Concern.SAVING, f"{path}: {process.process}'s artifacts, too large "
                                                f"to send inline, cannot be read here: {exc.strerror or exc}; "
                                                "not saved", str(path)))
            else:
                try:
                    path.unlink()
                except OSError as exc:  # the session's shared folder goes at its end
                    caught("removing a worker's artifacts file", exc)
        if said["artifacts"] is None:
            return cls(process, None)
        try:
            index = KeyIndex.unpack(said["index"])
        except KeyIndexError as exc:  # the artifacts are still the worker's; only their key details are lost
            caught("reading a worker's key index", exc)
            index = KeyIndex()
        return cls(process, (said["artifacts"], index))
