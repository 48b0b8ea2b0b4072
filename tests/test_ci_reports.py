"""The plugin's figures where CI users look: JUnit XML properties, the GitHub job summary, pytest-html's
table, the JSON report's schema, and progress of long work on a terminal."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterator

import pytest

from conftest import report_schema_errors
from helpers import WARMUP_CONFTEST, BuildBundle

TESTS = """
import torch
from conftest import f

def test_warm(warm_cache):
    torch.compile(f)(torch.randn(8))
    warm_cache.assert_hits(fx_graph=1)

def test_cold(cold_cache):
    torch.compile(lambda x: x.cos() + 1)(torch.randn(4))
    cold_cache.assert_misses(fx_graph=1)

def test_plain():
    pass
"""


def _properties(xml: Path) -> dict[str, dict[str, str]]:
    """``{test name: {property: value}}`` from a JUnit XML file."""
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        out[case.get("name", "")] = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
    return out


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "n2"])
@pytest.mark.slow
def test_junit_xml_carries_each_compiling_tests_figures(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], workers: list[str]
) -> None:
    """Real compiles; the properties match the JSON report's figures, with and without xdist."""
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=TESTS)
    result = run_inner(*workers, "--junitxml=junit.xml", "--compile-cache-report=report.json",
                       f"--compile-cache-bundle={pytester.path / 'b.bundle'}")
    result.assert_outcomes(passed=3)
    props = _properties(pytester.path / "junit.xml")
    tests = json.loads((pytester.path / "report.json").read_text())["tests"]
    warm, cold = props["test_warm"], props["test_cold"]
    assert warm["compilecache.fx_graph.hits"] == "1" and warm["compilecache.fx_graph.misses"] == "0"
    assert warm["compilecache.fx_graph.from_bundle"] == "1"
    assert cold["compilecache.fx_graph.misses"] == "1" and cold["compilecache.fx_graph.hits"] == "0"
    assert cold["compilecache.dynamo.graphs"] == "1" and cold["compilecache.dynamo.recompiles"] == "0"
    assert cold["compilecache.dynamo.graph_breaks"] == "0"
    for name, got in (("test_warm", warm), ("test_cold", cold)):
        stats = tests[f"test_model.py::{name}"]
        assert float(got["compilecache.compile_seconds"]) == pytest.approx(stats["compile_seconds"], abs=1e-3)
        assert float(got["compilecache.compile_seconds"]) > 0
        for layer in ("fx_graph", "aot_autograd"):
            for kind in ("hits", "misses", "from_bundle"):
                assert got[f"compilecache.{layer}.{kind}"] == str(stats[layer][kind]), (name, layer, kind)
    assert "compilecache.triton.hits" not in cold, "a layer not observable on this CPU machine has no property"
    assert not any(k.startswith("compilecache.") for k in props["test_plain"]), "it compiled nothing"


def _summary_run(pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult],
                 monkeypatch: pytest.MonkeyPatch, summary: Path | None, *args: str) -> pytest.RunResult:
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=TESTS)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    if summary is not None:
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    return run_inner(f"--compile-cache-bundle={pytester.path / 'b.bundle'}", *args)


