"""Deltas: a session's additions left beside a bundle at a URL, for ``pytest-compilecache merge --deltas``."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from .. import files
from ..bundle.format import Bundle, BundleError, Entry, read_manifest, write_bundle
from .client import Client
from .errors import Conflict, why


class Deltas:
    """``URL.deltas/<sha256>.bundle`` beside the object of ``client``, each also kept in ``folder``."""

    def __init__(self, client: Client, folder: Path) -> None:
        self.client = client
        self.folder = folder
        #: The folder of deltas beside the bundle.
        self.url = client.url + ".deltas/"

    def _folder(self) -> tuple[Any, str]:
        """fsspec's file system and the folder of deltas in it."""
        fs, path = self.client.filesystem()
        return fs, path.rstrip("/") + ".deltas"

    def upload(self, additions: list[Entry]) -> tuple[str, Bundle]:
        """Upload the additions as a delta; its URL (without credentials) and its local bundle, open."""
        staging = self.folder / f"delta-{os.getpid()}.bundle"
        write_bundle(Bundle(staging, additions))
        name = f"{files.checksum(staging)[0][:32]}.bundle"
        kept = self.folder / name
        files.replace(staging, kept)
        url = self.client.name + ".deltas/" + name
        fs, folder = self._folder()
        with contextlib.suppress(Exception):  # file systems with folders
            self.client.deadlines.run("creating its deltas' folder", lambda: fs.makedirs(folder, exist_ok=True))
        try:
            self.client.create(f"{folder}/{name}", kept, "uploading its delta")
        except Conflict:
            pass  # the same content is there already
        return url, read_manifest(kept, label=url)

    def waiting(self) -> list[str]:
        """The URLs of the deltas waiting beside the bundle."""
        fs, folder = self._folder()
        try:
            names = self.client.deadlines.run("listing its deltas", lambda: fs.ls(folder, detail=False))
        except FileNotFoundError:
            return []
        except BundleError:
            raise
        except Exception as exc:
            raise BundleError(f"{self.client.name}.deltas/: cannot list: {why(exc)}") from None
        return sorted(self.url + str(n).rsplit("/", 1)[-1] for n in names if str(n).endswith(".bundle"))

    def remove(self, urls: list[str]) -> list[str]:
        """Remove deltas (and this machine's copies of them); those that could not be removed."""
        return [url for url in urls if not self._remove(url)]

    def _remove(self, url: str) -> bool:
        fs, folder = self._folder()
        name = url.rsplit("/", 1)[-1]
        with contextlib.suppress(OSError):
            (self.folder / name).unlink()
        try:
            self.client.deadlines.run("removing a delta", lambda: fs.rm_file(f"{folder}/{name}"))
        except Exception as exc:
            return isinstance(exc, FileNotFoundError)
        return True
