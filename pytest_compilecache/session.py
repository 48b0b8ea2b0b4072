"""The plugin's state for one pytest process: options, folders, bundle sharing, per-test counts.

One class per role, chosen once: :class:`CompileCacheSession` for a single process (also the
base), :class:`ControllerSession` for the xdist controller, :class:`WorkerSession` for a worker.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from . import _torchapi
from .bundle import BundleError, NotABundle, read_manifest
from .cache import CompileCache
from .environment import SavedEnv, caches_disabled_by_env, point_cache_dirs_at
from .sharing import BundleReport, Preparer, acquire, lock_for, merge_into, read_if_present
from .stats import CacheStats, stats_from_counts

REPORT_FORMAT = 1
DEFAULT_LOCK_TIMEOUT = 900.0
_WORKER_KEY = "compilecache"


class Options:
    """The plugin's settings, resolved once: CLI over environment over ini."""

    def __init__(self, config: pytest.Config) -> None:
        def pick(option: str, env: str | None, ini: str) -> Any:
            value = config.getoption(option)
            if value is None and env and os.environ.get(env):
                value = os.environ[env]
            if value is None:
                value = config.getini(ini)
            return value

        self.isolate_all = bool(pick("compile_cache_isolate", None, "compile_cache_isolate"))
        bundle = pick("compile_cache_bundle", "PYTEST_COMPILE_CACHE_BUNDLE", "compile_cache_bundle")
        self.bundle: Path | None = Path(bundle).expanduser().absolute() if bundle else None
        self.update = bool(pick("compile_cache_update", None, "compile_cache_update"))
        self.strict = bool(pick("compile_cache_strict", None, "compile_cache_strict"))
        timeout = pick("compile_cache_lock_timeout", None, "compile_cache_lock_timeout")
        try:
            self.lock_timeout = float(timeout) if timeout not in (None, "") else DEFAULT_LOCK_TIMEOUT
        except ValueError:
            raise pytest.UsageError(f"compile_cache_lock_timeout must be a number of seconds, not {timeout!r}") from None
        report = pick("compile_cache_report", None, "compile_cache_report")
        self.report: Path | None = Path(report).expanduser().absolute() if report else None
        self.headers_dir: str = config.getini("compile_cache_headers_dir")

    @property
    def active(self) -> bool:
        """Whether anything session-wide was asked for (else only fixtures do work)."""
        return self.isolate_all or self.bundle is not None or self.report is not None


