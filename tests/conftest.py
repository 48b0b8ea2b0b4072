"""Helpers for driving the plugin through pytester in subprocesses, where torch state is real."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pytest

from helpers import SAY_EVERYTHING, report_schema_errors, run_pytest
from zygote import Zygotes


@pytest.fixture(scope="session", autouse=True)
def _private_user_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test writes into the developer's ``~/.cache``: every process started from here (inner pytest
    runs, the CLI, scripts) gets a per-user cache folder of its own through ``XDG_CACHE_HOME``."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    patch.setenv("PYTEST_ADDOPTS", SAY_EVERYTHING)
    original = pytest.Pytester.runpytest_subprocess

    def runpytest_subprocess(self: pytest.Pytester, *args: Any, **kwargs: Any) -> pytest.RunResult:
        return original(self, *SAY_EVERYTHING.split(), *args, **kwargs)

    patch.setattr(pytest.Pytester, "runpytest_subprocess", runpytest_subprocess)
    yield
    patch.undo()


@pytest.fixture(scope="session", autouse=True)
def _session_compiler(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Inner runs compile C++ through ``tests/cached_cxx.py``: g++, whose outputs are kept for the rest
    of this test session (shared by its xdist workers), so each kernel is built once, not once per run.

    ``COMPILECACHE_TEST_CXX=plain`` runs g++ itself instead."""
    import stat
    import sys

    compiler = os.environ.get("CXX", "g++")
    if os.environ.get("COMPILECACHE_TEST_CXX") == "plain" or shutil.which(compiler) is None:
        yield
        return
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if hasattr(request.config, "workerinput") else base
    folder = shared / "cached-cxx"
    folder.mkdir(exist_ok=True)
    shim = folder / os.path.basename(compiler)  # torch tells gcc from clang by the name
    script = Path(__file__).with_name("cached_cxx.py")
    partial = folder / f"{shim.name}.{os.getpid()}"
    partial.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "{folder / "outputs"}" "{compiler}" "$@"\n')
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR)
    os.replace(partial, shim)
    patch = pytest.MonkeyPatch()
    patch.setenv("CXX", str(shim))
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _reports_match_their_schema(request: pytest.FixtureRequest,
                                _passing_tests_leave_no_folders: None) -> Iterator[None]:
    """Every ``--compile-cache-report`` file a test's inner runs write validates against the published schema.

    Checked wherever ``jsonschema`` is installed (the ``test`` extra, so in CI); a machine that
    cannot install it (the GPU machine) runs its tests without this check.
    """
    import importlib.util

    if "pytester" not in request.fixturenames or importlib.util.find_spec("jsonschema") is None:
        yield
        return
    import json

    folder: Path = request.getfixturevalue("pytester").path
    yield
    # os.walk, not rglob: an inner session's folder removal (session/folders.py) may still be emptying
    # its trash folder after the session ended, and rglob fails on a folder that vanishes under it.
    reports = [Path(top, name) for top, _, names in os.walk(folder) for name in names if name.endswith(".json")]
    for path in reports:
        try:
            document = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
        if isinstance(document, dict) and {"format", "totals", "tests", "bundle"} <= document.keys():
            errors = report_schema_errors(document)
            assert not errors, f"{path} does not match the report schema:\n" + "\n".join(errors)


_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


