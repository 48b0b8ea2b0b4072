"""pytest-compilecache: isolated, observable and shareable torch.compile caches for pytest.
Importing this package never imports torch."""

from __future__ import annotations

from .cache import CompileCache
from .stats import CacheStats, DynamoStats, LayerStats, UnobservableLayerError

__all__ = ["CacheStats", "CompileCache", "DynamoStats", "LayerStats", "UnobservableLayerError"]
__version__ = "0.1.0"
