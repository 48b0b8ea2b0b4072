"""The plugin's home (``compile_cache_home``): tried once per session by writing in it; where it cannot be
written, a folder of the session's own stands in."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from .. import files
from .options import Options


@dataclasses.dataclass(frozen=True)
class Home:
    """Where this session keeps what the plugin keeps between runs."""

    path: Path
    headers: Path
    #: Why a configured folder is not used and what is used instead, a line each.
    notices: tuple[str, ...] = ()

    def applied(self, options: Options) -> Options:
        """``options`` with these folders, and their notices among its warnings."""
        return dataclasses.replace(options, home=self.path, headers_dir=self.headers,
                                   warnings=options.warnings + self.notices)


def settle(home: Path, headers: Path, stand_in: Callable[[], Path]) -> Home:
    """The home and headers' folder where a file can be made in them, else folders under ``stand_in()``."""
    notices = []
    if why := _made(home):
        moved = stand_in() / "home"
        notices.append(_instead("compile_cache_home", home, why, moved))
        home, headers = moved, moved / headers.relative_to(home) if headers.is_relative_to(home) else headers
    if why := _made(headers):
        moved = stand_in() / "precompiled-headers"
        notices.append(_instead("compile_cache_headers_dir", headers, why, moved))
        headers = moved
    return Home(home, headers, tuple(notices))


def _made(folder: Path) -> str:
    """Why ``folder`` cannot be made or written in ("" when a file could be made in it)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{exc.filename or folder}: {exc.strerror or exc}"
    return files.cannot_write(folder)


def _instead(name: str, folder: Path, why: str, moved: Path) -> str:
    return (f"{name} {folder} cannot be written ({why}); this session uses {moved} instead, removed at its end "
            f"(set {name} to a folder this user can write to keep it between runs)")
