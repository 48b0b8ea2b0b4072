"""The one interface of a bundle store (a local path or a URL), the values its operations return, and opening one."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Callable, ContextManager, Mapping, Protocol

from ..bundle.format import Bundle, Entry, Unreadable


@dataclass(frozen=True)
class Transfer:
    """Bytes a store moved down and up; not ``counted`` for a local path."""

    counted: bool = False
    downloaded: int = 0
    uploaded: int = 0

    def since(self, earlier: "Transfer") -> "Transfer":
        """What was moved after ``earlier`` (the same store's figures, taken before)."""
        return replace(self, downloaded=self.downloaded - earlier.downloaded, uploaded=self.uploaded - earlier.uploaded)

    def to_json(self) -> dict[str, int]:
        """The report's form: empty where nothing is counted."""
        return {"downloaded": self.downloaded, "uploaded": self.uploaded} if self.counted else {}


class Written(enum.Enum):
    """Where :meth:`BundleStore.add` left the additions."""

    SAVED = "saved"
    #: The bundle already held every addition; nothing was written.
    UNCHANGED = "unchanged"


#: How :attr:`Saved.dropped` begins for an unreadable bundle written afresh (what ``--compile-cache-rebuild`` asks).
REPLACED_UNREADABLE = "it could not be read"


@dataclass(frozen=True)
class Saved:
    """What :meth:`BundleStore.add` did."""

    #: The bundle now holding the additions (open: close it): the one written, or the one that held them.
    bundle: Bundle
    status: Written = Written.SAVED
    #: The bundle's size in bytes (at a URL: every pack's).
    size: int = 0
    #: What was left out (entries not vouched for, an unreadable bundle replaced), in words.
    dropped: tuple[str, ...] = ()
    #: ``{artifact type: count}`` dropped as unused in too many updating runs.
    unused: dict[str, int] = field(default_factory=dict)
    transfer: Transfer = Transfer()
    #: Whether the additions held an artifact or binary the bundle lacked (False: a write recorded only usage).
    added: bool = True
    #: ``{artifact type: count}`` of artifacts under keys the bundle did not hold (``cpp``: carried binaries).
    added_artifacts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Look:
    """How a bundle looks, found cheaply (nothing downloaded, no payload read)."""

    #: For the session header: the bundle's name and what it is now.
    text: str
    exists: bool
    #: Why it cannot be read ("" when it can, or is missing).
    problem: str = ""
    #: What kind of problem that is, where the store can tell (``None``: none, or not known).
    unreadable: Unreadable | None = None


class BundleStore(Protocol):
    """A bundle at a local path or a URL: the only code that reads or writes it."""

    #: The bundle as messages show it (a URL without credentials).
    name: str
    #: The lock this machine's writers (and a session's warmup) hold, for messages.
    lock_file: str
    #: Whether reading or writing can fail for the store's sake (a network, a server), not the bundle's.
    may_be_unreachable: bool

    @property
    def unreachable(self) -> str:
        """Why this process no longer asks the store (no answer within its deadline); "" while it answers."""

    @property
    def transfer(self) -> Transfer:
        """What this store moved so far (take it before and after an operation: :meth:`Transfer.since`)."""

    def read(self, env: Mapping[str, str] | None = None) -> Bundle | None:
        """The bundle now (open: close it), or ``None`` if missing; with ``env``, only that entry need be read.
        At a URL nothing but the packs' tables is downloaded: each artifact and binary is read when asked for, or
        all of an entry's at once by :meth:`.format.Bundle.fetch_ahead`."""

    def locked(self) -> ContextManager[None]:
        """Hold this machine's writers' lock (reentrant in one thread); raises ``BundleError`` naming it."""

    def describe(self) -> Look:
        """How the bundle looks now, cheaply."""

    def add(self, additions: list[Entry], history: Mapping[str, object] | None = None, run: float | None = None,
            max_unused_runs: int = 0, rebuild: bool = False, counted: bool = True) -> Saved:
        """Merge ``additions`` into the bundle (see :func:`.merge.combine`); ``rebuild`` replaces one unreadable;
        ``counted``: ``run`` ran the whole suite, so it counts toward ``max_unused_runs`` (see :func:`.merge.stamp`).
        At a URL it uploads one pack of what the bundle lacks, and drops nothing as unused (``prune`` does); a run
        that adds nothing writes nothing, so it records no use and counts for nothing."""

    def update(self, change: Callable[[Bundle | None], list[Entry] | None],
               dropped: list[str] | None = None) -> Bundle | None:
        """Read the bundle whole, let ``change`` compute its entries (``None``: leave it), and write them so that
        they replace what was read (and nothing a writer added meanwhile). ``dropped``: an unreadable bundle (or
        pack) counts as empty, said there."""
