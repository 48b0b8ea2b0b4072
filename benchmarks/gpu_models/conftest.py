"""The GPU model suite's warmup: the three real models, compiled once for the whole session."""

import models


def pytest_compilecache_warmup(cache):
    for name in models.MODELS:
        models.compile_and_run(name)
