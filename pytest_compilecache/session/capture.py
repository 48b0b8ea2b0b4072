"""Warnings raised by the plugin's work outside any test go to pytest's warnings summary, not stderr."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest


@contextlib.contextmanager
def warnings_to_pytest(config: pytest.Config) -> Iterator[None]:
    """Capture warnings inside (preparing or saving a bundle) as pytest captures a test's, with the user's filters,
    for pytest's ``pytest_warning_recorded``; with ``-p no:warnings``, leave them to Python, as pytest does."""
    if config.pluginmanager.is_blocked("warnings"):
        yield
        return
    from _pytest.warnings import catch_warnings_for_item  # pytest's own, as for a test (every pytest >= 7.4)

    with catch_warnings_for_item(config, ihook=config.hook, when="runtest", item=None):
        yield
