"""Helpers for driving the plugin through pytester in subprocesses, where torch state is real."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_user_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test writes into the developer's ``~/.cache``: every process started from here (inner pytest
    runs, the CLI, scripts) gets a per-user cache folder of its own through ``XDG_CACHE_HOME``."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    yield
    patch.undo()


def report_schema_errors(document: Any) -> list[str]:
    """Where ``document`` breaks the JSON report's published schema (``pytest_compilecache/report/schema.json``)."""
    import json
    from importlib import resources

    import jsonschema

    schema = json.loads((resources.files("pytest_compilecache.report") / "schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in validator.iter_errors(document)]


@pytest.fixture(autouse=True)
def _reports_match_their_schema(request: pytest.FixtureRequest) -> Iterator[None]:
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
    for path in folder.rglob("*.json"):
        try:
            document = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
        if isinstance(document, dict) and {"format", "totals", "tests", "bundle"} <= document.keys():
            errors = report_schema_errors(document)
            assert not errors, f"{path} does not match the report schema:\n" + "\n".join(errors)


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


@pytest.fixture
def run_inner(
    pytester: pytest.Pytester, private_tmp: Path, shared_headers_dir: Path
) -> Callable[..., pytest.RunResult]:
    """Run pytest in a subprocess on the files already made in ``pytester.path``."""

    def run(*args: str, ini: str = "", **kwargs: Any) -> pytest.RunResult:
        pytester.makeini(f"[pytest]\ncompile_cache_headers_dir = {shared_headers_dir}\n{ini}\n")
        return pytester.runpytest_subprocess("-p", "no:logging", "-p", "no:randomly", *args, **kwargs)

    return run


@pytest.fixture
def default_dir_of(private_tmp: Path) -> Path:
    """The shared default directory a run must not create."""
    return default_dir(private_tmp)





@pytest.fixture(scope="session")
def build_bundle(tmp_path_factory: pytest.TempPathFactory, shared_headers_dir: Path) -> Callable[..., Path]:
    """``build_bundle({"test_x.py": source, ...}, *args)``: the path of a bundle written by one real
    pytest session over those files, built once per test session for the same files and arguments.
    Callers copy it before changing it."""
    import subprocess
    import sys

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
            out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                                  f"--compile-cache-bundle={bundle}", *args], cwd=folder, capture_output=True,
                                 text=True, timeout=600)
            assert out.returncode == 0, out.stdout + out.stderr
            built[key] = bundle
        return built[key]

    return build
