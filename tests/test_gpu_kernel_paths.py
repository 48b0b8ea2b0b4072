"""An FX graph whose C++ wrapper loads GPU kernels by their path in the cache folder it was compiled in
(``cpp_wrapper`` on a GPU, torch 2.11 and earlier: torch reuses that source on a hit, so in any other folder
the kernel's file is missing and the call fails) is left out of what a process saves, and said. torch's own artifact
classes and serializer stand in for what a GPU records (CPU is enough: nothing is compiled);
``tests/test_gpu.py`` runs the real thing on a GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_compilecache import _torchapi  # noqa: E402

#: torch 2.11's C++ wrapper: the kernel's binary by its absolute path in the cache folder.
BY_PATH = ("f" + "a" * 51, b'cpp_wrapper_src = (r"""\n    kernels.triton_poi_0 = loadKernel('
                           b'"/tmp/pytest-of-root/s/compilecache/session-cache/35/c35j7t.cubin", "triton_poi_0", 0);\n')
#: torch 2.13 and 2.15 (read from their sources): the path looked up when the kernel is compiled, in the folder
#: of the process that runs it.
AT_RUN_TIME = ("f" + "b" * 51,
               b'kernels.triton_poi_0 = loadKernel(triton_poi_0_result.cubin_path, "triton_poi_0", 0);')
#: A Python wrapper names its kernels' sources in comments only: harmless anywhere.
COMMENTED = ("f" + "c" * 51, b"# kernel path: /tmp/pytest-of-root/s/compilecache/session-cache/ab/cab.py\n")
AOT = ("a" + "d" * 51, b"an AOTAutograd entry of " + AT_RUN_TIME[0].encode())
#: The AOTAutograd entry of the graph left out: it names that graph's key, and could only miss.
AOT_OF_BY_PATH = ("a" + "e" * 51, b"an AOTAutograd entry of " + BY_PATH[0].encode())


def test_a_graph_loading_its_kernels_by_path_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = _torchapi.artifacts_bytes([("inductor", *BY_PATH), ("inductor", *AT_RUN_TIME),
                                          ("inductor", *COMMENTED), ("aot_autograd", *AOT),
                                          ("aot_autograd", *AOT_OF_BY_PATH)])
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (recorded, None))
    saved = _torchapi.save_artifacts()
    assert saved.data is not None
    assert [(kind, key) for kind, key, _ in _torchapi.artifact_contents(saved.data)] == [
        ("inductor", AT_RUN_TIME[0]), ("inductor", COMMENTED[0]), ("aot_autograd", AOT[0])]
    (why,) = saved.not_saved
    assert why.startswith("1 fx_graph and 1 aot_autograd compiled with cpp_wrapper: ") and "any other folder" in why

    only = _torchapi.artifacts_bytes([("inductor", *BY_PATH)])
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (only, None))
    alone = _torchapi.save_artifacts()
    assert alone.data is None and len(alone.not_saved) == 1, "nothing else recorded: nothing to save"

    portable = _torchapi.artifacts_bytes([("inductor", *AT_RUN_TIME), ("aot_autograd", *AOT)])
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (portable, None))
    kept = _torchapi.save_artifacts()
    assert kept.data == portable and kept.not_saved == (), "bytes with no graph to leave out pass untouched"

    bundled = ("a" + "f" * 51, b"an AOTAutograd entry holding its graph: " + BY_PATH[1])  # bundled_autograd_cache
    holding = _torchapi.artifacts_bytes([("aot_autograd", *AOT), ("aot_autograd", *bundled)])
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (holding, None))
    held = _torchapi.save_artifacts()
    assert held.data is not None
    assert [key for _, key, _ in _torchapi.artifact_contents(held.data)] == [AOT[0]]
    assert held.not_saved[0].startswith("1 aot_autograd compiled with cpp_wrapper: ")


def test_what_was_not_saved_is_said_once_and_is_no_problem() -> None:
    """Each process says what it did not save; the summary says each sentence once, and it is not a problem (so
    --compile-cache-strict lets it pass); the report carries it per process."""
    from pytest_compilecache.report.model import ProcessReport, SessionReport, Status
    from pytest_compilecache.report.terminal import summary_lines

    why = "1 fx_graph and 1 aot_autograd compiled with cpp_wrapper: ..."
    report = SessionReport(bundle_path="b.bundle")
    report.processes = [ProcessReport(process=f"gw{i}", status=Status.LOADED, reason="b.bundle: here",
                                      not_saved=[why]) for i in range(2)]
    lines = summary_lines(report)
    assert lines.count(f"  not saved: {why}") == 1, lines
    assert not report.all_problems() and not any(line.startswith("PROBLEM") for line in lines)
    assert ProcessReport.from_json(report.processes[0].to_json()).not_saved == [why]
