"""pytest-compilecache: isolated, observable and shareable torch.compile caches for pytest.

Importing this package never imports torch; it puts a finder for the package's own modules at the
front of ``sys.meta_path`` (see ``_ImportedAsInstalled``).
"""

from __future__ import annotations

import importlib.machinery
import sys
from types import ModuleType
from typing import Sequence


class _ImportedAsInstalled:
    """Finds this package's modules as Python's own path finder does, from their ``.pyc``.

    pytest rewrites the assertions of every module of an installed plugin, and where it has never been
    able to keep what it rewrote (``PYTHONDONTWRITEBYTECODE``, a read-only site-packages) it compiles
    them all from source again in every process. None of this package's assertions is for its users
    to read.
    """

    @staticmethod
    def find_spec(name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not name.startswith(__name__ + "."):
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)


if not any(getattr(finder, "__qualname__", None) == _ImportedAsInstalled.__qualname__
           and getattr(finder, "__module__", None) == __name__ for finder in sys.meta_path):
    sys.meta_path.insert(0, _ImportedAsInstalled)

from .cache import CompileCache  # noqa: E402
from .stats import CacheStats, DynamoStats, LayerStats, UnobservableLayerError  # noqa: E402

__all__ = ["CacheStats", "CompileCache", "DynamoStats", "LayerStats", "UnobservableLayerError"]
__version__ = "0.1.0"