@pytest.fixture(autouse=True)
def _passing_tests_leave_no_folders(request: pytest.FixtureRequest) -> Iterator[None]:
    """A passing test's ``pytester`` and ``tmp_path`` folders are removed when it ends (its inner sessions' compile
    caches and precompiled headers: 2 GB for the suite); a failing test's stay, as pytest keeps them.

    CI's disk holds the suite beside a CUDA build of torch (about 5 GB) for the compat tier. The report schema's
    check depends on this fixture, so it reads the folder before it goes.
    """
    folders = [request.getfixturevalue(name) for name in ("pytester", "tmp_path") if name in request.fixturenames]
    yield
    if request.node.stash.get(_PASSED, False):
        for folder in folders:
            shutil.rmtree(getattr(folder, "path", folder), ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _torch_compiler_imported_before_pytester() -> None:
    """Import, once and before any test, what the plugin imports in this process to take Mega-Cache bytes apart
    (writing a bundle entry does): pytester forgets the modules a test imports, and torch's compiler cannot be
    imported twice in one process (its operator libraries register once)."""
    from pytest_compilecache import _torchapi

    with contextlib.suppress(Exception):
        _torchapi.artifact_contents(b"")


@pytest.fixture(scope="session")
def kernels_name_their_folder(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> bool:
    """Whether this torch writes a C++ kernel's cache folder into its source (torch 2.7: its key then differs per
    folder, and the plugin carries no kernel), found by compiling one in a fresh process, once a session: xdist's
    workers share the answer through a file in the session's temporary root."""
    import filelock

    def compile_one() -> bool:
        folder = tmp_path_factory.mktemp("kernel-source")
        code = "import torch; torch.compile(lambda x: (x.sin() + 1).relu())(torch.randn(8))"
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder)}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        sources = [p for p in folder.glob("*/*.cpp") if p.with_suffix(".so").exists()]
        assert sources, "a C++ kernel was built"
        return any(str(folder) in p.read_text(errors="replace") for p in sources)

    if worker_id == "master":
        return compile_one()
    answer = tmp_path_factory.getbasetemp().parent / "kernels-name-their-folder"
    with filelock.FileLock(f"{answer}.lock"):
        if not answer.is_file():
            answer.write_text(str(compile_one()))
        return answer.read_text() == "True"


@pytest.fixture(scope="session")
def shared_headers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One precompiled-header folder for every inner run, so each subprocess skips rebuilding them."""
    return tmp_path_factory.mktemp("headers")


@pytest.fixture
def private_tmp(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A TMPDIR of the inner run's own: torch's default cache dir would appear inside it."""
    tmp = pytester.path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    return tmp


def default_dir(tmp: Path) -> Path:
    """torch's shared default cache directory for a process whose TMPDIR is ``tmp``."""
    return tmp / f"torchinductor_{getpass.getuser()}"


@pytest.fixture(scope="session")
def zygote(_session_compiler: None) -> Iterator[Zygotes | None]:
    """This worker's zygote (``tests/zygote.py``): inner runs forked after torch is imported, not started
    from nothing. ``COMPILECACHE_TEST_FORK=0`` starts every inner run as a fresh process, and so does a
    machine with an NVIDIA GPU: there, runs forked from it failed in Dynamo (torch 2.11 on an H100), and a
    fork could not show whether the plugin initialises CUDA anyway."""

    if os.environ.get("COMPILECACHE_TEST_FORK") == "0" or any(Path("/dev").glob("nvidia[0-9]*")):
        yield None
        return
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    started = Zygotes(env)
    yield started
    started.stop()


def _run_forked(pytester: pytest.Pytester, zygotes: Zygotes, args: tuple[str, ...], timeout: float | None,
                watch_default: bool = False) -> pytest.RunResult | None:
    """``pytester.runpytest_subprocess(*args)``, forked from the zygote; None where a fork would not
    see what a fresh process sees (the run's environment differs from the zygote's at import).

    With ``watch_default``, the run also fails the test if the zygote's own default folder exists
    after it: the paths torch works out at import (the precompiled headers' folder, Dynamo's cache)
    lie there in a fork, so a leak through one of them lands there, not in the run's ``TMPDIR``. The
    folder (torch made it when the zygote imported it) is removed first, so that the run is held to
    what a fresh process is held to: the folder must not appear, even to be read from."""
    import sys
    import time

    from _pytest.pathlib import make_numbered_dir

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
    zygote = zygotes.next(env)
    if zygote is None:
        return None
    basetemp = make_numbered_dir(root=pytester.path, prefix="runpytest-")
    full = [f"--basetemp={basetemp}", *SAY_EVERYTHING.split(), *args]
    out, err = pytester.path / "stdout", pytester.path / "stderr"
    print("running (forked from the zygote): pytest", *full)
    print("     in:", Path.cwd())
    imported_under = default_dir(zygote.temporary_folder)
    if watch_default:
        zygote.wait_until_ready()  # else a zygote still importing torch makes the folder after it is removed
        shutil.rmtree(imported_under, ignore_errors=True)
    started = time.monotonic()
    ret = zygote.run(full, Path.cwd(), env, out, err, timeout)
    duration = time.monotonic() - started
    stdout, stderr = (path.read_text(errors="replace") for path in (out, err))
    sys.stdout.write(stdout)
    sys.stderr.write(stderr)
    if watch_default and imported_under.exists():
        made = sorted(str(p.relative_to(imported_under)) for p in imported_under.rglob("*"))
        raise AssertionError(f"the run made the default folder torch worked out at import "
                             f"({imported_under}): {made[:5]}")
    return pytest.RunResult(ret, stdout.splitlines(), stderr.splitlines(), duration)


