"""The plugin's figures where CI users look: JUnit XML properties, and the JSON report's schema."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

import pytest

from helpers import report_schema_errors
from helpers import WARMUP_CONFTEST

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
