"""The register of patches: every replacement declared in one table, what took reported, all of it undone."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_compilecache"

#: The inner scripts' start: torch's patched modules imported, and where each entry's attribute lives.
OWNERS = '''
import gc, importlib, sys
import pytest
import torch._dynamo, torch._inductor.codecache, torch._functorch._aot_autograd.autograd_cache
from pytest_compilecache._torchapi import patches

gc.freeze()  # as the zygote does: each session's closing gc.collect (pytest's unraisable check) skips torch's heap

def owner_of(patch):
    """``(object holding the attribute, its name)``, or None where this torch has no such object."""
    try:
        owner = importlib.import_module(patch.module)
        *path, name = patch.attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
    except Exception:
        return None
    return owner, name
'''

SESSIONS = OWNERS + '''
def current():
    """Every patched attribute's own value (or None where it is inherited), and the import hooks."""
    out = {}
    for patch in patches.PATCHES:
        found = owner_of(patch)
        if found is None:
            continue
        owner, name = found
        out[patch.name] = vars(owner).get(name) if hasattr(owner, "__dict__") else None
    out["meta_path"] = [f for f in sys.meta_path  # the plugin's (torch 2.7 imports setuptools, which adds its own)
                        if "pytest_compilecache" in type(f).__module__ + str(getattr(f, "__module__", ""))]
    return out

def sessions(label):
    """Two sessions, the first with -v, each said in lines starting with ``label``."""
    before = current()
    for run, verbose in ((1, ["-v"]), (2, [])):
        print(f"=== {label} SESSION {run}", flush=True)
        code = pytest.main(["-p", "no:cacheprovider", *verbose, "test_inner.py"])
        after = current()
        changed = sorted(name for name in before if after[name] is not before[name] and after[name] != before[name])
        print(f"{label} SESSION {run} EXIT {int(code)} CHANGED {changed}", flush=True)

import torch._dynamo.pgo as pgo
lookup = vars(pgo).pop("get_local_code_state", None)  # as on torch 2.7, which has none to take away
sessions("LACKING")  # first: the plugin asks once a process which layers it can observe
if lookup is not None:
    pgo.get_local_code_state = lookup
sessions("WHOLE")
'''

INNER = '''
import torch

def f(x):
    return torch.cos(x) + 1

def test_counts(cold_cache):
    torch.compile(f)(torch.randn(4))
    cold_cache.assert_misses(fx_graph=1, aot_autograd=1)
