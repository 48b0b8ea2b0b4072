"""Lower one of torch's loggers for a while without making its descendants say more."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator


@contextlib.contextmanager
def lowered(logger: logging.Logger, level: int) -> Iterator[None]:
    """``logger`` at ``level`` (where lower) inside the block; its descendants that take their level from it keep
    theirs (torch's artifact loggers, as ``torch._inductor.codecache.__output_code``, hang below the plugin's)."""
    before = logger.getEffectiveLevel()
    if before <= level:
        yield
        return
    prefix = logger.name + "."
    pinned = [child for name, child in list(logging.Logger.manager.loggerDict.items())
              if name.startswith(prefix) and isinstance(child, logging.Logger) and _inherits(child, logger)]
    own = logger.level
    for child in pinned:
        child.setLevel(before)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(own)
        for child in pinned:
            child.setLevel(logging.NOTSET)


def _inherits(child: logging.Logger, ancestor: logging.Logger) -> bool:
    """Whether ``child`` takes its level from ``ancestor`` (no logger between them sets one)."""
    node: logging.Logger | None = child
    while node is not None and node is not ancestor:
        if node.level != logging.NOTSET:
            return False
        node = node.parent
    return node is ancestor