@pytest.fixture(scope="session")
def run_session(zygote: Zygotes | None) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_session(args, cwd, env=None, timeout=600)``: :func:`run_pytest` with this worker's zygote."""

    def run(args: list[str], cwd: Path, env: Mapping[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run_pytest(zygote, args, cwd, env, timeout)

    return run


@pytest.fixture
def run_inner(
    request: pytest.FixtureRequest, pytester: pytest.Pytester, private_tmp: Path, shared_headers_dir: Path,
    zygote: Zygotes | None,
) -> Callable[..., pytest.RunResult]:
    """Run pytest on the files already made in ``pytester.path``, as ``python -m pytest`` would, forked
    from the zygote where that sees what a fresh process sees; ``fresh=True`` always starts one (the
    tests about import order). In a test that checks torch's default folder stays absent
    (``default_dir_of``), a forked run must also leave no default folder of the zygote's, where the
    paths torch works out at import lie in a fork (see :func:`_run_forked`)."""
    watch_default = "default_dir_of" in request.fixturenames

    def run(*args: str, ini: str = "", fresh: bool = False, timeout: float | None = None) -> pytest.RunResult:
        pytester.makeini(f"[pytest]\ncompile_cache_headers_dir = {shared_headers_dir}\n{ini}\n")
        full = ("-p", "no:logging", "-p", "no:randomly", *args)
        if not fresh and zygote is not None:
            forked = _run_forked(pytester, zygote, full, timeout, watch_default)
            if forked is not None:
                return forked
        return pytester.runpytest_subprocess(*full, timeout=timeout)

    return run


@pytest.fixture
def default_dir_of(private_tmp: Path) -> Path:
    """The shared default directory a run must not create."""
    return default_dir(private_tmp)





@pytest.fixture(scope="session")
def build_bundle(tmp_path_factory: pytest.TempPathFactory, shared_headers_dir: Path,
                 zygote: Zygotes | None) -> Callable[..., Path]:
    """``build_bundle({"test_x.py": source, ...}, *args)``: the path of a bundle written by one real
    pytest session over those files, built once per test session for the same files and arguments.
    Callers copy it before changing it."""
    built: dict[tuple[tuple[tuple[str, str], ...], tuple[str, ...]], Path] = {}

    def build(files: dict[str, str], *args: str) -> Path:
        key = (tuple(sorted(files.items())), args)
        if key not in built:
            folder = tmp_path_factory.mktemp("built")
            for name, text in files.items():
                (folder / name).write_text(text)
            (folder / "pytest.ini").write_text(f"[pytest]\ncompile_cache_headers_dir = {shared_headers_dir}\n"
                                               f"compile_cache_home = {folder / 'home'}\n")
            bundle = folder / "b.bundle"
            out = run_pytest(zygote, ["-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                                      f"--compile-cache-bundle={bundle}", *args], folder)
            assert out.returncode == 0, out.stdout + out.stderr
            built[key] = bundle
        return built[key]

    return build