'''


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """One process running two sessions where this torch lacks a patched attribute (PGO's local lookup),
    then, the attribute put back, two with the register whole: the whole register's sessions' output, the
    lacking one's, and stderr."""
    folder = tmp_path_factory.mktemp("sessions")
    (folder / "test_inner.py").write_text(INNER)
    script = folder / "sessions.py"
    script.write_text(SESSIONS)
    # As pytester runs them: a home of their own and no PYTEST_ADDOPTS (the suite's says everything without -v).
    env = {**os.environ, "HOME": str(folder), "PY_COLORS": "0"}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run([sys.executable, str(script)], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)
    lacking, _, whole = done.stdout.partition("=== WHOLE SESSION 1")
    return whole, lacking, done.stderr


@pytest.mark.compat
@pytest.mark.core
def test_two_sessions_in_one_process_each_start_from_torch_as_it_was(sessions: tuple[str, str, str]) -> None:
    """Each session installs the register's patches when a fixture first needs them and takes them all back
    at its end: torch's attributes and ``sys.meta_path`` are as before, and the next session counts again."""
    out, _, err = sessions
    assert "WHOLE SESSION 1 EXIT 0 CHANGED []" in out, out + err
    assert "WHOLE SESSION 2 EXIT 0 CHANGED []" in out, out + err
    assert out.count("torch patches (torch ") == 1, out  # with -v only


@pytest.mark.compat
@pytest.mark.core
def test_a_patch_this_torch_cannot_take_turns_its_feature_off_once_and_raises_nothing(
    sessions: tuple[str, str, str],
) -> None:
    """As on a torch whose PGO module lacks the local lookup (2.7): the session passes, the layer is
    reported unobservable naming the torch version, and the summary names the feature and the patch."""
    _, out, err = sessions
    assert "LACKING SESSION 1 EXIT 0" in out and "LACKING SESSION 2 EXIT 0" in out, out + err
    version = out.split("torch patches (torch ")[1].split(")")[0]
    assert f"not observable: torch {version}'s PGO module has no local code-state lookup to count" in out, out
    off = [line for line in out.splitlines() if line.startswith(f"off on torch {version}: pgo layer counts (")]
    assert len(off) == 2, out  # once a session, -v or not
    assert "torch._dynamo.pgo.get_local_code_state: this torch has no get_local_code_state" in off[0]


#: ``setattr`` calls anywhere in the package that replace nothing: pytest's reports carrying a test's counts
#: home (testside.py), the backport of
#: ``with_fresh_cache`` (a patch in the register) swapping torch's collections while active, as torch's
#: own does, and the headers' folder set around a header build by the register's wrapper of ``_precompile_header``.
ALLOWED_SETATTR = {("_torchapi/megacache.py", "cls"),
                   ("_torchapi/defaultdir.py", "codecache"), ("session/testside.py", "report")}


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == name]


def test_every_replacement_is_declared_in_the_register() -> None:
    """Only the register replaces attributes; nothing adds an import hook (``sys.meta_path``) or marks
    wrappers ad hoc (see ``ALLOWED_SETATTR`` for the exceptions)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        tree = ast.parse(text)
        if "meta_path" in text:
            offenders.append(f"{relative}: sys.meta_path")
        if relative != "_torchapi/patches.py":
            for call in _calls(tree, "setattr"):
                target = ast.unparse(call.args[0])
                if (relative, target) not in ALLOWED_SETATTR:
                    offenders.append(f"{relative}:{call.lineno}: setattr({target}, ...)")
        if "_compilecache = True" in text:
            offenders.append(f"{relative}: an ad hoc wrapper marker")
    assert offenders == []


def test_nothing_of_the_standard_library_is_replaced() -> None:
    """The register patches torch (and Triton, which torch compiles with) alone: no standard-library attribute is
    replaced at run time."""
    from pytest_compilecache._torchapi import patches

    assert [p.name for p in patches.PATCHES if p.module.split(".")[0] not in ("torch", "triton")] == []


def test_every_wrapper_the_table_names_exists() -> None:
    from pytest_compilecache._torchapi import patches

    for patch in patches.PATCHES:
        assert callable(patches._function(patch.wrapper)), patch


def test_the_documentation_lists_every_patch() -> None:
    from pytest_compilecache._torchapi import patches

    text = (PACKAGE.parent / "docs" / "compatibility.md").read_text()
    missing = [p.name for p in patches.PATCHES if f"`{p.attribute}` (`{p.module}`)" not in text]
    assert missing == [], "docs/compatibility.md's register of patches lacks these"


NESTED = '''
import importlib
import torch
import torch._inductor.codecache as codecache
from pytest_compilecache._torchapi import patches


def default_dir():
    for name in ("torch._inductor.runtime.cache_dir_utils", "torch._inductor.runtime.runtime_utils"):
        module = importlib.import_module(name)
        if hasattr(module, "default_cache_dir"):
            return module.default_cache_dir()


def state():
    from pytest_compilecache._torchapi import defaultdir

    return (getattr(codecache, "_HEADER_DIR", None), default_dir(), defaultdir._process_dir, defaultdir._headers_dir,
            tuple(patches.status()["took"]))


OUTSIDE = []


def test_a_plain_test_compiles_in_the_sessions_folder():
    OUTSIDE.append(default_dir())


def test_outer(cold_cache, pytester):
    torch.compile(lambda x: x.sin() + 1)(torch.randn(4))
    before = state()
    pytester.makepyfile(test_in="import torch\\n"
                                "def test_in(cold_cache):\\n"
                                "    torch.compile(lambda x: x.cos() + 2)(torch.randn(4))\\n"
                                "    cold_cache.assert_misses(fx_graph=1)\\n")
    pytester.runpytest_inprocess("-p", "no:cacheprovider", "--compile-cache-isolate").assert_outcomes(passed=1)
    assert state() == before
    cold_cache.reset_in_memory()
    torch.compile(lambda x: x.sin() + 1)(torch.randn(4))
    cold_cache.assert_hits(fx_graph=1)


def test_a_plain_test_after_it_compiles_in_the_same_folder():
    import os
    assert default_dir() == OUTSIDE[0] and os.path.isdir(OUTSIDE[0])
'''


def test_a_session_inside_another_leaves_the_outer_ones_patches_and_folders(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult],
) -> None:
    """A ``pytester`` session run in-process inside a test of an outer session takes back only what it
    installed: the outer session's patches, default folder and headers' folder are as they were, and
    the outer test goes on counting."""
    pytester.makepyfile(test_outer=NESTED)
    result = run_inner("-p", "pytester", "-p", "no:cacheprovider", "--compile-cache-isolate")
    result.assert_outcomes(passed=3)


#: The processes the drift test's runs (an entry and a mode each) are dealt into.
DRIFT_PARTS = 2
DRIFT_MODES = ("missing", "replaced", "reshaped")

DRIFT = OWNERS + '''
import contextlib, io

