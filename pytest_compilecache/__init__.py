"""pytest-compilecache: isolated, observable and shareable torch.compile caches for pytest.

Importing this package never imports torch.
"""

from __future__ import annotations

import importlib.machinery
import sys
from types import ModuleType
from typing import Sequence


class _ImportedAsInstalled:
    """Finds this package's modules as Python's own path finder does, from their ``.pyc``.

    pytest rewrites the assertions of every module of an installed plugin, and where it cannot keep
    what it rewrote (``PYTHONDONTWRITEBYTECODE``, a read-only site-packages) it compiles them all from
    source again in every process. None of this package's assertions is for its users to read.
    """

    @staticmethod
    def find_spec(name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not name.startswith(__name__ + "."):
            return None
        return importlib.machinery.PathFinder.find_spec(name, path)


if _ImportedAsInstalled not in sys.meta_path:
    sys.meta_path.insert(0, _ImportedAsInstalled)

from .cache import CompileCache  # noqa: E402
from .stats import CacheStats, DynamoStats, LayerStats, UnobservableLayerError  # noqa: E402

__all__ = ["CacheStats", "CompileCache", "DynamoStats", "LayerStats", "UnobservableLayerError"]
__version__ = "0.1.0"
