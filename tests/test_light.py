"""The plugin stays light: loading it, --help and tests that use no fixture never import torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.floors


def test_importing_the_plugin_does_not_import_torch() -> None:
    code = "import sys, pytest_compilecache, pytest_compilecache.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_help_lists_options_without_torch(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import sys
        def pytest_unconfigure(config):
            assert "torch" not in sys.modules, "torch was imported"
        """
    )
    result = pytester.runpytest_subprocess("--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*--compile-cache-isolate*", "*compile_cache_isolate*"])


def test_a_test_without_fixtures_never_imports_torch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import sys
        def test_plain():
            assert "torch" not in sys.modules
        """
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


def test_plugin_can_be_disabled(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(cold_cache): pass")
    result = pytester.runpytest_subprocess("-p", "no:compilecache")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'cold_cache' not found*"])


@pytest.mark.parametrize(
    ("torch_source", "message"),
    [
        ("raise ImportError('No module named torch')", "needs torch >= 2.7, but torch cannot be imported"),
        ("__version__ = '2.6.0'\nclass compiler: pass", "needs torch >= 2.7 * but found torch 2.6.0"),
    ],
    ids=["missing", "too-old"],
)
def test_missing_or_old_torch_is_a_clear_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, torch_source: str, message: str
) -> None:
    fake = pytester.mkdir("fake")
    (fake / "torch").mkdir()
    (fake / "torch" / "__init__.py").write_text(textwrap.dedent(torch_source))
    pytester.makepyfile("def test_x(cold_cache): pass")
    monkeypatch.setenv("PYTHONPATH", str(Path(fake)))
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*{message}*"])


def test_the_wheel_ships_every_module(tmp_path: Path) -> None:
    """A regular (non-editable) install gets every module of the package, subpackages included."""
    import zipfile

    import shutil

    root = Path(__file__).resolve().parents[1]
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    shutil.copytree(root / "pytest_compilecache", source / "pytest_compilecache",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("pytest_compilecache-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    sources = {p.relative_to(root).as_posix() for p in (root / "pytest_compilecache").rglob("*.py")}
    assert sources - shipped == set()


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "n2"])
def test_isolation_leaves_torch_alone_in_tests_that_never_use_it(pytester: pytest.Pytester,
                                                                 workers: list[str]) -> None:
    """--compile-cache-isolate resets torch around every test, but a test that never imports torch has
    nothing to reset: torch stays unimported."""
    pytester.makepyfile(
        """
        import sys
        def test_a():
            assert "torch" not in sys.modules
        def test_b():
            assert "torch" not in sys.modules
        """
    )
    pytester.runpytest_subprocess("-p", "no:randomly", *workers, "--compile-cache-isolate").assert_outcomes(passed=2)


@pytest.mark.slow
def test_isolation_is_exact_for_a_test_that_imports_torch_itself(
    pytester: pytest.Pytester, default_dir_of: Path
) -> None:
    """A test that imports torch in its body still compiles in a cache of its own, and the next test
    starts from an empty cache and a reset Dynamo. torch's default folder gets nothing but the
    precompiled headers of that first compile (their folder is computed when torch's compiler is
    imported, here before the plugin could set torch up: it has no import hook)."""
    pytester.makepyfile(
        """
        import os
        import sys
        FOLDERS = []

        def compile_and_count():
            import torch
            from torch._dynamo.utils import counters
            before = counters["inductor"]["fxgraph_cache_miss"]
            torch.compile(lambda x: x.cos() + 1)(torch.randn(4))
            FOLDERS.append(os.environ["TORCHINDUCTOR_CACHE_DIR"])
            return counters["inductor"]["fxgraph_cache_miss"] - before

        def test_plain():
            assert "torch" not in sys.modules

        def test_imports_torch():
            assert compile_and_count() == 1

        def test_compiles_the_same_again():
            assert compile_and_count() == 1
            assert len(set(FOLDERS)) == 2
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--compile-cache-isolate")
    result.assert_outcomes(passed=3)
    made = {p.relative_to(default_dir_of).parts[0] for p in default_dir_of.rglob("*")} if default_dir_of.exists() else set()
    assert made <= {"precompiled_headers"}, f"the run wrote {sorted(made)} into the shared default dir {default_dir_of}"


