"""The plugin's entry point: options, the choice of role, and the fixtures, each delegating to the role."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from . import hooks
from ._torchapi import defaultdir, patches
from .cache import CacheKind, CompileCache
from .environment import SavedEnv, point_cache_dirs_at
from .session.folders import prune, settle
from .session.options import Isolation, Options
from .session.options import add_options as pytest_addoption  # noqa: F401  (pytest's hook)
from .session.roles import Role, choose_role
from .session.testside import REMOTE_MARKER, TestSide

_ROLE = pytest.StashKey[Role]()
#: What runs this process's tests (none in the xdist controller): the fixtures' caches.
_SIDE = pytest.StashKey[TestSide]()
#: What was patched when this session began: its end takes back only what it added.
_PATCHED_BEFORE = pytest.StashKey[int]()
#: What the session's end undoes of what was done before the first conftest (its folder, torch's default folder).
_EARLY_UNDO = pytest.StashKey[contextlib.ExitStack]()
#: Where the session keeps what the plugin keeps between runs, tried before the first conftest.
_HOME = pytest.StashKey[dict[str, Any]]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Settle the plugin's home; with isolation or a bundle on, keep torch off its shared default directory before
    conftests import it."""
    early_config.stash[_PATCHED_BEFORE] = patches.checkpoint()
    try:
        options = Options.from_config(early_config, early=True)
    except (pytest.UsageError, ValueError):
        return  # pytest_configure raises it again, with pytest's error reporting in place
    undo = early_config.stash[_EARLY_UNDO] = contextlib.ExitStack()

    @functools.cache
    def folder() -> str:
        made = tempfile.mkdtemp(prefix="pytest-compilecache-")
        undo.callback(shutil.rmtree, made, ignore_errors=True)
        return made

    home = early_config.stash[_HOME] = settle(options.home, options.headers_dir, lambda: Path(folder()))
    if options.session_wide:
        point_at = folder()
        undo.callback(SavedEnv().restore)
        point_cache_dirs_at(point_at)
        undo.callback(defaultdir.send_to, *defaultdir.send_to(folder, str(home["headers_dir"])))


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Choose this process's role, once; after pytest's own set-up (basetemp) is in place."""
    config.addinivalue_line("markers", f"{REMOTE_MARKER}: let this test's warm_cache read and write torch's remote "
                                       "cache (--compile-cache-remote), which fixtures otherwise switch off")
    config.stash.setdefault(_PATCHED_BEFORE, patches.checkpoint())
    options = Options.from_config(config)
    home = config.stash.get(_HOME, None)
    role = choose_role(config, dataclasses.replace(options, **home) if home is not None else options)
    config.stash[_ROLE] = role
    if role.side is not None:
        config.stash[_SIDE] = role.side
    role.start(config.pluginmanager)
    if role.options.isolation is Isolation.TEST:
        config.pluginmanager.register(_IsolateEveryTest(), "compilecache-isolate-every-test")


def pytest_unconfigure(config: pytest.Config) -> None:
    role = config.stash.get(_ROLE, None)
    try:
        if role is not None:
            role.close()
    finally:
        if home := config.stash.get(_HOME, None):
            prune(home["home"])
        config.stash.get(_EARLY_UNDO, contextlib.ExitStack()).close()
        for problem in patches.undo(config.stash.get(_PATCHED_BEFORE, patches.checkpoint())):
            sys.stderr.write(f"compilecache: at the session's end, {problem}\n")


@pytest.fixture
def cold_cache(request: pytest.FixtureRequest) -> Iterator[CompileCache]:
    """An empty, isolated torch.compile cache for this test; see :class:`CompileCache`."""
    yield from request.config.stash[_SIDE].open_cache(request, CacheKind.COLD)


@pytest.fixture
def warm_cache(request: pytest.FixtureRequest) -> Iterator[CompileCache]:
    """An isolated torch.compile cache already filled from the session's bundle.

    Skipped, with a reason, when the session has no usable bundle.
    """
    yield from request.config.stash[_SIDE].open_cache(request, CacheKind.WARM)


class _IsolateEveryTest:
    """Registered only with ``--compile-cache-isolate-mode=test``: an isolated, empty cache around every test."""

    @pytest.fixture(autouse=True)
    def _compile_cache_isolation(self, request: pytest.FixtureRequest) -> Iterator[CompileCache | None]:
        if "cold_cache" in request.fixturenames or "warm_cache" in request.fixturenames:
            yield None
        else:
            yield from request.config.stash[_SIDE].isolate(request)
