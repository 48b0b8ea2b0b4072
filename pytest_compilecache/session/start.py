"""What a session checks and says before any test: the bundle's state, the remote cache, strict mode's checks."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pytest

from .. import _torchapi
from ..bundle import signing
from ..bundle.format import BundleError, Unreadable
from ..environment import caches_disabled_by_env
from ..report.model import Concern, Problem, ProcessReport, SessionReport, Status
from ..storage.interface import BundleStore
from ..storage.stores import open_store
from ..storage.urls import redacted
from . import remote
from .channel import BundleAtStart
from .options import Isolation, Options


def open_bundle_store(options: Options, unreachable: str = "") -> BundleStore | None:
    """The session's bundle store (``None`` without a bundle); ``unreachable``: why the controller stopped asking it."""
    where = options.bundle_url or options.bundle
    return None if where is None else open_store(where, options.lock_timeout, options.home / "bundle-copies",
                                                 options.storage_options, options.network_timeout, unreachable)


def describe(store: BundleStore | None, report: SessionReport, rebuild: bool = False) -> BundleAtStart:
    """How the bundle looks now, without torch and without a download (in words: ``report.bundle_at_start``);
    with ``rebuild``, damage is what the session repairs, said here once."""
    if store is None:
        return BundleAtStart()
    look = store.describe()  # a problem's reason is said once, as a PROBLEM in the summary
    report.bundle_existed = look.exists
    repaired = bool(look.problem) and rebuild and look.unreadable is Unreadable.DAMAGED
    report.bundle_at_start = (f"{look.problem}; --compile-cache-rebuild writes a fresh one" if repaired else
                              f"{store.name}: cannot be used (see PROBLEM in the compilecache summary)"
                              if look.problem else look.text)
    return BundleAtStart(look.exists, look.problem, repaired)


def header_lines(options: Options, report: SessionReport, process: ProcessReport | None, level: int) -> list[str]:
    """The lines under pytest's header: by default one, naming what the user set up (none where nothing is); with
    ``level`` 1 (``-v``) also what is off; a warning always."""
    mode = {Isolation.OFF: "off", Isolation.TEST: "a cache per test",
            Isolation.WORKER: "a kept cache per worker"}[options.isolation]
    said = [f"bundle {report.bundle_at_start}"] if options.has_bundle else []
    if signing.key() and options.has_bundle:
        said.append(f"bundles are signed and checked with {signing.KEY_ENV}")
    elif level > 0 and options.has_bundle:
        said.append(f"bundles are unsigned (set {signing.KEY_ENV} to sign and check them)")
    if options.isolation is not Isolation.OFF or level > 0:
        said.append(f"isolation: {mode}")
    if options.remote is not None:
        state = f"UNREACHABLE: {report.remote_problem}" if report.remote_problem else "reachable"
        said.append(f"remote cache {redacted(options.remote)} (FX graph, AOTAutograd, autotune): {state}")
    if level > 0 and process is not None and process.status is not Status.UNUSED:
        said.append(f"bundle {process.status.value}: {process.reason}")
    lines = ([f"compilecache: {said[0]}" + "".join(f"; {part}" for part in said[1:])] if said and level <= 0
             else [f"compilecache: {part}" for part in said])
    return lines + [f"compilecache: WARNING: {line}; cache assertions are meaningless"
                    for line in caches_disabled_by_env()]


def _entry_problems(store: BundleStore, process_dir: Path, report: SessionReport) -> list[str]:
    """Strict mode's check that PATH has an intact entry for this machine (what it downloads is noted in ``report``)."""
    before = store.transfer
    try:
        _torchapi.bootstrap(str(process_dir))
        here = _torchapi.environment_fingerprint()
        bundle = store.read(here)
        if bundle is None:
            return []
        with bundle:
            entry = bundle.find(here)
            if entry is None:
                return [bundle.mismatch(here)]
            secret = signing.key()
            if refused := bundle.signature_problem(entry, secret) if secret else "":
                return [refused]
            bundle.check(entry)
    except (BundleError, _torchapi.TorchUnavailable) as exc:
        return [str(exc)]
    finally:
        report.checked_downloaded = store.transfer.since(before).downloaded
    return []


def check_remote(options: Options, report: SessionReport) -> None:
    """Ask the remote cache's server for a PING before any test: torch hides a server it cannot reach."""
    url = options.remote
    if url is not None and (why := remote.unreachable(url)):
        report.remote_problem = why
        report.problems.append(Problem(Concern.REMOTE, f"remote cache {redacted(url)} is unreachable ({why}); torch "
                                       "switches its remote cache off in silence, so every remote lookup misses",
                                       redacted(url)))
        strict_failure(options, report.problems[-1:], "remote cache")


def check_at_start(options: Options, store: BundleStore | None, at_start: BundleAtStart, process_dir: Path,
                   report: SessionReport) -> None:
    """In strict mode, stop before any test when PATH is unreadable or has no intact entry for here (unless rebuilt)."""
    if options.strict and store is not None and not options.rebuild:
        strict_failure(options, [at_start.problem] if at_start.problem
                       else _entry_problems(store, process_dir, report) if at_start.existed else [])


def strict_failure(options: Options, problems: Sequence[Problem | str], what: str = "bundle") -> None:
    if options.strict and problems:
        raise pytest.UsageError(f"--compile-cache-strict: {what} problem at session start:\n  "
                                + "\n  ".join(map(str, problems)))
