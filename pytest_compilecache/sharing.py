"""Bundle sharing for one session: load once, warm up once under a lock, save once, merge safely."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import filelock

from . import _torchapi
from .bundle import Bundle, BundleError, NotABundle, env_label, make_entry, read_manifest, write_bundle


@dataclass
class BundleReport:
    """What happened to the bundle in one process, sent from workers to the controller as JSON."""

    process: str = "main"
    status: str = "unused"
    reason: str = ""
    loaded: dict[str, int] = field(default_factory=dict)
    loaded_bytes: int = 0
    load_seconds: float = 0.0
    warmup_seconds: float | None = None
    warmup_stats: dict[str, Any] | None = None
    artifacts_file: str | None = None
    env: dict[str, str] | None = None
    history: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A plain dict for ``workeroutput``."""
        return dict(self.__dict__)


def lock_for(target: Path, timeout: float) -> filelock.FileLock:
    """The lock guarding ``target``: ``<target>.lock`` beside it."""
    return filelock.FileLock(str(target) + ".lock", timeout=timeout)


def acquire(lock: filelock.FileLock, timeout: float) -> None:
    """Take ``lock`` or raise :class:`BundleError` naming the lock file."""
    folder = Path(lock.lock_file).parent
    blocked = next((p for p in [folder, *folder.parents] if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise BundleError(f"{lock.lock_file}: cannot create the lock file: {blocked} is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=timeout)
    except filelock.Timeout:
        raise BundleError(
            f"{lock.lock_file}: could not take the lock within {timeout:g} s "
            "(another pytest process holds it; raise --compile-cache-lock-timeout)"
        ) from None
    except OSError as exc:
        raise BundleError(f"{lock.lock_file}: cannot create the lock file: {exc.strerror or exc}") from None


def read_if_present(path: Path) -> Bundle | None:
    """The bundle at ``path``, or ``None`` when there is no file."""
    try:
        return read_manifest(path)
    except FileNotFoundError:
        return None


class Preparer:
    """Brings one process's template cache folder up to date with the session's bundle, once.

    ``source`` is PATH (``None`` without one). ``publish`` is where a warmup's result goes: PATH when
    this session may write it, else a session-only file. Under the lock beside ``publish`` the first
    process runs the warmup and publishes; the others see the session's ``warmup_marker`` and load
    what was published. A process that dies holding the lock releases it, and the next one warms up.
    """

    def __init__(
        self,
        source: Path | None,
        publish: Path,
        update: bool,
        lock_timeout: float,
        template: Path,
        warmup_marker: Path,
        run_warmup: Callable[[Path | None], tuple[bytes | None, dict[str, Any], float]] | None,
    ) -> None:
        self.source = source
        self.publish = publish
        self.update = update
        self.lock_timeout = lock_timeout
        self.template = template
        self.warmup_marker = warmup_marker
        self.run_warmup = run_warmup
        self.report = BundleReport()

    def prepare(self, env: dict[str, str]) -> bool:
        """Fill the template folder; True when it holds a usable bundle entry."""
        self.report.env = env
        loaded = False
        try:
            bundle = read_if_present(self.source) if self.source is not None else None
            entry = bundle.find(env) if bundle is not None else None
            if bundle is None and self.source is not None:
                self.report.status, self.report.reason = "missing", f"{self.source}: does not exist yet"
            elif bundle is not None and entry is None:
                self._mismatch(bundle, env)
            if bundle is not None and entry is not None:
                loaded = self._load(bundle, entry)
                if loaded and not self.update:
                    return True
        except NotABundle as exc:
            self._problem(str(exc), "not a bundle")
        except BundleError as exc:
            self._problem(str(exc), "unusable")
        if self.run_warmup is None:
            if self.source is None:
                self.report.status = "none"
                self.report.reason = "no --compile-cache-bundle and no pytest_compilecache_warmup hook"
            return loaded
        try:
            return self._warm_up_once(env, loaded) or loaded
        except BundleError as exc:
            self._problem(str(exc), "unusable")
        except _torchapi.MegaCacheError as exc:
            self._problem(f"{self.publish}: could not publish the warmup's artifacts: {exc}", "unusable")
        return loaded

    def _problem(self, message: str, status: str) -> None:
        self.report.status = status
        self.report.reason = message
        self.report.problems.append(message)

    def _mismatch(self, bundle: Bundle, env: dict[str, str]) -> None:
        self._problem(bundle.mismatch(env), "incompatible")

    def _load(self, bundle: Bundle, entry: Any) -> bool:
        start = time.perf_counter()
        try:
            payload = bundle.payload(entry)
            shutil.rmtree(self.template, ignore_errors=True)
            self.template.mkdir(parents=True)
            loaded = _torchapi.load_artifacts(payload, str(self.template))
        except (BundleError, _torchapi.MegaCacheError) as exc:
            message = str(exc) if str(exc).startswith(str(bundle.path)) else f"{bundle.path}: {exc}"
            self._problem(message, "unusable")
            shutil.rmtree(self.template, ignore_errors=True)
            return False
        self.report.status = "loaded"
        self.report.reason = f"{bundle.path}: {env_label(entry.env)}"
        self.report.history = dict(entry.history)
        self.report.loaded = loaded
        self.report.loaded_bytes = len(payload)
        self.report.load_seconds = time.perf_counter() - start
        return True

    def _warm_up_once(self, env: dict[str, str], have_previous: bool) -> bool:
        assert self.run_warmup is not None
        lock = lock_for(self.publish, self.lock_timeout)
        acquire(lock, self.lock_timeout)
        try:
            current = read_if_present(self.publish)
            entry = current.find(env) if current is not None else None
            done_elsewhere = self.warmup_marker.exists()
            appeared = entry is not None and not self.update and self.publish == self.source
            if done_elsewhere or appeared:
                return entry is not None and self._load(current, entry)  # type: ignore[arg-type]
            data, stats, seconds = self.run_warmup(self.template if have_previous else None)
            self.report.warmup_seconds = seconds
            self.report.warmup_stats = stats
            if data is None:
                self.warmup_marker.write_text(json.dumps({"pid": os.getpid(), "published": False}))
                return False
            merged = merge_into(self.publish, current, env, [data], {"warmup_seconds": round(seconds, 3)})
            self.warmup_marker.write_text(json.dumps({"pid": os.getpid(), "published": True}))
            published = merged.find(env)
            return published is not None and self._load(merged, published)
        finally:
            lock.release()


def merge_into(
    target: Path, bundle: Bundle | None, env: dict[str, str], blobs: list[bytes], history: dict[str, Any]
) -> Bundle:
    """Write ``target`` with this environment's entry replaced by the union of its payload and ``blobs``.

    Entries of other environments are kept as they are; ``history`` adds to the entry's history
    without overwriting what an earlier session recorded. The caller holds the lock.
    """
    entries = list(bundle.entries) if bundle is not None else []
    previous = bundle.find(env) if bundle is not None else None
    parts = list(blobs)
    created = 0.0
    history = dict(history)
    if previous is not None:
        history.update(previous.history)
        assert bundle is not None
        try:
            parts.insert(0, bundle.payload(previous))
            created = previous.created
        except BundleError:
            pass
        entries.remove(previous)
    for other in entries:
        assert bundle is not None
        bundle.payload(other)
    payload = _torchapi.merge_artifacts(parts) if len(parts) > 1 else parts[0]
    entry = make_entry(env, payload, _torchapi.describe_artifacts(payload), created)
    entry.history = history
    result = Bundle(target, entries + [entry])
    write_bundle(result)
    return result
