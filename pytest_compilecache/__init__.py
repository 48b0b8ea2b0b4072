"""pytest-compilecache: isolated, observable and shareable torch.compile caches for pytest.

Importing this package never imports torch; it puts a finder for the package's own modules at the
front of the import system's finders (declared with every other patch in ``_torchapi/patches.py``).
"""

from __future__ import annotations

from ._torchapi import patches

patches.install_hook(patches.PLUGIN_MODULES)

from .cache import CompileCache
from .stats import CacheStats, DynamoStats, LayerStats, UnobservableLayerError

__all__ = ["CacheStats", "CompileCache", "DynamoStats", "LayerStats", "UnobservableLayerError"]
__version__ = "0.1.0"
