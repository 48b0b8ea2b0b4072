"""Compile expectations (--compile-cache-expect): recorded from real compiles, compared, kept for review."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import pytest

from pytest_compilecache.expect.records import FIELDS

SUITE = """
import torch


def clean(x):
    return torch.sin(x) * 2 + 1


def breaks(x):
    x = x + 1
    return x * 2


def sized(x):
    return x.cos() - 1


def test_clean(cold_cache):
    torch.compile(clean)(torch.randn(8))


def test_breaks(cold_cache):
    torch.compile(breaks)(torch.randn(4))


def test_sizes(cold_cache):
    torch._dynamo.config.automatic_dynamic_shapes = False  # static sizes: a new size recompiles
    compiled = torch.compile(sized)
    compiled(torch.randn(8))


def test_not_recorded():
    pass
"""

#: The edits that change how two tests compile: a graph break in ``breaks``, a second size in ``test_sizes``.
REGRESSED = SUITE.replace("    x = x + 1\n", "    x = x + 1\n    print('a side effect')\n").replace(
    "    compiled(torch.randn(8))\n", "    compiled(torch.randn(8))\n    compiled(torch.randn(9))\n") + """

def test_new(cold_cache):
    torch.compile(clean)(torch.randn(3))
"""

Run = Callable[..., pytest.RunResult]


def _line(source: str, text: str) -> int:
    """The line of ``text`` in ``source`` as pytester writes it (without the leading blank line)."""
    return next(n for n, line in enumerate(source.strip().splitlines(), 1) if text in line)


def _summary(result: pytest.RunResult) -> str:
    return next(line for line in result.outlines if line.startswith("compile expectations"))


@pytest.mark.slow
@pytest.mark.compat
def test_records_then_fails_exactly_the_tests_that_regressed(pytester: pytest.Pytester, run_inner: Run) -> None:
    """Update twice (the same bytes), then a graph break and a recompile each fail their own test, named."""
    pytester.makepyfile(test_model=SUITE)
    first = run_inner("--compile-cache-expect=exp.json", "--compile-cache-expect-update")
    first.assert_outcomes(passed=4)
    path = pytester.path / "exp.json"
    written = path.read_bytes()
    data = json.loads(written)
    assert sorted(data["tests"]) == ["test_model.py::test_breaks", "test_model.py::test_clean",
                                     "test_model.py::test_sizes"]  # test_not_recorded uses no fixture
    for record in data["tests"].values():
        assert list(record) == ["frames", "graphs", "recompiles", "graph_breaks", "fx_graph.hits",
                                "fx_graph.misses", "fx_graph.bypasses", "aot_autograd.hits", "aot_autograd.misses",
                                "aot_autograd.bypasses"]  # nothing unstable: no cpp, triton, pgo, saved, seconds
        assert record["frames"] == 1 and record["graph_breaks"] == 0 and record["fx_graph.misses"] == 1
    assert set(data["made_with"]) == {"torch", "device"}
    assert str(pytester.path) not in written.decode()
    assert written.count(b"\n") == 4 + 3 + 2  # one line per test
    assert "compile expectations updated: 0 compared, 0 changed, 3 added, 0 removed (exp.json written)" \
        == _summary(first)

    again = run_inner("--compile-cache-expect=exp.json", "--compile-cache-expect-update")
    again.assert_outcomes(passed=4)
    assert path.read_bytes() == written
    assert "3 compared, 0 changed, 0 added, 0 removed (exp.json unchanged)" in _summary(again)

    pytester.makepyfile(test_model=REGRESSED)
    compared = run_inner("--compile-cache-expect=exp.json", "--compile-cache-report=report.json")
    compared.assert_outcomes(passed=3, failed=2)
    out = compared.stdout.str()
    compared.stdout.fnmatch_lines([
        "*_ test_breaks _*",
        "compile behaviour differs from its record in exp.json: *graph_breaks 0 -> 1*",
        "  graph_breaks: recorded 0, now 1",
        f"    graph break at test_model.py:{_line(REGRESSED, 'print(')}: *print*",
        "*_ test_sizes _*",
        "compile behaviour differs from its record in exp.json: *recompiles 0 -> 1*",
        "  recompiles: recorded 0, now 1",
        f"    recompile: sized (test_model.py:{_line(REGRESSED, 'def sized')}): *size mismatch at index 0. "
        "expected 8, actual 9",
    ])
    failures = re.split(r"=+ (?:warnings summary|compilecache|short test summary info)", out[out.index("FAILURES"):])[0]
    assert "torch/" not in failures  # the user's lines, not torch's
    assert _summary(compared) == "compile expectations: 3 compared, 2 regressed, 1 not recorded, 0 unused (exp.json)"
    compared.stdout.fnmatch_lines(["  not recorded (passed; *", "    test_model.py::test_new"])
    assert "FAILED test_model.py::test_clean" not in out
    report = json.loads((pytester.path / "report.json").read_text())["expectations"]
    assert report["compared"] == 3 and report["regressed"] == ["test_model.py::test_breaks",
                                                               "test_model.py::test_sizes"]
    assert path.read_bytes() == written  # comparing never writes

    data["made_with"]["device"] = "another device"
    path.write_text(json.dumps(data))
    elsewhere = run_inner("--compile-cache-expect=exp.json", "-k", "sizes")
    elsewhere.assert_outcomes(failed=1)
    assert "recorded with torch" in elsewhere.stdout.str() and "on another device" in elsewhere.stdout.str()
    assert "fx_graph.misses" not in elsewhere.stdout.str()  # cache outcomes of another device: not compared


@pytest.mark.slow
@pytest.mark.compat
def test_xdist_records_the_same_file_and_unused_records_go_only_in_a_full_update(
    pytester: pytest.Pytester, run_inner: Run
) -> None:
    """-n 2 writes what a serial run writes; -k and a path selection leave the records they did not judge."""
    pytester.makepyfile(test_a="""
        import torch

        def test_one(cold_cache):
            torch.compile(lambda x: x.sin() + 1)(torch.randn(4))

        def test_two(cold_cache):
            torch.compile(lambda x: x.cos() * 3)(torch.randn(4))
        """, test_b="""
        import torch

        def test_three(cold_cache):
            torch.compile(lambda x: x.tan() - 2)(torch.randn(4))
        """)
    run_inner("--compile-cache-expect=serial.json", "--compile-cache-expect-update").assert_outcomes(passed=3)
    run_inner("-n", "2", "--compile-cache-expect=exp.json", "--compile-cache-expect-update").assert_outcomes(passed=3)
    path = pytester.path / "exp.json"
    assert path.read_bytes() == (pytester.path / "serial.json").read_bytes()

    data = json.loads(path.read_text())
    data["tests"]["test_a.py::test_gone"] = data["tests"]["test_a.py::test_one"]
    path.write_text(json.dumps(data))
    (pytester.path / "test_b.py").unlink()
    selected = run_inner("-n", "2", "--compile-cache-expect=exp.json", "--compile-cache-expect-update", "-k", "one")
    selected.assert_outcomes(passed=1)
    kept = json.loads(path.read_text())["tests"]
    assert {"test_a.py::test_gone", "test_a.py::test_two", "test_b.py::test_three"} <= set(kept)
    assert "0 removed" in _summary(selected)

    in_a = run_inner("--compile-cache-expect=exp.json", "test_a.py")
    in_a.assert_outcomes(passed=2)
    assert "1 unused" in _summary(in_a) and "test_a.py::test_gone" in in_a.stdout.str()
    assert "test_b.py::test_three" not in in_a.stdout.str()  # outside the path given: not judged

    full = run_inner("--compile-cache-expect=exp.json", "--compile-cache-expect-update")
    full.assert_outcomes(passed=2)
    assert sorted(json.loads(path.read_text())["tests"]) == ["test_a.py::test_one", "test_a.py::test_two"]
    assert "2 removed" in _summary(full)


@pytest.mark.slow
def test_per_test_isolation_records_tests_without_a_fixture(pytester: pytest.Pytester, run_inner: Run) -> None:
    """Under --compile-cache-isolate every test starts from an empty cache, so its counts are deterministic and
    recorded, a test that compiles nothing too (all zeros, whether or not torch was loaded before it);
    without isolation a test with no fixture is not: it shares the session's cache."""
    pytester.makepyfile(test_plain="""
        import torch

        def test_compiles():
            torch.compile(lambda x: x.sin() * 2)(torch.randn(4))

        def test_compiles_nothing():
            pass
        """)
    run_inner("--compile-cache-expect=plain.json", "--compile-cache-expect-update").assert_outcomes(passed=2)
    assert json.loads((pytester.path / "plain.json").read_text())["tests"] == {}
    run_inner("--compile-cache-isolate", "--compile-cache-expect=exp.json",
              "--compile-cache-expect-update").assert_outcomes(passed=2)
    tests = json.loads((pytester.path / "exp.json").read_text())["tests"]
    assert set(tests) == {"test_plain.py::test_compiles", "test_plain.py::test_compiles_nothing"}, tests
    record = tests["test_plain.py::test_compiles"]
    assert (record["frames"], record["graphs"], record["fx_graph.misses"], record["fx_graph.hits"]) == (1, 1, 1, 0)
    assert set(tests["test_plain.py::test_compiles_nothing"].values()) == {0}
    compared = run_inner("--compile-cache-isolate", "--compile-cache-expect=exp.json", "-p", "no:randomly")
    compared.assert_outcomes(passed=2)
    assert _summary(compared).startswith("compile expectations: 2 compared, 0 regressed")


