"""What the xdist controller and a worker tell each other, in process: each message reads back as it was put, and
a worker that said nothing, or said it damaged, costs what it must and no more."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache.bundle.keyindex import KeyIndex
from pytest_compilecache.channel import BundleAtStart, FromWorker, ToWorker
from pytest_compilecache.report.model import Concern, Problem, ProcessReport, Status


def _index() -> KeyIndex:
    index = KeyIndex(torch="2.9.0")
    index.add("fkey1", "fx_graph", "f (t.py)", {"gm": ("g1", "graph"), "inductor_config[x]": ("c1", "1")})
    index.note_run(1_700_000_000.0, ["inductor/fkey1"])
    return index


@pytest.mark.parametrize("told", [
    ToWorker("/shared", BundleAtStart(), 1_700_000_000.5),
    ToWorker("/shared", BundleAtStart(True, "b.bundle: damaged", repaired=True), 1.0, "s3 gave no answer"),
], ids=["plain", "damaged-and-unreachable"])
def test_what_the_controller_tells_a_worker_reads_back_equal(told: ToWorker) -> None:
    """The shared folder, the bundle at start, the run's stamp and the store's silence arrive as sent."""
    workerinput: dict[str, Any] = {"workerid": "gw0"}
    told.put(workerinput)
    assert ToWorker.get(workerinput) == told and workerinput["workerid"] == "gw0"


def test_a_worker_told_nothing_takes_defaults_and_stamps_the_run_now() -> None:
    """Without the controller's word: no shared folder, a bundle not seen, the stamp of this moment."""
    before = time.time()
    told = ToWorker.get({})
    assert (told.shared, told.at_start, told.store_unreachable) == ("", BundleAtStart(), "")
    assert before <= told.run <= time.time()


def test_a_workers_report_without_artifacts_reads_back_equal(tmp_path: Path) -> None:
    """A worker that recorded no artifacts sends its report alone; problems keep their concern."""
    process = ProcessReport(process="gw1", status=Status.LOADED, reason="b.bundle: here",
                            problems=[Problem(Concern.BINARY, "x.so not used", "b.bundle")])
    output: dict[str, Any] = {}
    FromWorker(process).put(output, tmp_path)
    got = FromWorker.get(output)
    assert got == FromWorker(process, None)


def test_a_workers_artifacts_and_key_index_arrive_whole(tmp_path: Path) -> None:
    """The artifacts' bytes and every key's components and usage arrive."""
    sent = _index()
    output: dict[str, Any] = {}
    FromWorker(ProcessReport(process="gw2"), (b"\x00mega-cache bytes", sent)).put(output, tmp_path)
    got = FromWorker.get(output)
    assert got is not None and got.own is not None
    artifacts, index = got.own
    assert artifacts == b"\x00mega-cache bytes"
    assert list(index.keys) == ["fkey1"] and index.components("fkey1") == sent.components("fkey1")
    assert (index.torch, index.runs, index.used) == (sent.torch, sent.runs, sent.used)


@pytest.mark.parametrize("damage", [lambda blob: blob[: len(blob) // 2], lambda blob: b"\x78\x9c" + b"\x00" * 8,
                                    lambda blob: b""], ids=["cut-short", "not-zlib", "empty"])
def test_a_key_index_damaged_on_the_way_costs_only_the_key_details(tmp_path: Path, damage: Any) -> None:
    """The artifacts still arrive, with an empty index, and the report with them."""
    output: dict[str, Any] = {}
    FromWorker(ProcessReport(process="gw0", status=Status.LOADED), (b"artifacts", _index())).put(output, tmp_path)
    output["compilecache"]["index"] = damage(output["compilecache"]["index"])
    got = FromWorker.get(output)
    assert got is not None and got.process.status is Status.LOADED and got.own is not None
    assert got.own[0] == b"artifacts" and not got.own[1]
