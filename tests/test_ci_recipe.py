"""The CI recipe of docs/ci.md runs: its shell steps, on two emulated GitHub Actions runners.

The recipe is ``examples/github-actions/compile-cache.yml`` (docs/ci.md includes that file). Each runner
gets a fresh HOME and a fresh copy of a small project (the README's Quickstart); ``actions/cache/restore``
and ``actions/cache/save`` are emulated by copying the listed paths from and to a local store, by key, with
GitHub's rules (an exact key first, then the newest entry under each ``restore-keys`` prefix in turn; a
key is written once). The ``run:`` steps run in bash as written, their ``${{ ... }}`` expressions
substituted as GitHub would for a push to the default branch; the install step is left out (this
environment holds what it installs, and the test reaches no index). The runners' ``CXX`` is the suite's
(``tests/cached_cxx.py``, as for every inner run: g++, a kernel's or a precompiled header's output kept
once built). The second runner must restore what the first saved, load the
bundle and build no precompiled header again.

The workflow is read with a small reader of the YAML the recipe uses (block mappings and sequences,
``|`` blocks, quoted scalars): PyYAML is not a dependency. Where PyYAML is installed, the two readings
must agree.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from test_readme import README, files

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples" / "github-actions" / "compile-cache.yml"
CI_PAGE = ROOT / "docs" / "ci.md"
HOME_CACHE = Path(".cache") / "pytest-compilecache"


# -- a reader of the YAML the recipe is written in --------------------------------------------------------

_KEY = re.compile(r"([\w.-]+):(?:\s+(.*))?$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _scalar(text: str) -> Any:
    if text[:1] in "\"'":
        quote = text[0]
        end = text.index(quote, 1)
        while quote == "'" and text[end + 1:end + 2] == "'":
            end = text.index(quote, end + 2)
        body = text[1:end]
        return body.replace("''", "'") if quote == "'" else body
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(part.strip()) for part in text[1:-1].split(",") if part.strip()]
    return text.split(" #", 1)[0].rstrip()


def read_yaml(text: str) -> Any:
    """The recipe's YAML as Python objects (strings, lists and dicts; scalars stay strings)."""
    lines = text.splitlines()
    pos = 0

    def skip() -> None:
        nonlocal pos
        while pos < len(lines) and (not lines[pos].strip() or lines[pos].lstrip().startswith("#")):
            pos += 1

    def literal(parent: int) -> str:  # a "|" block: its lines, less their common indentation
        nonlocal pos
        body: list[str] = []
        while pos < len(lines) and (not lines[pos].strip() or _indent(lines[pos]) > parent):
            body.append(lines[pos])
            pos += 1
        while body and not body[-1].strip():
            body.pop()
        margin = min(_indent(line) for line in body if line.strip())
        return "".join(line[margin:] + "\n" for line in body)

    def block(indent: int) -> Any:
        nonlocal pos
        skip()
        if lines[pos].lstrip().startswith("- "):
            items = []
            while pos < len(lines) and _indent(lines[pos]) == indent and lines[pos].lstrip().startswith("- "):
                lines[pos] = " " * (indent + 2) + lines[pos][indent + 2:]  # the item is a mapping one level in
                items.append(block(indent + 2))
                skip()
            return items
        mapping: dict[str, Any] = {}
        while pos < len(lines) and _indent(lines[pos]) == indent:
            found = _KEY.match(lines[pos].strip())
            assert found, f"line {pos + 1} of the recipe is not `key: value`: {lines[pos]!r}"
            key, rest = found.group(1), (found.group(2) or "").strip()
            pos += 1
            if rest == "|":
                mapping[key] = literal(indent)
            elif rest and not rest.startswith("#"):
                mapping[key] = _scalar(rest)
            else:
                skip()
                deeper = pos < len(lines) and _indent(lines[pos]) > indent
                mapping[key] = block(_indent(lines[pos])) if deeper else None
            skip()
        return mapping

    return block(0)


def test_the_reader_reads_as_pyyaml_does() -> None:
    yaml = pytest.importorskip("yaml")
    text = RECIPE.read_text(encoding="utf-8")
    assert read_yaml(text)["jobs"] == yaml.safe_load(text)["jobs"]


def test_the_page_shows_the_recipe_file() -> None:
    page = CI_PAGE.read_text(encoding="utf-8")
    assert '--8<-- "examples/github-actions/compile-cache.yml"' in page
    assert page.index("compile-cache.yml") < page.index("## Shards"), "the common case comes first"


# -- an emulated runner ---------------------------------------------------------------------------------


