"""How options are typed: flags before paths, and one vocabulary of isolation modes everywhere."""

from __future__ import annotations

import argparse

import pytest

pytestmark = pytest.mark.floors

PLAIN_TEST = "def test_plain():\n    pass\n"


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A folder ``suite/`` with one test that never imports torch, and a private plugin home."""
    pytester.mkpydir("suite")
    (pytester.path / "suite" / "test_plain.py").write_text(PLAIN_TEST)
    pytester.makeini(f"[pytest]\ncompile_cache_home = {pytester.path / 'home'}\n")
    return pytester


@pytest.mark.parametrize("flag", ["--compile-cache-isolate", "--compile-cache-update", "--compile-cache-rebuild",
                                  "--compile-cache-explain", "--compile-cache-strict"])
def test_a_bare_flag_before_a_path_leaves_the_path_alone(suite: pytest.Pytester, flag: str) -> None:
    result = suite.runpytest_subprocess(flag, "suite/", "--co", "-q", "--compile-cache-bundle=b.bundle")
    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines(["suite/test_plain.py::test_plain"])


def test_bare_isolate_flag_means_a_cache_per_test(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("--compile-cache-isolate", "suite/")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["compilecache: isolation: a cache per test"])


@pytest.mark.parametrize(("mode", "shown"), [("off", "off"), ("test", "a cache per test"),
                                             ("worker", "a kept cache per worker")])
def test_every_mode_is_accepted_on_the_command_line_and_in_the_ini(
    suite: pytest.Pytester, mode: str, shown: str
) -> None:
    on_line = suite.runpytest_subprocess(f"--compile-cache-isolate-mode={mode}", "suite/")
    on_line.assert_outcomes(passed=1)
    in_ini = suite.runpytest_subprocess("-o", f"compile_cache_isolate={mode}", "suite/")
    in_ini.assert_outcomes(passed=1)
    if mode != "off":
        on_line.stdout.fnmatch_lines([f"compilecache: isolation: {shown}"])
        in_ini.stdout.fnmatch_lines([f"compilecache: isolation: {shown}"])


def test_the_ini_takes_the_mode_options_own_name_too(suite: pytest.Pytester) -> None:
    """Every option's ini name is its own with underscores: ``compile_cache_isolate_mode`` (a newcomer's
    first try) sets isolation as ``compile_cache_isolate`` does, never an unknown-option warning."""
    by_mode = suite.runpytest_subprocess("-o", "compile_cache_isolate_mode=worker", "suite/")
    by_mode.assert_outcomes(passed=1)
    by_mode.stdout.fnmatch_lines(["compilecache: isolation: a kept cache per worker"])
    assert "Unknown config option" not in by_mode.stdout.str() + by_mode.stderr.str()
    both = suite.runpytest_subprocess("-o", "compile_cache_isolate_mode=worker", "-o", "compile_cache_isolate=test",
                                      "suite/")
    assert both.ret == pytest.ExitCode.USAGE_ERROR
    both.stderr.fnmatch_lines(["*compile_cache_isolate*'test'*compile_cache_isolate_mode*'worker'*"])
    overridden = suite.runpytest_subprocess("-o", "compile_cache_isolate_mode=worker", "-o", "compile_cache_isolate=test",
                                            "--compile-cache-isolate-mode=off", "suite/")
    overridden.assert_outcomes(passed=1)  # the command line wins over both
    bad = suite.runpytest_subprocess("-o", "compile_cache_isolate_mode=true", "suite/")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*compile_cache_isolate_mode: 'true' is not an isolation mode*"])


@pytest.mark.parametrize("word", ["true", "1", "yes", "false", "per-test"])
def test_words_outside_the_vocabulary_are_refused_everywhere(suite: pytest.Pytester, word: str) -> None:
    in_ini = suite.runpytest_subprocess("-o", f"compile_cache_isolate={word}", "suite/")
    assert in_ini.ret == pytest.ExitCode.USAGE_ERROR
    in_ini.stderr.fnmatch_lines([f"*compile_cache_isolate: {word!r} is not an isolation mode; use off, test or worker*"])
    on_line = suite.runpytest_subprocess(f"--compile-cache-isolate-mode={word}", "suite/")
    assert on_line.ret == pytest.ExitCode.USAGE_ERROR
    on_line.stderr.fnmatch_lines(["*invalid choice*off*test*worker*"])


def test_help_names_the_same_modes_as_the_parser(suite: pytest.Pytester) -> None:
    text = suite.runpytest_subprocess("--help").stdout.str()
    assert "--compile-cache-isolate-mode=MODE" in text
    assert "off, test or worker" in text
    assert "true" not in text.split("--compile-cache-isolate", 1)[1].split("--compile-cache-bundle", 1)[0]
    # On/off settings say so in the ini section of --help (a newcomer saw only "(string)"); they stay
    # strings for pytest, so that an empty value means off and a typo gets the plugin's own error.
    ini_help = text.split("\n[pytest] ", 1)[-1]
    for name in ("compile_cache_update", "compile_cache_rebuild", "compile_cache_strict", "compile_cache_explain"):
        described = ini_help.split(f"  {name} ", 1)[1].split("\n  compile_cache_", 1)[0]
        assert "(true or false)" in " ".join(described.split()), described


def test_an_on_off_value_that_is_neither_is_refused(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("-o", "compile_cache_strict=treu", "suite/")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*compile_cache_strict: 'treu' is neither on nor off; use true or false*"])


@pytest.mark.parametrize("flag", ["--compile-cache-update", "--compile-cache-rebuild"])
def test_changing_a_bundle_without_naming_one_is_refused(suite: pytest.Pytester, flag: str) -> None:
    result = suite.runpytest_subprocess(flag, "suite/")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{flag} (or {flag[2:].replace('-', '_')} in the ini file) changes the bundle "
                                 "named by --compile-cache-bundle, and none is named*"])


@pytest.mark.parametrize(("flag", "form"), [("--compile-cache-report", "--compile-cache-report=FILE"),
                                            ("--compile-cache-bundle", "--compile-cache-bundle=PATH")])
def test_a_value_option_before_a_path_is_refused_at_startup(suite: pytest.Pytester, flag: str, form: str) -> None:
    """``--compile-cache-report suite/`` takes the folder as its value: a usage error at once, not a
    problem at the end with exit status 0."""
    result = suite.runpytest_subprocess("-q", flag, "suite/")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([f"*{flag}: {suite.path / 'suite'} is a folder, not a file*{form}*"])
    assert sorted(p.name for p in (suite.path / "suite").iterdir()) == ["__init__.py", "test_plain.py"]
    given = suite.runpytest_subprocess("-q", f"{flag}=suite")
    assert given.ret == pytest.ExitCode.USAGE_ERROR
    given.stderr.fnmatch_lines([f"*{flag}: {suite.path / 'suite'} is a folder, not a file*"])
    assert "placed before a path" not in given.stderr.str(), "the hint is for the other form, not the one used"


def test_a_mode_given_to_the_bare_isolate_flag_points_at_the_mode_option(suite: pytest.Pytester) -> None:
    """The hint rides on pytest's ``extra_info``, which pytest's option parser prints beside a usage
    error from pytest 8 on (its parser's ``error`` reads it); pytest 7 shows argparse's message alone."""
    import inspect

    from _pytest.config import argparsing

    parsers = [c for c in vars(argparsing).values() if isinstance(c, type) and issubclass(c, argparse.ArgumentParser)]
    try:
        shows_extra_info = any("extra_info" in inspect.getsource(c.error) for c in parsers if "error" in vars(c))
    except OSError:  # pytest installed without its sources: assume the newer parser
        shows_extra_info = True
    result = suite.runpytest_subprocess("--compile-cache-isolate=worker", "suite/")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*argument --compile-cache-isolate: ignored explicit argument 'worker'*"])
    if shows_extra_info:
        result.stderr.fnmatch_lines(["*--compile-cache-isolate*--compile-cache-isolate-mode=worker*"])


@pytest.mark.parametrize("given", [["--compile-cache-bundle="], ["--compile-cache-bundle", ""],
                                   ["--compile-cache-bundle=  "]], ids=["equals", "separate", "blank"])
def test_an_empty_bundle_path_is_said_once_and_refused_under_strict(suite: pytest.Pytester, given: list[str]) -> None:
    """``--compile-cache-bundle=$UNSET_VAR`` in CI gives an empty value: not silently a run without a bundle."""
    plain = suite.runpytest_subprocess(*given, "suite/")
    plain.assert_outcomes(passed=1)
    out = plain.stdout.str()
    warning = ("WARNING: --compile-cache-bundle was given an empty value (an unset variable?): this run has no "
               "bundle")
    assert out.count(warning) == 1, out
    strict = suite.runpytest_subprocess(*given, "--compile-cache-strict", "suite/")
    assert strict.ret == pytest.ExitCode.USAGE_ERROR, strict.stdout.str()
    strict.stderr.fnmatch_lines(["*--compile-cache-bundle was given an empty value (an unset variable?)*"
                                 "--compile-cache-strict*"])


@pytest.mark.parametrize("spec", ["ssh=nobody@127.0.0.1//python=python3", "socket=127.0.0.1:8888"])
def test_workers_on_another_host_with_a_bundle_are_refused_in_one_line(suite: pytest.Pytester, spec: str) -> None:
    """Workers elsewhere cannot see this machine's folders, which a bundle's warmup and pool share: refused before
    any worker starts, in one line naming the spec; without a bundle nothing is refused (the plain test runs)."""
    result = suite.runpytest_subprocess("--tx", spec, "--dist", "load", "--compile-cache-bundle=b.bundle", "suite/")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    refused = [line for line in result.stderr.lines if "needs every worker on this machine" in line]
    assert refused == [f"ERROR: --tx {spec}: --compile-cache-bundle needs every worker on this machine (they share "
                       "its folders: the warmup's lock, the pool of binaries); run them here (-n N), or without a "
                       "bundle"], result.stderr.str()
    assert not (suite.path / "b.bundle").exists()
    local = suite.runpytest_subprocess("--tx", "popen", "--dist", "load", "--compile-cache-bundle=b.bundle", "suite/")
    local.assert_outcomes(passed=1)


@pytest.mark.parametrize("given", [["--compile-cache-expect=e.json"], ["--compile-cache-expect=e.json",
                                   "--compile-cache-expect-update"], ["-o", "compile_cache_expect_update=true"]],
                         ids=["expect", "update", "ini"])
def test_the_removed_expectations_options_still_run_the_suite_and_say_so_once(suite: pytest.Pytester,
                                                                               given: list[str]) -> None:
    """A suite that passes the options of the removed compile expectations still passes, with one warning."""
    result = suite.runpytest_subprocess(*given, "suite/")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert out.count("WARNING: --compile-cache-expect: compile expectations were removed and the option is "
                     "ignored") == 1, out
    assert not (suite.path / "e.json").exists()
