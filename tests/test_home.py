"""Folders the plugin cannot write (its home, compile_cache_home; a bundle's) never break a compile or a warm test."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

#: The warmup hook compiles ``f``; optional, so that a run without the plugin takes the conftest.
CONFTEST = """
import pytest
import torch

def f(x):
    return torch.sin(x) * 2 + 1

@pytest.hookimpl(optionalhook=True)
def pytest_compilecache_warmup(cache):
    torch.compile(f)(torch.randn(8))
"""
#: A plain test that compiles (its C++ kernel needs the precompiled headers), and a warm test of the warmup's graph.
TESTS = """
import torch
from conftest import f

def test_plain():
    assert torch.compile(lambda x: (x.cos() + 1).relu())(torch.randn(8)).shape == (8,)

def test_warm(warm_cache):
    torch.compile(f)(torch.randn(8))
    warm_cache.assert_misses(fx_graph=0)
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_home_suite=TESTS)
    return pytester


def said_once(lines: list[str], *words: str) -> str:
    """The one line of ``lines`` that holds every word (it must be one)."""
    found = [line for line in lines if all(word in line for word in words)]
    assert len(found) == 1, "\n".join(lines)
    return found[0]


def test_a_home_under_a_file_is_replaced_by_the_sessions_folder(suite: pytest.Pytester,
                                                                 run_inner: Callable[..., pytest.RunResult]) -> None:
    """Issue 56: with the home unwritable, torch's header builds failed (``InductorError: OSError``), so plain tests
    that compile failed and warm tests were skipped. Now the session's own folder stands in, said once."""
    (suite.path / "blocker").write_text("a file, not a folder")
    home = suite.path / "blocker" / "home"
    result = run_inner("-rs", "--compile-cache-bundle=b.bundle", "-o", "compile_cache_headers_dir=",
                       ini=f"compile_cache_home = {home}")
    lines = result.stdout.lines
    result.assert_outcomes(passed=2)
    notice = said_once(lines, str(home))
    assert "Not a directory" in notice and "instead" in notice, notice
    assert not [line for line in lines if "PROBLEM" in line], "\n".join(lines)


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` read-only for everyone, root included, while active (a read-only bind mount of itself)."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a read-only folder needs a bind mount, which this machine refuses: {mounted.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True, capture_output=True)


@pytest.mark.compat
def test_a_read_only_home_passes_what_it_passes_without_the_plugin(
        suite: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 56: a read-only HOME (the default home below it) made every compile fail with ``[Errno 30] Read-only
    file system``; the same tests pass without the plugin."""
    home = suite.path / "user"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME")
    with read_only(home):
        without = run_inner("-p", "no:compilecache", "-k", "plain", "-o", "compile_cache_headers_dir=")
        with_plugin = run_inner("-rs", "--compile-cache-bundle=b.bundle", "-o", "compile_cache_headers_dir=")
    without.assert_outcomes(passed=1)
    with_plugin.assert_outcomes(passed=2)
    notice = said_once(with_plugin.stdout.lines, str(home / ".cache" / "pytest-compilecache"))
    assert "Read-only file system" in notice, notice


def test_the_home_is_tagged_as_a_cache(pytester: pytest.Pytester) -> None:
    """Issue 56: pytest's own cache folder has a CACHEDIR.TAG (backup tools skip it); the plugin's home had none."""
    home = pytester.path / "home"
    pytester.makepyfile("def test_plain():\n    pass\n")
    pytester.runpytest_subprocess("-o", f"compile_cache_home={home}").assert_outcomes(passed=1)
    tag = (home / "CACHEDIR.TAG").read_text()
    assert tag.startswith("Signature: 8a477f597d28d172789f06886806bc55\n# "), tag


def test_environment_folders_unused_for_30_days_are_removed(pytester: pytest.Pytester) -> None:
    """Issue 56: ``workers/<environment>`` folders were never removed. A run uses its own (and says so by its time);
    at its end, at most once a day, those no run has used for 30 days go."""
    import os
    import time

    home = pytester.path / "home"
    workers = home / "workers"
    old, recent = workers / "0123456789ab", workers / "ba9876543210"
    for folder, days in ((old, 31), (recent, 29)):
        (folder / "gw0").mkdir(parents=True)
        for path in (folder / "gw0", folder):
            os.utime(path, (time.time() - days * 86400,) * 2)
    pytester.makepyfile("def test_plain():\n    pass\n")
    run = ("-o", f"compile_cache_home={home}", "--compile-cache-isolate-mode=worker")
    pytester.runpytest_subprocess(*run).assert_outcomes(passed=1)
    assert recent.is_dir() and not old.exists()
    (own,) = set(workers.iterdir()) - {recent}
    assert time.time() - own.stat().st_mtime < 600, "the run's own folder says it was used"
    (old / "gw0").mkdir(parents=True)
    os.utime(old, (time.time() - 31 * 86400,) * 2)
    pytester.runpytest_subprocess(*run).assert_outcomes(passed=1)
    assert old.is_dir(), "pruned at most once a day"


def test_a_new_bundle_in_a_read_only_folder_is_warmed_up_and_used(suite: pytest.Pytester,
                                                                  run_inner: Callable[..., pytest.RunResult]) -> None:
    """Issue 56, edge 1: the header promised to write PATH, the lock beside it could not be made, the warmup never
    ran and every warm test was skipped, with the reason said three times. docs/bundles.md promises the warmup runs
    and warm tests run; that PATH cannot be written is said once."""
    folder = suite.path / "ro"
    bundle = folder / "new.bundle"
    with read_only(folder):
        result = run_inner("-rs", f"--compile-cache-bundle={bundle}")
    result.assert_outcomes(passed=2)
    assert "the session will write the bundle there" not in result.stdout.str()
    assert str(bundle) in said_once(result.stdout.lines, "Read-only file system")


def test_a_skipped_warm_test_never_suggests_a_hook_that_exists(pytester: pytest.Pytester,
                                                               run_inner: Callable[..., pytest.RunResult]) -> None:
    pytester.makeconftest("def pytest_compilecache_warmup(cache):\n    pass\n")
    pytester.makepyfile("def test_warm(warm_cache):\n    pass\n")
    result = run_inner("-rs")
    result.assert_outcomes(skipped=1)
    skip = said_once(result.stdout.lines, "SKIPPED")
    assert "hook" not in skip.split("warm_cache needs a usable bundle", 1)[-1].split(")", 1)[-1], skip
