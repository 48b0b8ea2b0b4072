"""Which store serves the name a user gave: a URL's packs, or a path's file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .errors import DEFAULT_TIMEOUT
from .interface import BundleStore
from .local import LocalStore
from .packs import PackStore
from .urls import file_url_path, is_url


def open_store(where: str | Path, lock_timeout: float, copies: Path,
               storage_options: Mapping[str, Any] | None = None, network_timeout: float = DEFAULT_TIMEOUT,
               unreachable: str = "") -> BundleStore:
    """The store of the bundle at ``where``, opened once per process that needs it: a URL's (its packs' bytes kept
    under ``copies``; ``unreachable``: why another process of the session stopped asking it), or a path's, also
    given as a ``file://`` URL."""
    name = str(where)
    if is_url(name):
        return PackStore(name, copies, lock_timeout, storage_options, network_timeout, unreachable)
    return LocalStore(Path(file_url_path(name) or name), lock_timeout)