@pytest.mark.slow
def test_job_summary_is_appended_with_a_table_of_compiling(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An earlier step's text stays; the section tells the bundle's story and tables the compiling tests."""
    summary = pytester.path / "step_summary.md"
    summary.write_text("## An earlier step\n\nits text")
    _summary_run(pytester, run_inner, monkeypatch, summary).assert_outcomes(passed=3)
    text = summary.read_text()
    assert text.startswith("## An earlier step\n\nits text\n## compilecache\n"), text
    assert text.count("## compilecache") == 1
    assert "  - warmup ran here and wrote " in text  # the terminal's words, nested under its process
    assert "- compile time in tests:" in text
    table = [line for line in text.splitlines() if line.startswith("| `test_model.py::")]
    assert {row.split("`")[1] for row in table} == {"test_model.py::test_warm", "test_model.py::test_cold"}, text
    assert "| fx_graph | 1 | 1 |" in text, text  # one hit (warm), one miss (cold)
    second = _summary_run(pytester, run_inner, monkeypatch, summary)  # a warm run, appended after the first
    second.assert_outcomes(passed=3)
    again = summary.read_text()
    assert again.startswith(text) and again.count("## compilecache") == 2
    assert "loaded:" in again[len(text):] and "in the building run" in again[len(text):], again[len(text):]
    # A newcomer read an unexplained "**main**:" and the bundle's path twice in one line.
    bundle_line = next(line for line in again[len(text):].splitlines() if line.startswith("- bundle: loaded:"))
    assert "**main**" not in again and bundle_line.count("b.bundle") == 1, bundle_line


def test_no_job_summary_outside_github_actions(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without GITHUB_STEP_SUMMARY nothing is written anywhere: the run's folder holds no new file."""
    pytester.makeconftest("")
    pytester.makepyfile(test_model="def test_cold(cold_cache):\n    pass\n")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    before = {p for p in pytester.path.rglob("*") if "tmp" not in p.parts}
    run_inner("-p", "no:cacheprovider").assert_outcomes(passed=1)
    after = {p for p in pytester.path.rglob("*") if "tmp" not in p.parts and "__pycache__" not in p.parts}
    assert after - before == set(), after - before


HTML_HEADERS = ("Compile s", "FX hits", "FX misses")


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _render(page: Path, *extra: str) -> str:
    """The page's DOM after its scripts ran, from headless Chromium."""
    chromium = _chromium()
    assert chromium is not None
    profile = tempfile.mkdtemp(prefix="chromium-", dir="/tmp")  # its socket's path must stay short
    try:
        out = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                              f"--user-data-dir={profile}", *extra, "--dump-dom", page.as_uri()],
                             capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": "/tmp"})
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "n2"])
@pytest.mark.slow
def test_pytest_html_table_gains_compile_columns(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], workers: list[str]
) -> None:
    """The columns are in the rendered table (headless Chromium runs pytest-html's scripts), with the counts."""
    pytest.importorskip("pytest_html", reason="pytest-html is not installed (pip install -e '.[test]')")
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=TESTS)
    result = run_inner(*workers, "--html=report.html", "--self-contained-html", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    page = pytester.path / "report.html"
    raw = page.read_text()
    assert all(f">{h}</th>" in raw for h in HTML_HEADERS)
    if _chromium() is None:
        pytest.skip("chromium is not installed (apt-get install chromium): the rendered table is not checked")
    dom = _render(page)
    header = re.search(r'<thead id="results-table-head">.*?</thead>', dom, re.S)
    assert header is not None and all(f">{h}</th>" in header.group(0) for h in HTML_HEADERS), dom[:3000]
    rows = {m.group(1): m.group(0) for m in re.finditer(r'<td class="col-testId">([^<]*)</td>.*?</tr>', dom, re.S)}
    cold = rows["test_model.py::test_cold"]
    assert re.search(r'<td class="col-fx_hits">0</td>\s*<td class="col-fx_misses">1</td>', cold), cold
    seconds = re.search(r'<td class="col-compile_seconds">([0-9.]+)</td>', cold)
    assert seconds is not None and float(seconds.group(1)) > 0
    plain = rows["test_model.py::test_plain"]
    assert '<td class="col-compile_seconds"></td>' in plain, "a test that compiled nothing has empty cells"


def test_no_compile_columns_without_the_plugin_and_no_hook_errors_without_pytest_html(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    """A pytest-html report made without this plugin has no compile columns; without pytest-html the plugin
    registers none of its hooks (an unknown hook would fail the run)."""
    pytest.importorskip("pytest_html", reason="pytest-html is not installed (pip install -e '.[test]')")
    pytester.makepyfile(test_model="def test_plain():\n    pass\n")
    run_inner("-p", "no:compilecache", "--html=report.html", "--self-contained-html").assert_outcomes(passed=1)
    raw = (pytester.path / "report.html").read_text()
    assert "col-duration" in raw and not any(f">{h}</th>" in raw for h in HTML_HEADERS)
    pytester.makepyfile(test_model="def test_cold(cold_cache):\n    pass\n")
    result = run_inner("-p", "no:html", "--compile-cache-report=report.json")
    result.assert_outcomes(passed=1)
    output = result.stdout.str() + result.stderr.str()
    assert "PluginValidationError" not in output and "unknown hook" not in output, output


@pytest.mark.slow
def test_every_report_matches_the_published_schema(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    """A real report validates; a report with a count of the wrong type does not (the check can fail)."""
    pytest.importorskip("jsonschema")
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=TESTS)
    run_inner("--compile-cache-report=report.json").assert_outcomes(passed=3)
    report = json.loads((pytester.path / "report.json").read_text())
    assert report_schema_errors(report) == []
    broken = json.loads(json.dumps(report))
    broken["tests"]["test_model.py::test_cold"]["fx_graph"]["misses"] = "1"
    del broken["bundle"]["problems"]
    errors = report_schema_errors(broken)
    assert any("test_model.py::test_cold/fx_graph" in e for e in errors), errors
    assert any("'problems' is a required property" in e for e in errors), errors
    (pytester.path / "report.json").unlink()  # broken on purpose is not left for the check of every report


class _Trickle(BaseHTTPRequestHandler):
    """Serves one bundle slowly (about ``SECONDS`` for the whole), with ranges, sizes and an ETag, as a store does."""

    body = b""
    SECONDS = 3.0

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _head(self, start: int, end: int) -> None:
        ranged = "Range" in self.headers
        self.send_response(206 if ranged else 200)
        self.send_header("Content-Length", str(end - start))
        self.send_header("ETag", '"v1"')
        self.send_header("Accept-Ranges", "bytes")
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(self.body)}")
        self.end_headers()

    def _range(self) -> tuple[int, int]:
        match = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if not match:
            return 0, len(self.body)
        return int(match.group(1)), min(len(self.body), int(match.group(2) or len(self.body) - 1) + 1)

    def do_HEAD(self) -> None:
        self._head(*self._range())

    def do_GET(self) -> None:
        start, end = self._range()
        self._head(start, end)
        step = 16 * 1024
        pause = self.SECONDS * step / max(len(self.body), 1)
        for at in range(start, end, step):
            self.wfile.write(self.body[at:min(end, at + step)])
            self.wfile.flush()
            time.sleep(pause)


@pytest.fixture
def slow_bundle_url(build_bundle: BuildBundle) -> Iterator[str]:
    """A real bundle (of the warmup in WARMUP_CONFTEST) served by a loopback server that trickles it."""
    handler = type("Handler", (_Trickle,), {"body": build_bundle({"conftest.py": WARMUP_CONFTEST,
                                                                  "test_model.py": TESTS}).read_bytes()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/suite.bundle"
    server.shutdown()
    thread.join()


def _inner_args(*args: str) -> list[str]:
    """pytest's arguments for an inner run of this module."""
    return ["-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:logging", *args]


@pytest.mark.slow
def test_a_slow_bundle_download_shows_progress_on_a_terminal_only(
    pytester: pytest.Pytester, private_tmp: Path, shared_headers_dir: Path, slow_bundle_url: str,
    on_a_terminal: Callable[[list[str], Path], tuple[int, str]],
    run_session: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """On a pseudo-terminal the download rewrites one line with bytes and seconds, then erases it; piped, or
    with -q -q, nothing of it; under -n 2 the workers download silently and the run's output is whole."""
    pytest.importorskip("aiohttp", reason="aiohttp is not installed (pip install 'pytest-compilecache[http]')")
    pytester.makeconftest(WARMUP_CONFTEST)
    pytester.makepyfile(test_model=TESTS)
    pytester.makeini(f"[pytest]\ncompile_cache_headers_dir = {shared_headers_dir}\n"
                     f"compile_cache_home = {pytester.path / 'home'}\n")
    status, text = on_a_terminal(_inner_args(f"--compile-cache-bundle={slow_bundle_url}"), pytester.path)
    assert status == 0, text
    shown = re.findall(rf"\rcompilecache: downloading {re.escape(slow_bundle_url)}: [0-9.]+ of [0-9.]+ MB \(\d+%\), "
                       r"\d+ s", text)
    assert shown, text
    assert "\r" + " " * 100 in text, "the line is erased once the download is done"
    assert "3 passed" in text and "loaded" in text
    shutil.rmtree(pytester.path / "home")  # this machine's copy of the bundle: the next runs download again
    piped = run_session(_inner_args(f"--compile-cache-bundle={slow_bundle_url}"), pytester.path)
    assert piped.returncode == 0 and "3 passed" in piped.stdout, piped.stdout
    assert "downloading" not in piped.stdout and "\r" not in piped.stdout
    for args in (["-q", "-q"], ["-n", "2"]):
        shutil.rmtree(pytester.path / "home")
        status, text = on_a_terminal(_inner_args(f"--compile-cache-bundle={slow_bundle_url}", *args),
                                      pytester.path)
        assert status == 0 and ("3 passed" in text or args == ["-q", "-q"]), text
        assert "compilecache: downloading" not in text, (args, text)
        assert "on demand: 1 of 1 fx_graph" in text, "the download did happen"


@pytest.mark.slow
def test_a_long_warmup_shows_progress_on_a_terminal(
    pytester: pytest.Pytester, private_tmp: Path, shared_headers_dir: Path,
    on_a_terminal: Callable[[list[str], Path], tuple[int, str]],
) -> None:
    """A warmup longer than WARMUP_AFTER shows its seconds on a terminal, and the line is gone before the tests'."""
    from pytest_compilecache.session.progress import WARMUP_AFTER

    pytester.makeconftest(WARMUP_CONFTEST + f"\nimport time\n_compile = pytest_compilecache_warmup\n\n"
                          f"def pytest_compilecache_warmup(cache):\n    time.sleep({WARMUP_AFTER + 1.5})\n"
                          "    _compile(cache)\n")
    pytester.makepyfile(test_model=TESTS)
    pytester.makeini(f"[pytest]\ncompile_cache_headers_dir = {shared_headers_dir}\n"
                     f"compile_cache_home = {pytester.path / 'home'}\n")
    status, text = on_a_terminal(_inner_args(f"--compile-cache-bundle={pytester.path / 'b.bundle'}"),
                                  pytester.path)
    assert status == 0 and "3 passed" in text, text
    assert re.search(r"\rcompilecache: pytest_compilecache_warmup running, \d+ s", text), text
    assert re.search(r"\r +\r\r?\n(\r?\n)?test_model\.py \.\.\.", text), text