def run(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = pytest.main(["-p", "no:cacheprovider", "-q", *args, "test_inner.py"])
    return int(code), out.getvalue()

def off(text):
    return [line for line in text.splitlines() if line.startswith("off on torch ")]

import torch._inductor.utils as inductor_utils
fresh_cache = getattr(inductor_utils, "fresh_cache", None) or inductor_utils.fresh_inductor_cache

_, text = run("--compile-cache-isolate")
gc.freeze()  # and what the first compile imported
print("BASELINE OFF", len(off(text)))
part, parts = map(int, sys.argv[1:3])
dealt = 0
for patch in patches.PATCHES:
    if not patch.module.startswith("torch"):
        continue
    found = owner_of(patch)
    if found is None:
        continue
    owner, name = found
    if patch.backport or name not in vars(owner):
        continue  # nothing of torch's own to take away here
    print("ENTRY", patch.name)
    kept = vars(owner)[name]
    for mode in ("missing", "replaced", "reshaped"):  # DRIFT_MODES
        dealt += 1  # an entry's modes go to different parts: where torch fails, an entry costs twice as much
        if dealt % parts != part:
            continue
        if mode == "missing":
            delattr(owner, name)
        elif mode == "replaced":
            setattr(owner, name, lambda *args, **kwargs: None)  # an unexpected signature and result
        else:  # torch's own work, its result in another shape
            function = kept.__func__ if isinstance(kept, (staticmethod, classmethod)) else kept
            reshaped = lambda *args, function=function, **kwargs: ("another", "shape", function(*args, **kwargs))
            setattr(owner, name, type(kept)(reshaped) if isinstance(kept, (staticmethod, classmethod)) else reshaped)
        code, text = run("--compile-cache-isolate")
        if code == 0:
            base = code
        else:  # fails without the plugin too? (with torch's caches as cold as the plugin's: nothing compiled is reused)
            with fresh_cache():
                base = run("-p", "no:compilecache")[0]
        setattr(owner, name, kept)
        print(f"DRIFT {patch.name} {mode} EXIT {code} WITHOUT {base} INTERNAL {'INTERNALERROR' in text} "
              f"OFF {len(off(text))}")
'''

DRIFT_INNER = '''
import torch

def test_compiles():
    torch._dynamo.reset()
    assert torch.compile(lambda x: x * 2 + 1)(torch.ones(3)).tolist() == [3.0, 3.0, 3.0]
'''


@pytest.mark.slow
@pytest.mark.compat
@pytest.mark.core
@pytest.mark.parametrize("part", range(DRIFT_PARTS))
def test_every_patch_whose_attribute_drifts_costs_at_most_its_feature(pytester: pytest.Pytester, part: int) -> None:
    """The drift test: for each entry of the register, a session where torch's attribute is missing,
    replaced by one of another signature, or returns its result in another shape, before the plugin looks
    ends with the results the tests have without the plugin, no INTERNALERROR, and at most one more line
    naming a feature lost. The runs (entry by mode) are dealt into DRIFT_PARTS processes, which xdist runs
    side by side; every part lists every entry and checks that it ran its share of the runs."""
    pytester.makepyfile(test_inner=DRIFT_INNER)
    script = pytester.path / "drift.py"
    script.write_text(DRIFT)
    done = subprocess.run([sys.executable, str(script), str(part), str(DRIFT_PARTS)], cwd=pytester.path,
                          capture_output=True, text=True, timeout=900)
    lines = done.stdout.splitlines()
    baseline = int(next(line.split()[-1] for line in lines if line.startswith("BASELINE OFF")))
    drifted = [line.split() for line in lines if line.startswith("DRIFT ")]
    entries = [line.split()[1] for line in lines if line.startswith("ENTRY ")]
    runs = [(name, mode) for name in entries for mode in DRIFT_MODES]
    share = [run for number, run in enumerate(runs, 1) if number % DRIFT_PARTS == part]
    assert len(entries) >= 15 and [(d[1], d[2]) for d in drifted] == share, \
        done.stdout[-3000:] + done.stderr[-3000:]
    for _, name, mode, _, code, _, without, _, internal, _, lost in drifted:
        assert internal == "False", f"{name} {mode}: INTERNALERROR\n{done.stdout[-3000:]}"
        assert code == without, f"{name} {mode}: exit {code} with the plugin, {without} without"
        assert int(lost) <= baseline + 1, f"{name} {mode}: {lost} features said lost (baseline {baseline})"


# --- the guard every replacement runs in (no torch) ------------------------------------------------------------

def _guard(wrap: Any, original: Any = None) -> tuple[Any, list[str]]:
    """A replacement made by ``wrap`` of a fake torch function, in the register's guard, and torch's calls."""
    from pytest_compilecache._torchapi import patches

    calls: list[str] = []

    def torch_function(x: int) -> int:
        calls.append(f"torch {x}")
        if x < 0:
            raise ValueError("torch's own error")
        return x * 10

    function = original or torch_function
    patches._faults.pop("fake.f", None)
    return patches._guarded("fake.f", function, wrap(patches._Observed(function))), calls


def test_a_wrapper_that_fails_after_torch_returned_gives_torchs_result_and_stops() -> None:
    from pytest_compilecache._torchapi import patches

    def wrap(original: Any) -> Any:
        def replacement(x: int) -> Any:
            key, lines = original(x)  # torch's result in another shape than the wrapper expects
            return key

        return replacement

    guarded, calls = _guard(wrap)
    assert guarded(2) == 20 and calls == ["torch 2"], "torch's result, torch called once"
    assert patches._faults["fake.f"].startswith("TypeError: cannot unpack")
    assert guarded(3) == 30 and calls == ["torch 2", "torch 3"], "torch's own alone from then on"
    patches._faults.pop("fake.f")


def test_a_wrapper_that_fails_before_calling_torch_calls_it_and_torchs_errors_pass_untouched() -> None:
    from pytest_compilecache._torchapi import patches

    def early(original: Any) -> Any:
        def replacement(x: int) -> Any:
            if x == 1:
                raise KeyError("the wrapper's own")
            return original(x)

        return replacement

    guarded, calls = _guard(early)
    with pytest.raises(ValueError, match="torch's own error"):
        guarded(-1)
    assert "fake.f" not in patches._faults, "torch's error is not the wrapper's fault"
    assert guarded(1) == 10 and calls == ["torch -1", "torch 1"]
    assert patches._faults["fake.f"] == "KeyError: \"the wrapper's own\""

    def hiding(original: Any) -> Any:
        def replacement(x: int) -> Any:
            try:
                return original(x)
            except ValueError:
                raise RuntimeError("the wrapper lost torch's error") from None

        return replacement

    guarded, calls = _guard(hiding)
    with pytest.raises(ValueError, match="torch's own error"):
        guarded(-1)
    assert patches._faults["fake.f"].startswith("RuntimeError")
    patches._faults.pop("fake.f")


def test_a_call_the_wrapper_makes_after_torch_answered_is_the_wrappers_own() -> None:
    """As the AOTAutograd key's wrapper asking torch again for the key's details: where that second call raises,
    torch's first answer is returned and the fault is the wrapper's."""
    from pytest_compilecache._torchapi import patches

    def again(original: Any) -> Any:
        def replacement(x: int) -> Any:
            result = original(x)
            original(-1)
            return result

        return replacement

    guarded, calls = _guard(again)
    assert guarded(4) == 40 and calls == ["torch 4", "torch -1"]
    assert patches._faults.pop("fake.f") == "ValueError: torch's own error"


def test_the_register_says_a_torch_newer_than_it_was_checked_on() -> None:
    from pytest_compilecache._torchapi import patches

    assert patches._release("2.16.0.dev20261201+cu130") > patches._release(patches.NEWEST_SEEN)
    assert not patches._release("2.15.0+cpu") > patches._release(patches.NEWEST_SEEN)
    assert f"(`NEWEST_SEEN`, {patches.NEWEST_SEEN})" in (PACKAGE.parent / "docs" / "compatibility.md").read_text()


FAULTY = '''
import torch
from pytest_compilecache._torchapi import keys

def broken(*args, **kwargs):
    raise RuntimeError("a fault of the plugin's own")

keys._seen = broken  # the work the FX key's wrapper does on a miss

def test_compiles(cold_cache):
    assert torch.compile(lambda x: x * 3 + 1)(torch.ones(2)).tolist() == [4.0, 4.0]
'''


@pytest.mark.compat
@pytest.mark.core
def test_a_wrappers_own_failure_never_breaks_a_compile_and_is_said_once(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult],
) -> None:
    pytester.makepyfile(test_faulty=FAULTY)
    result = run_inner("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    said = [line for line in out.splitlines() if "compiled_fx_graph_hash failed (RuntimeError: a fault of the "
            "plugin's own); torch's own runs alone since" in line]
    assert len(said) == 1 and said[0].startswith("off on torch "), out
