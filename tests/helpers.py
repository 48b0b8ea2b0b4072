"""Small helpers shared by the test modules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable
import subprocess
import sys


def fingerprint_here() -> dict[str, str]:
    """This machine's environment fingerprint, computed in a fresh process as the plugin would."""
    out = subprocess.run(
        [sys.executable, "-c", "import json; from pytest_compilecache import _torchapi; "
         "print(json.dumps(_torchapi.environment_fingerprint()))"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout
    return dict(json.loads(out.splitlines()[-1]))


def torch_builds_precompiled_headers() -> bool:
    """Whether this torch's Inductor precompiles C++ headers (torch 2.7 does not), read from its source
    without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    source = Path(spec.origin).parent / "_inductor" / "codecache.py" if spec and spec.origin else None
    return source is not None and "def _precompile_header(" in source.read_text()


#: A conftest whose warmup hook compiles ``f``, for small suites with one warm and one cold test.
WARMUP_CONFTEST = """
import torch

def f(x):
    return torch.sin(x) * 2 + 1

def pytest_compilecache_warmup(cache):
    torch.compile(f)(torch.randn(8))
"""

#: The ``build_bundle`` fixture: ``build_bundle({file name: source}, *pytest args) -> bundle path``.
BuildBundle = Callable[..., Path]
