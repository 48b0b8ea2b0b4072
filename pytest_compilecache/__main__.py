"""``python -m pytest_compilecache``: the bundle command line."""

from .cli import _entry

_entry()
