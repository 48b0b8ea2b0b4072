"""Whether a run ran the whole suite: only such an updating run counts toward ``compile_cache_max_unused_runs``."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..words import counted


class Selection:
    """Watches what a process that runs tests left out of its collection: deselected tests (``-k``, ``-m``,
    ``--deselect``, ``--sw``), a run of the last failures (``--lf``), collection errors, and tests or files named on
    the command line (not ``testpaths``)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        where = Path(config.invocation_params.dir)
        source = getattr(config, "args_source", None)
        given = source is None or source.name == "ARGS"  # not testpaths, not the invocation folder
        self._named = [arg for arg in config.args if given and ("::" in arg or (where / arg).is_file())]
        self._deselected = 0
        self._errors = 0
        self._last_failed = False

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self._deselected += len(items)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._errors += 1

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self) -> None:
        # --lf skips files and drops passed tests during collection, without deselecting them.
        last_failed = self.config.pluginmanager.get_plugin("lfplugin")
        self._last_failed = bool(self.config.getoption("lf", False) and getattr(last_failed, "lastfailed", None))

    def left_out(self) -> str:
        """Why this process ran part of the suite, in words; "" when it ran every test its paths hold."""
        if self._last_failed:
            return "it ran the last failures only (--lf)"
        if self._named:
            return f"it named tests or files ({self._named[0]}{', ...' if len(self._named) > 1 else ''})"
        if self._deselected:
            return f"it deselected {counted(self._deselected, 'test')} (-k, -m, --deselect or --sw)"
        if self._errors:
            return f"{counted(self._errors, 'collection error')} left tests out"
        return ""


def stopped_early(session: pytest.Session, exitstatus: int | pytest.ExitCode) -> str:
    """Why the session did not run every test it selected (``-x``, ``--maxfail``, an interrupt), or ""."""
    if session.shouldfail or session.shouldstop:  # set by pytest, or by the xdist controller at --maxfail
        return f"it stopped early ({session.shouldfail or session.shouldstop})"
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        return "it was interrupted"
    return ""
