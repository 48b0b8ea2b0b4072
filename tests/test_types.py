"""The package type-checks strictly at the floor of ``requires-python``: anything newer than it fails."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_mypy_checks_the_package_at_the_python_floor() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    floor = re.search(r'^requires-python = ">=([0-9.]+)"$', text, re.M)
    checked = re.search(r'^python_version = "([0-9.]+)"$', text, re.M)
    assert floor and checked and floor.group(1) == checked.group(1), "mypy must check at the floor of requires-python"
    result = _mypy()
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_floor_check_fails_on_what_the_floor_lacks(tmp_path: Path) -> None:
    """typing.Self is 3.11: code using it at run time fails the check at 3.10, as a 3.10 import would."""
    (tmp_path / "m.py").write_text("from typing import Self\n")
    result = _mypy("--python-version", "3.10", str(tmp_path / "m.py"))
    assert result.returncode != 0 and 'has no attribute "Self"' in result.stdout, result.stdout
