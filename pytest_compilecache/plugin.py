"""The plugin's entry point: options, the choice of role, and the fixtures, each delegating to the role."""

from __future__ import annotations

import shutil
import sys
import tempfile
from typing import Any, Iterator

import pytest

from . import hooks
from ._torchapi import defaultdir, patches
from .cache import CacheKind, CompileCache
from .environment import SavedEnv, point_cache_dirs_at
from .report.html import HtmlColumns
from .session.options import Isolation, Options, add_options
from .session.roles import Role, choose_role
from .session.testside import REMOTE_MARKER

_ROLE = pytest.StashKey[Role]()
#: What was patched when this session began: its end takes back only what it added.
_PATCHED_BEFORE = pytest.StashKey[int]()
#: torch's default folder as it was sent before this session (see ``_torchapi.defaultdir``).
_DEFAULT_BEFORE = pytest.StashKey[tuple[Any, Any]]()
#: The cache variables as they were before the first conftest, put back at the session's end (every role).
_EARLY_ENV = pytest.StashKey[SavedEnv]()
_early_dir: str | None = None


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def _early_process_dir() -> str:
    global _early_dir
    if _early_dir is None:
        _early_dir = tempfile.mkdtemp(prefix="pytest-compilecache-")
    return _early_dir


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """With isolation or a bundle on, keep torch off its shared default directory from here on.

    Conftests loaded next may import torch's compiler; nothing of torch is imported here.
    """
    early_config.stash[_PATCHED_BEFORE] = patches.checkpoint()
    try:
        options = Options.early(early_config)
    except (pytest.UsageError, ValueError):
        return  # pytest_configure raises it again, with pytest's error reporting in place
    if options.session_wide:
        early_config.stash[_EARLY_ENV] = SavedEnv()
        point_cache_dirs_at(_early_process_dir())
        early_config.stash[_DEFAULT_BEFORE] = defaultdir.send_to(_early_process_dir, str(options.headers_dir))


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Choose this process's role, once; after pytest's own set-up (basetemp) is in place."""
    config.addinivalue_line("markers", f"{REMOTE_MARKER}: let this test's warm_cache read and write torch's remote "
                                       "cache (--compile-cache-remote), which fixtures otherwise switch off")
    config.stash.setdefault(_PATCHED_BEFORE, patches.checkpoint())
    role = choose_role(config, Options.from_config(config))
    config.stash[_ROLE] = role
    role.start(config.pluginmanager, config.stash.get(_EARLY_ENV, None))
    if role.options.isolation is Isolation.TEST:
        config.pluginmanager.register(_IsolateEveryTest(), "compilecache-isolate-every-test")
    if config.pluginmanager.hasplugin("html") and getattr(config.option, "htmlpath", None) \
            and not hasattr(config, "workerinput"):
        config.pluginmanager.register(HtmlColumns(), "compilecache-html")


def pytest_unconfigure(config: pytest.Config) -> None:
    global _early_dir
    role = config.stash.get(_ROLE, None)
    try:
        if role is not None:
            role.close()
    finally:
        if _EARLY_ENV in config.stash:
            config.stash[_EARLY_ENV].restore()
        if _DEFAULT_BEFORE in config.stash:
            defaultdir.send_to(*config.stash[_DEFAULT_BEFORE])
        for problem in patches.undo(config.stash.get(_PATCHED_BEFORE, patches.checkpoint())):
            sys.stderr.write(f"compilecache: at the session's end, {problem}\n")
    if _early_dir is not None:
        shutil.rmtree(_early_dir, ignore_errors=True)
        _early_dir = None


def _caches(request: pytest.FixtureRequest, kind: CacheKind) -> Iterator[CompileCache]:
    yield from request.config.stash[_ROLE].open_cache(request, kind)


@pytest.fixture
def cold_cache(request: pytest.FixtureRequest) -> Iterator[CompileCache]:
    """An empty, isolated torch.compile cache for this test; see :class:`CompileCache`."""
    yield from _caches(request, CacheKind.COLD)


@pytest.fixture
def warm_cache(request: pytest.FixtureRequest) -> Iterator[CompileCache]:
    """An isolated torch.compile cache already filled from the session's bundle.

    Skipped, with a reason, when the session has no usable bundle.
    """
    yield from _caches(request, CacheKind.WARM)


class _IsolateEveryTest:
    """Registered only with ``--compile-cache-isolate-mode=test``: an isolated, empty cache around every test."""

    @pytest.fixture(autouse=True)
    def _compile_cache_isolation(self, request: pytest.FixtureRequest) -> Iterator[CompileCache | None]:
        if "cold_cache" in request.fixturenames or "warm_cache" in request.fixturenames:
            yield None
        else:
            yield from request.config.stash[_ROLE].isolate(request)
