"""The plugin's modules byte-compiled, as ``pip install`` leaves them, before anything is timed.

pip writes every module's ``.pyc`` when it installs a package (torch's, pytest's); a checkout on a
machine with ``PYTHONDONTWRITEBYTECODE=1`` (many container images set it) has none, so each run of
the plugin's side would compile its 70 modules from source (about 0.14 s on the 2-core CPU machine)
while the kept folder's side, which never imports the plugin, pays nothing of the kind.
"""

from __future__ import annotations

import compileall
from pathlib import Path

import pytest_compilecache


def as_installed() -> Path:
    """Byte-compile the imported plugin package in place; its folder."""
    folder = Path(pytest_compilecache.__file__).parent
    if not compileall.compile_dir(str(folder), quiet=1):
        raise SystemExit(f"could not byte-compile {folder}")
    return folder
