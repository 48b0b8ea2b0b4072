"""The README's and the documentation's examples run as pasted, and the sample output is real.

A python block that starts with a ``# NAME.py`` line is a file of a suite: the files of one page
are written into one folder and pytest runs there, with the plugin, as the page's ``pytest ...``
commands say. Any other python block is a script and must run as it is.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```$", re.M | re.S)
FILE = re.compile(r"# ([\w-]+\.py)\n")


def blocks(page: Path, lang: str) -> list[str]:
    """The bodies of the page's fenced blocks in ``lang`` (``""``: no language given)."""
    return [body for fence, body in FENCE.findall(page.read_text(encoding="utf-8")) if fence == lang]


def files(page: Path) -> dict[str, str]:
    """``{file name: content}`` of the page's python blocks that name a file."""
    out: dict[str, str] = {}
    for body in blocks(page, "python"):
        named = FILE.match(body)
        if named:
            assert named.group(1) not in out, f"{page.name}: two blocks are {named.group(1)}"
            out[named.group(1)] = body
    return out


def scripts(page: Path) -> list[str]:
    """The page's python blocks that name no file."""
    return [body for body in blocks(page, "python") if not FILE.match(body)]


def commands(page: Path) -> list[list[str]]:
    """The arguments of each ``pytest ...`` line of the page's bash blocks."""
    out = []
    for body in blocks(page, "bash"):
        for line in body.splitlines():
            if line.startswith("pytest "):
                out.append(shlex.split(line, comments=True)[1:])
    return out


def normalized(line: str) -> str:
    """A line of output with its whitespace collapsed, bundle folders and key prefixes left out."""
    line = re.sub(r"\S*/(\.compile-cache/)", r".../\1", line)
    line = re.sub(r"\([a-z0-9]{12}\.\.\.\)", "(KEY...)", line)
    return " ".join(line.split())


def plugin_lines(lines: list[str]) -> list[str]:
    """The lines the plugin wrote into a run's output: its header lines and its summary section."""
    out, inside = [], False
    for line in lines:
        if line.startswith("=") and line.strip("= ") and inside:
            inside = False
        if line.startswith("=") and line.strip("= ") == "compilecache":
            inside = True
        if inside or line.startswith("compilecache:"):
            out.append(line)
    return out


def test_every_python_block_is_a_file_or_a_script() -> None:
    for page in PAGES:
        for body in blocks(page, "python"):
            compile(body, f"{page.name} block", "exec")
    assert set(files(README)) == {"model.py", "conftest.py", "test_model.py"}
    assert commands(README), "the README's Quickstart has no pytest command"


PIP = re.compile(r"pip install ([^`\n]*)")
PINNED = re.compile(r"pytest-compilecache(\[[\w,]+\])? @ git\+https://\S+@(\S+)")
RECIPES = sorted((ROOT / "examples").rglob("*.yml"))


def test_every_install_line_works_from_what_exists() -> None:
    """The package is on no index: each line that installs it names a clone (``.``, ``'.[s3]'``), a wheel, or a
    git URL pinned to a tag or commit. Each install line of torch in a code block installs NumPy beside it
    (torch does not depend on it, and warns ``Failed to initialize NumPy`` on every run without it)."""
    checked = 0
    for page in PAGES + RECIPES:
        text = page.read_text(encoding="utf-8")
        fences = [m.span() for m in FENCE.finditer(text)] if page.suffix == ".md" else [(0, len(text))]
        for found in PIP.finditer(text):
            if text[found.end():].startswith("` finds nothing"):  # the README saying it is on no index
                continue
            words = shlex.split(found.group(1), comments=True)
            for word in words:
                if word.startswith("pytest-compilecache") or word.startswith("pytest_compilecache"):
                    pinned = PINNED.fullmatch(word)
                    assert pinned and pinned.group(2) not in ("main", "master"), (
                        f"{page.name}: `pip install {found.group(1)}` cannot work: the package is on no index; "
                        "name a clone, a wheel, or a git URL pinned to a tag or commit")
                    checked += 1
            in_block = any(start <= found.start() < end for start, end in fences)
            if in_block and any(w.startswith("torch==") or w == "torch" for w in words):
                assert "numpy" in words or "'.[test]'" in found.group(1), f"{page.name}: {found.group(0)}"
                checked += 1
    assert checked >= 5
    (install,) = [line for body in blocks(README, "bash") for line in body.splitlines() if "pip install torch" in line]
    assert install.startswith("pip install torch==2.13.0 numpy --extra-index-url https://download.pytorch.org/whl/cpu")