class CompileCacheSession:
    """A single pytest process (no xdist): runs the tests, shares the bundle, saves and reports."""

    def __init__(self, config: pytest.Config, options: Options, shared: Path | None = None) -> None:
        self.config = config
        self.options = options
        self._root: Path | None = None
        self._count = 0
        self._headers_dir: Path | None = None
        self._saved_env: SavedEnv | None = None
        self._shared = shared
        self._owns_shared = shared is None
        self._prepared: bool | None = None
        self._preparer: Preparer | None = None
        self._test_start: dict[str, tuple[dict[str, int], float]] = {}
        self.tests: dict[str, dict[str, Any]] = {}
        self.totals: CacheStats | None = None
        self.compile_seconds = 0.0
        self.reports: list[dict[str, Any]] = []
        self.saved: dict[str, Any] = {}
        self.problems: list[str] = []
        self.bundle_at_start = ""
        self.bundle_existed = False
        self.start_problem = ""

    # --- folders ---

    @property
    def root(self) -> Path:
        """This process's own folder: per-test cache dirs, the template, the session cache."""
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="pytest-compilecache-"))
        return self._root

    @property
    def shared(self) -> Path:
        """The folder all processes of this session share (created by the controller)."""
        if self._shared is None:
            self._shared = Path(tempfile.mkdtemp(prefix="pytest-compilecache-shared-"))
        return self._shared

    @property
    def headers_dir(self) -> Path:
        """Where precompiled C++ headers go: ini ``compile_cache_headers_dir``, else ``.pytest_cache``."""
        if self._headers_dir is None:
            cache = getattr(self.config, "cache", None)
            if self.options.headers_dir:
                self._headers_dir = Path(self.options.headers_dir).expanduser().absolute()
            elif cache is not None:
                self._headers_dir = cache.mkdir("compilecache") / "precompiled_headers"
            else:
                self._headers_dir = self.root / "precompiled_headers"
        return self._headers_dir

    @property
    def session_cache(self) -> Path:
        """Where compiles outside fixtures go when isolation or a bundle is on."""
        return self.root / "session-cache"

    # --- lifecycle ---

    def configure(self) -> None:
        """Before collection: point compiles outside fixtures at a folder of this process's own."""
        if self.options.isolate_all or self.options.bundle is not None:
            self._saved_env = SavedEnv()
            point_cache_dirs_at(str(self.session_cache))

    def sessionstart(self) -> None:
        """Check PATH without torch; with a PATH, load or build the bundle before any test runs."""
        self._describe_path()
        self._prepare_at_start()

    def _prepare_at_start(self, fail: bool = True) -> None:
        """With a PATH, prepare the bundle; ``fail``: stop the session on a strict-mode problem."""
        if self.options.bundle is None:
            return
        try:
            self.prepare()
        except _torchapi.TorchUnavailable as exc:
            if fail:
                raise pytest.UsageError(f"--compile-cache-bundle: {exc}") from None
            self.problems.append(f"--compile-cache-bundle: {exc}")
            return
        if fail:
            self._fail_if_strict(self.preparer_report.problems, "at session start")

    def _describe_path(self) -> None:
        """Read PATH's manifest (no torch needed) and remember how it looked at session start."""
        path = self.options.bundle
        if path is None:
            return
        self.bundle_existed = path.exists() or path.is_symlink()
        try:
            bundle = read_manifest(path)
        except FileNotFoundError:
            self.bundle_at_start = f"{path}: missing, the session will create it"
            return
        except BundleError as exc:
            self.bundle_at_start = self.start_problem = str(exc)
            return
        size = path.stat().st_size
        self.bundle_at_start = f"{path}: {len(bundle.entries)} environment(s), {size / 1e6:.1f} MB"

    def close(self) -> None:
        """Restore the environment and remove this process's folders."""
        if self._saved_env is not None:
            self._saved_env.restore()
            self._saved_env = None
        for folder, owned in ((self._root, True), (self._shared, self._owns_shared)):
            if folder is not None and owned:
                shutil.rmtree(folder, ignore_errors=True)
        self._root = None

    def _fail_if_strict(self, problems: list[str], when: str) -> None:
        if self.options.strict and problems:
            raise pytest.UsageError(
                f"--compile-cache-strict: bundle problem {when}:\n  " + "\n  ".join(problems)
            )

    # --- caches for tests ---

    def new_cache(self, nodeid: str, kind: str = "cold") -> CompileCache:
        """A fresh, not yet active :class:`CompileCache` in a new folder named after the test."""
        self._count += 1
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.rsplit("::", 1)[-1])[:60]
        path = self.root / "tests" / f"{self._count:05d}-{name}"
        return CompileCache(path, self.root / "process", self.headers_dir, kind=kind)

    def warm_template(self) -> Path | None:
        """The loaded bundle's folder (preparing it on first use), or ``None`` with no usable bundle."""
        return self.root / "template" if self.prepare() else None

    @property
    def preparer_report(self) -> BundleReport:
        """What bundle preparation did in this process."""
        return self._preparer.report if self._preparer is not None else BundleReport()

    def prepare(self) -> bool:
        """Load (or warm up and publish) the bundle once per process."""
        if self._prepared is None:
            _torchapi.bootstrap(str(self.root / "process"))
            hook = self.config.hook.pytest_compilecache_warmup
            has_warmup = bool(hook.get_hookimpls())
            bundle = self.options.bundle
            publish = bundle if bundle is not None and self._may_write() else self.shared / "session.bundle"
            self._preparer = Preparer(
                source=bundle,
                publish=publish,
                update=self.options.update,
                lock_timeout=self.options.lock_timeout,
                template=self.root / "template",
                warmup_marker=self.shared / "warmup-done",
                run_warmup=self._run_warmup if has_warmup else None,
            )
            self._prepared = self._preparer.prepare(_torchapi.environment_fingerprint())
            if self._prepared and self._saved_env is not None and not self.options.isolate_all:
                shutil.copytree(self.root / "template", self.session_cache, dirs_exist_ok=True)
        return self._prepared

    def _run_warmup(self, previous: Path | None) -> tuple[bytes | None, dict[str, Any], float]:
        cache = self.new_cache("warmup", "warmup")
        if previous is not None:
            shutil.copytree(previous, cache.path, dirs_exist_ok=True)
        start = time.perf_counter()
        with _torchapi.fresh_recording():
            with cache:
                self.config.hook.pytest_compilecache_warmup(cache=cache)
            data = _torchapi.save_artifacts()
        return data, cache.stats.to_dict(), time.perf_counter() - start

    # --- per-test counts ---

    def test_started(self, nodeid: str) -> None:
        """Take the counters' starting point for a test."""
        loaded = "torch._dynamo.utils" in sys.modules
        self._test_start[nodeid] = (_torchapi.read_counts() if loaded else {}, _torchapi.compile_seconds())

    def test_finished(self, nodeid: str) -> dict[str, Any] | None:
        """This test's per-layer counts and compile seconds, or ``None`` if torch's compiler never loaded."""
        start = self._test_start.pop(nodeid, None)
        if start is None or "torch._dynamo.utils" not in sys.modules:
            return None
        counts, seconds = start
        now = _torchapi.read_counts()
        delta = {k: v - counts.get(k, 0) for k, v in now.items()}
        result: dict[str, Any] = stats_from_counts(delta, _torchapi.unobservable_layers()).to_dict()
        result["compile_seconds"] = round(_torchapi.compile_seconds() - seconds, 4)
        return result

    def add_test_report(self, nodeid: str, stats: dict[str, Any]) -> None:
        """Record a test's counts (from this process or from a worker's report)."""
        self.tests[nodeid] = stats
        self.compile_seconds += float(stats.get("compile_seconds", 0.0))
        current = CacheStats.from_dict(stats)
        self.totals = current if self.totals is None else self.totals + current

    # --- the end ---

    def finish(self) -> None:
        """Save this process's artifacts, merge them into the bundle, write the JSON report."""
        blob = self._save_own_artifacts()
        if self._preparer is not None:
            self.reports.append(self._preparer.report.to_json())
        env = self.preparer_report.env
        self.finish_bundle([blob] if blob else [], env)
        self.write_report()

    def _save_own_artifacts(self) -> bytes | None:
        if "torch._dynamo" not in sys.modules or self.options.bundle is None:
            return None
        try:
            return _torchapi.save_artifacts()
        except Exception as exc:  # torch failing to serialize must not lose the session's results
            self.problems.append(f"could not save this process's compile artifacts: {exc}")
            return None

    def finish_bundle(self, blobs: list[bytes], env: dict[str, str] | None) -> None:
        """Merge ``blobs`` into PATH under its lock, if this session may write PATH."""
        path = self.options.bundle
        if path is None:
            return
        if not self._may_write():
            self.saved = {"status": "kept", "reason": "PATH existed; add --compile-cache-update to merge into it"}
            return
        if not blobs or env is None:
            self.saved = {"status": "nothing to save", "reason": "nothing was compiled or used"}
            return
        lock = lock_for(path, self.options.lock_timeout)
        start = time.perf_counter()
        try:
            _torchapi.bootstrap(str(self.root / "process"))
            acquire(lock, self.options.lock_timeout)
            try:
                current = read_if_present(path)
                merged = merge_into(path, current, env, blobs, self._history())
            finally:
                lock.release()
        except NotABundle as exc:
            self._save_problem(f"{exc}; it was left alone")
            return
        except (BundleError, _torchapi.MegaCacheError, _torchapi.TorchUnavailable) as exc:
            self._save_problem(str(exc) if str(path) in str(exc) else f"{path}: {exc}")
            return
        entry = merged.find(env)
        assert entry is not None
        self.saved = {
            "status": "saved",
            "path": str(path),
            "artifacts": entry.artifacts,
            "bytes": path.stat().st_size,
            "seconds": round(time.perf_counter() - start, 3),
        }

    def _history(self) -> dict[str, Any]:
        warmup = sum(r.get("warmup_seconds") or 0.0 for r in self.reports)
        return {"built_compile_seconds": round(self.compile_seconds + warmup, 3)}

    def _may_write(self) -> bool:
        """PATH may be written when it did not exist at session start, or with --compile-cache-update."""
        return self.options.update or not self.bundle_existed

    def _save_problem(self, message: str) -> None:
        self.saved = {"status": "failed", "reason": message}
        self.problems.append(message)

    def exit_status(self) -> int | None:
        """A non-zero exit status when strict mode saw a problem, else ``None``."""
        if self.options.strict and (self.problems or any(r.get("problems") for r in self.reports)):
            return pytest.ExitCode.TESTS_FAILED
        return None

    def write_report(self) -> None:
        """Write ``--compile-cache-report`` as JSON."""
        path = self.options.report
        if path is None:
            return
        data = {
            "format": REPORT_FORMAT,
            "totals": {**(self.totals or CacheStats()).to_dict(), "compile_seconds": round(self.compile_seconds, 3)},
            "tests": self.tests,
            "bundle": self.bundle_summary(),
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except OSError as exc:
            self.problems.append(f"{path}: cannot write the report: {exc.strerror or exc}")

    def bundle_summary(self) -> dict[str, Any]:
        """The bundle's story for this session: at start, per process, and at the end."""
        return {
            "path": str(self.options.bundle) if self.options.bundle else None,
            "at_start": self.bundle_at_start,
            "processes": self.reports,
            "saved": self.saved,
            "problems": list(dict.fromkeys(self.problems + [p for r in self.reports for p in r.get("problems", [])])),
        }

    # --- terminal output ---

    def _compile_time_line(self) -> str:
        warmup = sum(r.get("warmup_seconds") or 0.0 for r in self.reports)
        line = f"compile time in tests: {self.compile_seconds:.1f} s (summed over workers)"
        if warmup:
            line += f", plus {warmup:.1f} s in the warmup"
        built = next((r["history"].get("built_compile_seconds") for r in self.reports
                      if r.get("history", {}).get("built_compile_seconds")), None)
        if built and not warmup:
            total = self.compile_seconds
            ratio = f", {built / total:.1f}x less" if total > 0 else ""
            line += f"; the cold run that built the bundle compiled for {built:.1f} s{ratio}"
        return line

    def header(self) -> list[str]:
        """Lines for pytest's header: isolation, the bundle, and what disables caches."""
        lines = [f"compilecache: isolation of every test: {'on' if self.options.isolate_all else 'off'}"]
        if self.options.bundle is not None:
            lines.append(f"compilecache: bundle {self.bundle_at_start}")
            report = self.preparer_report
            if report.status != "unused":
                lines.append(f"compilecache: bundle {report.status}: {report.reason}")
        lines.extend(
            f"compilecache: WARNING: {line}; cache assertions are meaningless" for line in caches_disabled_by_env()
        )
        return lines

    def summary(self) -> list[str]:
        """The terminal summary: per-layer totals, and what was loaded, warmed up and saved."""
        if not self.options.active and self.totals is None:
            return []
        lines = ["per-layer totals over all tests (summed over workers):"]
        lines.append((self.totals or CacheStats()).table())
        lines.append(self._compile_time_line())
        for report in self.reports:
            if report.get("status") in (None, "unused"):
                continue
            loaded = ", ".join(f"{n} {k}" for k, n in report.get("loaded", {}).items()) or "nothing"
            line = f"bundle ({report.get('process', 'main')}): {report['status']}: {report.get('reason', '')}"
            lines.append(line)
            if report.get("loaded"):
                lines.append(
                    f"  loaded {loaded} ({report['loaded_bytes'] / 1e6:.2f} MB in {report['load_seconds']:.2f} s)"
                )
            if report.get("warmup_seconds") is not None:
                lines.append(f"  warmup ran here: {report['warmup_seconds']:.1f} s")
        if self.saved:
            if self.saved.get("status") == "saved":
                arts = ", ".join(f"{v['count']} {k}" for k, v in self.saved["artifacts"].items())
                lines.append(
                    f"bundle saved: {self.saved['path']}: {arts} ({self.saved['bytes'] / 1e6:.2f} MB "
                    f"in {self.saved['seconds']:.2f} s)"
                )
            else:
                lines.append(f"bundle {self.saved['status']}: {self.saved.get('reason', '')}")
        for problem in self.bundle_summary()["problems"]:
            lines.append(f"PROBLEM: {problem}")
        return lines




class WorkerSession(CompileCacheSession):
    """An xdist worker: runs tests, and hands its artifacts and bundle report to the controller."""

    def sessionstart(self) -> None:
        """Load or build the bundle; strict problems are found by the controller, before workers start."""
        self._prepare_at_start(fail=False)

    def finish(self) -> None:
        blob = self._save_own_artifacts()
        report = self.preparer_report
        report.process = str(getattr(self.config, "workerinput", {}).get("workerid", "worker"))
        if blob is not None:
            path = self.shared / f"artifacts-{os.getpid()}-{uuid.uuid4().hex[:8]}.bin"
            path.write_bytes(blob)
            report.artifacts_file = str(path)
        report.problems.extend(self.problems)
        self.config.workeroutput[_WORKER_KEY] = report.to_json()  # type: ignore[attr-defined]


class ControllerSession(CompileCacheSession):
    """The xdist controller: creates the shared folder, merges workers' artifacts once, reports."""

    def sessionstart(self) -> None:
        """Check PATH before workers start; in strict mode also whether it has an intact entry for here."""
        self._describe_path()
        problems = [self.start_problem] if self.start_problem else []
        path = self.options.bundle
        if self.options.strict and path is not None and not problems and self.bundle_existed:
            problems = self._strict_entry_problems(path)
        self._fail_if_strict(problems, "at session start")

    def _strict_entry_problems(self, path: Path) -> list[str]:
        try:
            _torchapi.bootstrap(str(self.root / "process"))
            bundle = read_manifest(path)
            here = _torchapi.environment_fingerprint()
            entry = bundle.find(here)
            if entry is None:
                return [bundle.mismatch(here)]
            bundle.payload(entry)
        except (BundleError, _torchapi.TorchUnavailable) as exc:
            return [str(exc)]
        return []

    def configure_node(self, node: Any) -> None:
        """Tell a new worker where the session's shared folder is and how PATH looked at start."""
        node.workerinput["compilecache_shared"] = str(self.shared)
        node.workerinput["compilecache_bundle_at_start"] = self.bundle_at_start
        node.workerinput["compilecache_bundle_existed"] = self.bundle_existed

    def node_down(self, node: Any) -> None:
        """Collect a worker's bundle report."""
        output = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
        if output is not None:
            self.reports.append(output)

    def configure(self) -> None:
        """The controller runs no tests: it leaves the environment alone."""

    def finish(self) -> None:
        blobs = []
        env = None
        for report in self.reports:
            env = env or report.get("env")
            file = report.get("artifacts_file")
            if file and os.path.exists(file):
                blobs.append(Path(file).read_bytes())
        self.finish_bundle(blobs, env)
        self.write_report()


def make_session(config: pytest.Config) -> CompileCacheSession:
    """The session object for this process's role."""
    options = Options(config)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        shared = workerinput.get("compilecache_shared")
        session: CompileCacheSession = WorkerSession(config, options, Path(shared) if shared else None)
        session.bundle_at_start = workerinput.get("compilecache_bundle_at_start", "")
        session.bundle_existed = bool(workerinput.get("compilecache_bundle_existed", False))
        return session
    if getattr(config.option, "dist", "no") != "no" and config.pluginmanager.hasplugin("xdist"):
        return ControllerSession(config, options)
    return CompileCacheSession(config, options)
