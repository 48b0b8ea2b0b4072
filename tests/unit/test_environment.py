"""The environment as it concerns compile caches, in process: variables that switch caches off, and saving and
restoring the cache folders' variables."""

from __future__ import annotations

import os

import pytest

from pytest_compilecache.environment import SavedEnv, caches_disabled_by_env, point_cache_dirs_at


@pytest.mark.parametrize("name, value, effect", [
    ("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1", "disables every compile cache"),
    ("TORCH_COMPILE_FORCE_DISABLE_CACHES", " True ", "disables every compile cache"),
    ("TORCHINDUCTOR_FX_GRAPH_CACHE", "0", "disables the FX graph cache"),
    ("TORCHINDUCTOR_AUTOGRAD_CACHE", "off", "disables the AOTAutograd cache"),
], ids=["force-1", "force-true-spaced", "fx-0", "autograd-off"])
def test_a_variable_that_switches_a_cache_off_is_said_with_its_value(name: str, value: str, effect: str) -> None:
    """Each disabling value gives one line naming the variable, its value as set, and what it does."""
    assert caches_disabled_by_env({name: value}) == [f"{name}={value} {effect}"]


@pytest.mark.parametrize("name, value", [
    ("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "0"),
    ("TORCHINDUCTOR_FX_GRAPH_CACHE", "1"),
    ("TORCHINDUCTOR_AUTOGRAD_CACHE", ""),
    ("TORCHINDUCTOR_CACHE_DIR", "/tmp/x"),
], ids=["force-0", "fx-on", "autograd-empty", "unrelated"])
def test_a_variable_that_leaves_caches_on_is_not_said(name: str, value: str) -> None:
    """A force switch at 0, a cache switched on, or an unset value is no warning."""
    assert caches_disabled_by_env({name: value}) == []


def test_every_disabling_variable_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several at once are each said, read from ``os.environ`` when no mapping is given."""
    monkeypatch.setenv("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "yes")
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "false")
    monkeypatch.delenv("TORCH_COMPILE_FORCE_DISABLE_CACHES", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_AUTOGRAD_CACHE", raising=False)
    assert [line.split("=")[0] for line in caches_disabled_by_env()] == [
        "TORCHINDUCTOR_FORCE_DISABLE_CACHES", "TORCHINDUCTOR_FX_GRAPH_CACHE"]


def test_saved_variables_are_restored_and_unset_ones_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    """What was set is set back; what was unset is unset again, whatever happened between."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/before")
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    saved = SavedEnv()
    point_cache_dirs_at("/session")
    assert (os.environ["TORCHINDUCTOR_CACHE_DIR"], os.environ["TRITON_CACHE_DIR"]) == (
        "/session", os.path.join("/session", "triton"))
    saved.restore()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/before" and "TRITON_CACHE_DIR" not in os.environ


def test_only_the_named_variables_are_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``SavedEnv`` of some names leaves every other variable as it is now."""
    monkeypatch.setenv("COMPILECACHE_UNIT_A", "a")
    monkeypatch.setenv("COMPILECACHE_UNIT_B", "b")
    saved = SavedEnv(("COMPILECACHE_UNIT_A",))
    monkeypatch.setenv("COMPILECACHE_UNIT_A", "changed")
    monkeypatch.setenv("COMPILECACHE_UNIT_B", "changed")
    saved.restore()
    assert (os.environ["COMPILECACHE_UNIT_A"], os.environ["COMPILECACHE_UNIT_B"]) == ("a", "changed")
