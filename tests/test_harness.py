"""The suite's own machinery (``tests/zygote.py``): inner runs and their xdist workers are forked
from a process that has imported torch's compiler, and a worker whose ``--tx`` sets a variable torch
reads at import is started fresh."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from zygote import Zygotes

SEES = '''
import os, sys

def test_where_i_run():
    with open(f"seen-{os.environ['PYTEST_XDIST_WORKER']}", "w") as f:
        f.write(f"compiler imported: {'torch._inductor.compile_fx' in sys.modules}, "
                f"tag: {os.environ.get('TORCH_COMPILE_CACHE_KEY_TAG')}")
'''


def seen(pytester: pytest.Pytester) -> dict[str, str]:
    """What each inner worker wrote, by its name (gw0, gw1)."""
    return {path.name[len("seen-"):]: path.read_text() for path in pytester.path.glob("seen-*")}


@pytest.fixture
def forking(zygote: Zygotes | None) -> None:
    """Skips where inner runs are not forked at all."""
    if zygote is None:
        pytest.skip("inner runs start fresh processes here (COMPILECACHE_TEST_FORK=0 or an NVIDIA GPU)")


@pytest.mark.usefixtures("forking")
def test_inner_xdist_workers_are_forked_with_the_compiler_imported(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    pytester.makepyfile(test_sees=SEES)
    run_inner("-n", "2", "--dist", "each", "-p", "no:compilecache").assert_outcomes(passed=2)
    assert seen(pytester) == {"gw0": "compiler imported: True, tag: None", "gw1": "compiler imported: True, tag: None"}


@pytest.mark.usefixtures("forking")
def test_a_worker_whose_tx_sets_an_import_time_variable_starts_fresh(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]
) -> None:
    pytester.makepyfile(test_sees=SEES)
    run_inner("--dist", "each", "--tx", "popen//env:TORCH_COMPILE_CACHE_KEY_TAG=a", "--tx", "popen",
              "-p", "no:compilecache").assert_outcomes(passed=2)
    assert seen(pytester) == {"gw0": "compiler imported: False, tag: a", "gw1": "compiler imported: True, tag: None"}


@pytest.mark.usefixtures("forking")
@pytest.mark.parametrize("mode", [[], ["-n", "2"]], ids=["serial", "n2"])
def test_a_forked_run_writing_where_torch_pointed_at_import_fails_a_default_folder_test(
    pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult], default_dir_of: Path, mode: list[str]
) -> None:
    """A forked run sees the paths torch worked out at import under the zygote's temporary folder,
    not the run's: a test that checks the default folder stays absent fails on a write there too."""
    pytester.makepyfile(test_leaks='''
        import os
        import pytest
        import torch._inductor.codecache as codecache

        def test_writes_beside_the_precompiled_headers():
            if not hasattr(codecache, "_HEADER_DIR"):
                pytest.skip("NO HEADER DIR: this torch works out no precompiled headers' folder at import")
            folder = os.path.dirname(codecache._HEADER_DIR)  # under the default folder torch saw at import
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "leaked"), "w") as f:
                f.write("x")
        ''')
    try:
        result = run_inner(*mode, "-p", "no:compilecache", "-rs")
    except AssertionError as exc:
        assert "the run made the default folder torch worked out at import" in str(exc)
    else:
        if "NO HEADER DIR" in result.stdout.str():
            pytest.skip("this torch (2.7) works out no precompiled headers' folder at import: no such path to write to")
        pytest.fail("the run wrote into the default folder torch worked out at import, and passed")
    assert not default_dir_of.exists()
