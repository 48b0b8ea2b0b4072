"""The plugin's home (``compile_cache_home``): tried once per session by writing in it, tagged as a cache; where it
cannot be written, a folder of the session's own stands in. Environments' folders no run used for a while are removed."""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Callable

from .. import files
from .options import Options

#: The standard tag (https://bford.info/cachedir/), as pytest's cache folder has it: backup tools skip the folder.
CACHEDIR_TAG = (b"Signature: 8a477f597d28d172789f06886806bc55\n"
                b"# This file is a cache directory tag created by pytest-compilecache.\n"
                b"# For information about cache directory tags, see:\n#\thttps://bford.info/cachedir/spec.html\n")
#: A folder of an environment (``workers/<environment>``) that no run has used for this many days is removed.
UNUSED_DAYS = 30
_DAY = 86400.0

@dataclasses.dataclass(frozen=True)
class Home:
    """Where this session keeps what the plugin keeps between runs."""

    path: Path
    headers: Path
    #: Why a configured folder is not used and what is used instead, a line each.
    notices: tuple[str, ...] = ()

    def applied(self, options: Options) -> Options:
        """``options`` with these folders, and their notices."""
        return dataclasses.replace(options, home=self.path, headers_dir=self.headers, home_notices=self.notices)


def settle(home: Path, headers: Path, stand_in: Callable[[], Path]) -> Home:
    """The home and headers' folder where a file can be made in them, else folders under ``stand_in()``."""
    notices = []
    if why := _made(home, tag=True):
        moved = stand_in() / "home"
        notices.append(_instead("compile_cache_home", home, why, moved))
        home, headers = moved, moved / headers.relative_to(home) if headers.is_relative_to(home) else headers
    if why := _made(headers):
        moved = stand_in() / "precompiled-headers"
        notices.append(_instead("compile_cache_headers_dir", headers, why, moved))
        headers = moved
    return Home(home, headers, tuple(notices))


def _made(folder: Path, tag: bool = False) -> str:
    """Why ``folder`` cannot be made or written in ("" when a file could be made in it); with ``tag``, tagged."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if tag and not (folder / "CACHEDIR.TAG").exists():
            files.write_atomic(folder / "CACHEDIR.TAG", CACHEDIR_TAG, fsync=False)
    except OSError as exc:
        return f"{exc.filename or folder}: {exc.strerror or exc}"
    return files.cannot_write(folder)


def prune(home: Path) -> list[Path]:
    """At most once a day (``home/.pruned`` says when last), remove the environments' folders no run has used
    (touched) for :data:`UNUSED_DAYS` days; the removed ones."""
    stamp, now = home / ".pruned", time.time()
    try:
        if stamp.exists() and now - stamp.stat().st_mtime < _DAY:
            return []
        stamp.touch()
        gone = [p for p in (home / "workers").iterdir() if now - p.stat().st_mtime > UNUSED_DAYS * _DAY]
    except OSError:
        return []
    for folder in gone:
        shutil.rmtree(folder, ignore_errors=True)
    return gone


def _instead(name: str, folder: Path, why: str, moved: Path) -> str:
    return (f"{name} {folder} cannot be written ({why}); this session uses {moved} instead, removed at its end "
            f"(set {name} to a folder this user can write to keep it between runs)")