GOOD = ('{\n "format": 1,\n "made_with": {"device": "cpu", "torch": "2.13.0"},\n "tests": {\n'
        '  "test_x.py::test_a": {"frames": 1, "graphs": 1, "recompiles": 0, "graph_breaks": 0, "fx_graph.hits": 0, '
        '"fx_graph.misses": 1, "fx_graph.bypasses": 0, "aot_autograd.hits": 0, "aot_autograd.misses": 1, '
        '"aot_autograd.bypasses": 0}\n }\n}\n')


@pytest.mark.parametrize(("text", "line", "why"), [
    (GOOD[:len(GOOD) // 2], 5, "not valid JSON"),
    (GOOD.replace('"frames": 1', '"frames": "one"'), 5, "'frames' must be a count"),
    (GOOD.replace('"frames": 1', '"frams": 1'), 5, "unknown field 'frams'"),
    (GOOD.replace(' "tests": {\n', ' "tests": {\n  "test_x.py::test_a": {},\n'), 6, "appears twice"),
    (GOOD.replace('"format": 1', '"format": 7'), 2, "format 7"),
], ids=["truncated", "not-a-count", "unknown-field", "duplicate", "newer-format"])
def test_a_bad_file_is_one_error_naming_file_and_line_and_is_never_rewritten(
    pytester: pytest.Pytester, run_inner: Run, monkeypatch: pytest.MonkeyPatch, text: str, line: int, why: str
) -> None:
    """The ini path is relative to the ini file, also run from elsewhere; no traceback, no rewrite."""
    pytester.makepyfile(test_x="def test_a():\n    pass\n")
    path = pytester.path / "exp.json"
    path.write_text(text)
    sub = pytester.mkdir("sub")
    monkeypatch.chdir(sub)
    result = run_inner("--rootdir", str(pytester.path), str(pytester.path), "--compile-cache-expect-update",
                       ini="compile_cache_expect = exp.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = result.stderr.str()
    assert f"--compile-cache-expect: {path}:{line}: " in errors and why in errors, errors
    assert "Traceback" not in errors + result.stdout.str()
    assert path.read_text() == text


def test_update_without_a_file_is_a_usage_error(pytester: pytest.Pytester, run_inner: Run) -> None:
    pytester.makepyfile(test_x="def test_a():\n    pass\n")
    result = run_inner("--compile-cache-expect-update")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--compile-cache-expect-update records into the file named by --compile-cache-expect" \
        in result.stderr.str()


def test_the_file_renders_sorted_and_reads_back(tmp_path: Path) -> None:
    """Records in any order render the same bytes, and what is read renders the bytes it was read from."""
    from pytest_compilecache.expect import fileformat

    record = {f: 0 for f in FIELDS}
    one = fileformat.Expectations({"torch": "2.13.0", "device": "cpu"}, {"b.py::t": record, "a.py::t": record})
    two = fileformat.Expectations({"device": "cpu", "torch": "2.13.0"}, {"a.py::t": record, "b.py::t": record})
    assert one.render() == two.render()
    path = tmp_path / "exp.json"
    assert fileformat.write(path, one) is True
    assert fileformat.write(path, two) is False  # the same bytes: not written again
    back = fileformat.read(path)
    assert back is not None and back.render() == path.read_bytes()
    assert fileformat.read(tmp_path / "missing.json") is None