@pytest.mark.parametrize("page", [p for p in PAGES if scripts(p)], ids=lambda p: p.name)
def test_scripts_run(page: Path, tmp_path: Path) -> None:
    for body in scripts(page):
        done = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{page.name}:\n{body}\n{done.stderr}"


@pytest.mark.slow
def test_readme_quickstart_runs_as_pasted_and_its_failure_is_real(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    quickstart = files(README)
    for name, content in quickstart.items():
        (pytester.path / name).write_text(content)
    home = f"compile_cache_home = {pytester.path / 'home'}"
    runs = commands(README)
    for args in runs:
        result = run_inner(*args, "-o", "verbosity_compilecache=auto", ini=home)
        result.assert_outcomes(passed=2)
    # The warm run, where all is well: the plugin adds at most 3 lines (its header line, the section's, one line).
    added = plugin_lines(result.outlines)
    assert len(added) <= 3, "\n".join(added)
    assert any("loaded, unchanged; FX graphs: 2 hit (1 from the bundle), 1 missed (all in cold_cache or isolated tests)" in line
               for line in added), "\n".join(added)
    bundle = next(a.split("=", 1)[1] for a in runs[0] if a.startswith("--compile-cache-bundle="))
    assert (pytester.path / bundle).is_file()
    # Only the cold test: nothing of the bundle is read, so no size is claimed for it (the CPU probes placed for
    # the cold test's compile were counted as 0.19 MB "read when needed").
    cold = run_inner(*runs[-1], "-k", "compiles_once", ini=home)
    cold.assert_outcomes(passed=1)
    (on_demand,) = [line for line in cold.outlines if "on demand:" in line]
    assert on_demand.strip() == "on demand: 0 of 1 fx_graph, 0 of 1 aot_autograd, 0 of 1 cpp read when needed", \
        on_demand

    # The README's failing variant: the warm test feeds a batch of 4 in place of example_input().
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert "(`torch.randn(4, 16)` in place of `example_input()`)" in text
    test_file = quickstart["test_model.py"]
    warm = test_file.index("def test_model_is_warm")
    assert test_file[warm:].count("(example_input())") == 1
    (pytester.path / "test_model.py").write_text(
        test_file[:warm] + test_file[warm:].replace("(example_input())", "(torch.randn(4, 16))"))
    result = run_inner(*runs[-1], ini=home)
    result.assert_outcomes(passed=1, failed=1)
    assert "per-layer totals over all tests:" in result.outlines  # -o verbosity_compilecache=1, as -v

    (sample,) = [b for b in blocks(README, "") if "AssertionError: compile cache misses differ" in b]
    real = [normalized(line) for line in result.outlines]
    gpu = not any("none is available" in line for line in real)
    for line in sample.splitlines():
        if gpu and ("autotune" in line or "triton" in line):
            continue
        assert normalized(line) in real, f"the README's sample line is not in a real run:\n{line}\n\n" + "\n".join(
            result.outlines)


@pytest.mark.parametrize("page", [p for p in PAGES[1:] if files(p)], ids=lambda p: p.name)
@pytest.mark.slow
def test_documentation_suites_pass(
    page: Path, pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    for name, content in files(page).items():
        (pytester.path / name).write_text(content)
    result = run_inner(ini=f"compile_cache_home = {pytester.path / 'home'}")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 1 and not outcomes.get("failed") and not outcomes.get("errors"), (
        "\n".join(result.outlines))
