"""Small helpers shared by the test modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from zygote import Zygotes


#: Inner runs print the whole summary (as -v), which most tests read: first on the command line of every inner run
#: (pytester's, :func:`run_pytest`'s; pytester clears ``PYTEST_ADDOPTS``), and in
#: ``PYTEST_ADDOPTS`` for the rest; the tests of the quiet default give ``-o verbosity_compilecache=auto`` after it.
SAY_EVERYTHING = "-o verbosity_compilecache=1"


def run_pytest(zygotes: Zygotes | None, args: list[str], cwd: Path, env: Mapping[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, "-m", "pytest", *args], cwd=cwd, env=env, capture_output=True,
    text=True, timeout=timeout)``, forked from the zygote where that sees what a fresh process sees."""
    import tempfile

    args = [*SAY_EVERYTHING.split(), *args]
    command = [sys.executable, "-m", "pytest", *args]
    full_env = dict(os.environ if env is None else env)
    zygote = zygotes.next(full_env) if zygotes is not None else None
    if zygote is None:
        return subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="run-pytest-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        try:
            code = zygote.run(args, cwd, full_env, out, err, timeout)
        except subprocess.TimeoutExpired:
            raise subprocess.TimeoutExpired(command, timeout, out.read_text(errors="replace"),
                                            err.read_text(errors="replace")) from None
        return subprocess.CompletedProcess(command, code, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def report_schema_errors(document: Any) -> list[str]:
    """Where ``document`` breaks the JSON report's published schema (``pytest_compilecache/report/schema.json``)."""
    from importlib import resources

    import jsonschema

    schema = json.loads((resources.files("pytest_compilecache.report") / "schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in validator.iter_errors(document)]


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
