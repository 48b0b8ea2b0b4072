"""Warnings raised by the plugin's work outside any test go to pytest's warnings summary, not stderr."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

import pytest


@contextlib.contextmanager
def warnings_to_pytest(config: pytest.Config) -> Iterator[None]:
    """Capture warnings inside (preparing or saving a bundle) as pytest captures a test's, with the
    user's ``filterwarnings`` and ``-W`` applied, and hand them to pytest's ``pytest_warning_recorded``.
    With pytest's warnings plugin off (``-p no:warnings``), leave them to Python, as pytest does."""
    if config.pluginmanager.is_blocked("warnings"):
        yield
        return
    catch: Any = None
    with contextlib.suppress(ImportError):
        from _pytest.warnings import catch_warnings_for_item as catch  # pytest >= 6: applies the user's filters
    if catch is not None:
        with catch(config, ihook=config.hook, when="runtest", item=None):
            yield
        return
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("default")
        yield
    for message in log:
        config.hook.pytest_warning_recorded.call_historic(
            kwargs=dict(warning_message=message, when="runtest", nodeid="", location=None))