class Runner:
    """One GitHub Actions runner: a fresh HOME, workspace and TMPDIR; on a push to the default branch (with
    ``default_branch=False``, on a pull request)."""

    def __init__(self, root: Path, project: Path, store: Path, run_id: int, default_branch: bool = True) -> None:
        self.home, self.workspace, self.tmp = root / "home", root / "work", root / "tmp"
        for folder in (self.home, self.tmp):
            folder.mkdir(parents=True)
        self.project, self.store, self.run_id, self.default_branch = project, store, run_id, default_branch
        self.outputs: dict[str, dict[str, str]] = {}
        self.env: dict[str, str] = {}
        self.log: list[str] = []
        self.last_output: dict[str, str] = {}  # what the last run step wrote to $GITHUB_OUTPUT
        self.headers_before: dict[str, dict[str, int]] = {}  # per step name: the headers' mtimes before it ran

    def headers(self) -> dict[str, int]:
        """The mtime of each file in the plugin's home's precompiled-header folder."""
        folder = self.home / HOME_CACHE / "precompiled-headers"
        return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}

    def expression(self, expr: str) -> str:
        expr = expr.strip()
        if expr == "github.ref == format('refs/heads/{0}', github.event.repository.default_branch)":
            return "true" if self.default_branch else "false"
        if expr == "github.run_id":
            return str(self.run_id)
        hashed = re.fullmatch(r"hashFiles\('([^']+)'\)", expr)
        if hashed:
            path = self.workspace / hashed.group(1)
            return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        output = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expr)
        if output:
            return self.outputs.get(output.group(1), {}).get(output.group(2), "")
        raise AssertionError(f"the emulated runner does not know the recipe's expression ${{{{ {expr} }}}}")

    def substitute(self, text: str) -> str:
        return re.sub(r"\$\{\{(.*?)\}\}", lambda m: self.expression(m.group(1)), text)

    def condition(self, text: str) -> bool:
        verdict = True
        for term in (t.strip() for t in text.split("&&")):
            compared = re.fullmatch(r"env\.(\w+) == '([^']*)'", term)
            if term == "!cancelled()":
                continue
            assert compared, f"the emulated runner does not know the condition {term!r}"
            verdict = verdict and self.env.get(compared.group(1)) == compared.group(2)
        return verdict

    def paths(self, listed: str) -> list[Path]:
        out = []
        for line in filter(None, (ln.strip() for ln in listed.splitlines())):
            out.append(self.home / line[2:] if line.startswith("~/") else self.workspace / line)
        return out

    def restore(self, step: dict[str, Any]) -> dict[str, str]:
        settings = {k: self.substitute(v) for k, v in step["with"].items()}
        key = settings["key"]
        entries = sorted((p for p in self.store.iterdir()), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        found = next((e for e in entries if e.name == key), None)
        for prefix in filter(None, (ln.strip() for ln in settings.get("restore-keys", "").splitlines())):
            found = found or next((e for e in entries if e.name.startswith(prefix)), None)
        if found is not None:
            for i, path in enumerate(self.paths(settings["path"])):
                kept = found / str(i)
                if kept.is_dir():
                    shutil.copytree(kept, path, symlinks=True)
                elif kept.is_file():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(kept, path)
        self.log.append(f"restore {key}: {found.name if found else 'no entry'}")
        return {"cache-hit": str(found is not None and found.name == key).lower(), "cache-primary-key": key,
                "cache-matched-key": found.name if found else ""}

    def save(self, step: dict[str, Any]) -> None:
        settings = {k: self.substitute(v) for k, v in step["with"].items()}
        entry = self.store / settings["key"]
        assert settings["key"], "the save step has no key"
        if entry.exists():  # keys are immutable: GitHub skips the save
            self.log.append(f"save {entry.name}: exists")
            return
        partial = self.store / f".{entry.name}.partial"
        partial.mkdir()
        for i, path in enumerate(self.paths(settings["path"])):
            if path.is_dir():
                shutil.copytree(path, partial / str(i), symlinks=True)
            elif path.is_file():
                shutil.copy2(path, partial / str(i))
        partial.rename(entry)
        self.log.append(f"save {entry.name}")

    def shell(self, script: str, extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        output = self.tmp / "github_output"
        output.write_text("")
        keep = ("PATH", "LANG", "LC_ALL", "USER", "LOGNAME", "SHELL", "TERM", "CXX")
        env = {k: v for k, v in os.environ.items() if k in keep}
        env.update(self.env, HOME=str(self.home), TMPDIR=str(self.tmp), RUNNER_OS="Linux", GITHUB_OUTPUT=str(output),
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")  # setup-python's python
        env.update(extra_env)
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                              cwd=self.workspace, env=env, capture_output=True, text=True, timeout=300)
        self.log.append(f"$ {script}\n{done.stdout}\n{done.stderr}")
        self.last_output = dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
        return done

    def run(self, workflow: dict[str, Any], extra_env: dict[str, str]) -> None:
        job = workflow["jobs"]["test"]
        self.env = {k: self.substitute(v) for k, v in (job.get("env") or {}).items()}
        for step in job["steps"]:
            uses, ident = step.get("uses", ""), step.get("id", "")
            if "if" in step and not self.condition(step["if"]):
                self.log.append(f"skipped: {step.get('name', uses)}")
                continue
            if uses.startswith("actions/checkout@"):
                shutil.copytree(self.project, self.workspace)
            elif uses.startswith("actions/setup-python@"):
                self.outputs[ident] = {"python-version": ".".join(map(str, sys.version_info[:3]))}
            elif uses.startswith("actions/cache/restore@"):
                self.outputs[ident] = self.restore(step)
            elif uses.startswith("actions/cache/save@"):
                self.save(step)
            elif step.get("name") == "Install":  # this environment holds it all; no index is reached
                continue
            else:
                assert "run" in step and not uses, f"the emulated runner does not know the step {step}"
                self.headers_before[step.get("name", ident)] = self.headers()
                done = self.shell(self.substitute(step["run"]), extra_env)
                assert done.returncode == 0, "\n".join(self.log)
                self.outputs[ident] = self.last_output


def test_a_pull_request_reads_and_saves_nothing(tmp_path: Path) -> None:
    """The recipe's conditions on a pull request: the tests run without --compile-cache-update (a stand-in
    pytest records its arguments), and the save step is skipped."""
    workflow = read_yaml(RECIPE.read_text(encoding="utf-8"))
    steps = workflow["jobs"]["test"]["steps"]
    for default_branch, update, saves in ((True, True, True), (False, False, False)):
        runner = Runner(tmp_path / str(default_branch), tmp_path, tmp_path, run_id=1, default_branch=default_branch)
        runner.workspace.mkdir()
        runner.env = {k: runner.substitute(v) for k, v in workflow["jobs"]["test"]["env"].items()}
        stand_in = runner.tmp / "bin" / "pytest"
        stand_in.parent.mkdir()
        stand_in.write_text(f'#!/bin/sh\necho "$@" > "{runner.tmp}/args"\n')
        stand_in.chmod(0o755)
        tests = next(s for s in steps if s.get("name") == "Tests")
        done = runner.shell(runner.substitute(tests["run"]), {"PATH": f"{stand_in.parent}:{os.environ['PATH']}"})
        assert done.returncode == 0, done.stderr
        args = (runner.tmp / "args").read_text().split()
        assert "--compile-cache-bundle=.compile-cache/suite.bundle" in args
        assert ("--compile-cache-update" in args) is update, args
        save = next(s for s in steps if s.get("uses", "").startswith("actions/cache/save@"))
        assert runner.condition(save["if"]) is saves
        assert all("if" not in s for s in steps if s is not save), "only the save step depends on the branch"


@pytest.mark.slow
def test_two_runners_the_second_restores_what_the_first_saved(tmp_path: Path) -> None:
    started = time.monotonic()
    workflow = read_yaml(RECIPE.read_text(encoding="utf-8"))
    install = next(s["run"] for s in workflow["jobs"]["test"]["steps"] if s.get("name") == "Install")
    assert "pip install torch==2.13.0 numpy --extra-index-url https://download.pytorch.org/whl/cpu" in install
    assert '"pytest-compilecache @ git+https://github.com/OWNER/pytest-compilecache@COMMIT"' in install

    project = tmp_path / "project"
    project.mkdir()
    for name, content in files(README).items():  # the README's Quickstart: a model, its warmup hook, two tests
        (project / name).write_text(content)
    (project / "requirements.txt").write_text("torch==2.13.0\nnumpy\n")
    store = tmp_path / "cache-store"
    store.mkdir()

    reports = {n: tmp_path / f"report-{n}.json" for n in (1, 2)}
    first = Runner(tmp_path / "runner-1", project, store, run_id=101)
    first.run(workflow, {"PYTEST_ADDOPTS": f"--compile-cache-report={reports[1]}"})
    headers = first.home / HOME_CACHE / "precompiled-headers"
    assert (first.workspace / ".compile-cache" / "suite.bundle").is_file(), "\n".join(first.log)
    assert any(p.is_file() for p in headers.rglob("*")), f"runner 1 built no header in {headers}"
    assert first.outputs["restore"]["cache-matched-key"] == ""
    (saved,) = [p.name for p in store.iterdir()]
    assert saved.endswith("-101") and saved == first.outputs["restore"]["cache-primary-key"]

    second = Runner(tmp_path / "runner-2", project, store, run_id=102)
    second.run(workflow, {"PYTEST_ADDOPTS": f"--compile-cache-report={reports[2]}"})
    assert second.outputs["restore"]["cache-matched-key"] == saved, "\n".join(second.log)
    assert second.outputs["restore"]["cache-hit"] == "false"
    document = json.loads(reports[2].read_text())
    processes = document["bundle"]["processes"]
    assert processes, document["bundle"]
    for process in processes:
        assert process["status"] == "loaded", process
        assert process.get("headers_seconds", 0) == 0, f"runner 2 built precompiled headers again: {process}"
    warm = next(v for k, v in document["tests"].items() if k.endswith("test_model_is_warm"))
    assert warm["fx_graph"]["hits"] >= 1 and warm["fx_graph"]["misses"] == 0, warm
    restored = second.headers_before["Tests"]
    assert restored and restored == first.headers(), "runner 2 restored runner 1's precompiled headers"
    assert second.headers() == restored, "runner 2 built no precompiled header again"
    assert sorted(p.name for p in store.iterdir()) == [saved, saved[:-len("101")] + "102"], "\n".join(second.log)
    assert time.monotonic() - started < 300
