"""A worker's artifacts over execnet's message limit go home through the session's shared folder, and a file the
controller cannot read is one problem naming it, not a silent loss."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_compilecache import channel
from pytest_compilecache.bundle.keyindex import KeyIndex
from pytest_compilecache.channel import FromWorker
from pytest_compilecache.report.model import Concern, ProcessReport

ARTIFACTS = b"compiled artifacts " * 64


def _index() -> KeyIndex:
    index = KeyIndex()
    index.note_run(1700000000.0, ["fx_graph:abc"])
    return index


@pytest.mark.parametrize("limit", [1 << 30, 0], ids=["inline", "as-a-file"])
def test_artifacts_and_key_index_arrive_as_they_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      limit: int) -> None:
    monkeypatch.setattr(channel, "INLINE_LIMIT", limit)
    output: dict[str, object] = {}
    FromWorker(ProcessReport(process="gw1"), (ARTIFACTS, _index())).put(output, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ([] if limit else ["artifacts-gw1"])
    told = FromWorker.get(output)
    assert told is not None and told.own is not None
    assert told.own[0] == ARTIFACTS and told.own[1].runs == [1700000000.0]
    assert told.process.process == "gw1" and told.process.problems == []
    assert list(tmp_path.iterdir()) == [], "the controller removes the file it read"


def test_a_file_the_controller_cannot_see_is_one_problem_naming_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel, "INLINE_LIMIT", 0)
    output: dict[str, object] = {}
    FromWorker(ProcessReport(process="gw0"), (ARTIFACTS, _index())).put(output, tmp_path)
    (tmp_path / "artifacts-gw0").unlink()  # as on another host's disk
    told = FromWorker.get(output)
    assert told is not None and told.own is None
    (problem,) = told.process.problems
    assert problem.concern is Concern.SAVING and problem.where == str(tmp_path / "artifacts-gw0")
    assert problem.text.startswith(f"{tmp_path / 'artifacts-gw0'}: gw0's artifacts, too large to send inline, "
                                   "cannot be read here: No such file or directory; not saved"), problem.text


def test_a_shared_folder_the_worker_cannot_write_is_one_problem_and_nothing_half_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel, "INLINE_LIMIT", 0)
    output: dict[str, object] = {}
    missing = tmp_path / "gone"
    FromWorker(ProcessReport(process="gw3"), (ARTIFACTS, _index())).put(output, missing)
    told = FromWorker.get(output)
    assert told is not None and told.own is None
    (problem,) = told.process.problems
    assert problem.concern is Concern.SAVING and f"gw3's {len(ARTIFACTS):,d} bytes of artifacts could not be " \
        "written for the controller" in problem.text and problem.text.startswith(str(missing / "artifacts-gw3"))


def test_a_worker_that_said_nothing_is_none() -> None:
    assert FromWorker.get({}) is None


def test_a_file_read_but_not_removed_is_saved_and_no_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The artifacts were read: a file the controller cannot remove costs nothing but a count (the shared folder
    goes at the session's end), never a 'not saved' problem that strict mode would fail on."""
    from pytest_compilecache import caught

    monkeypatch.setattr(channel, "INLINE_LIMIT", 0)
    output: dict[str, object] = {}
    FromWorker(ProcessReport(process="gw2"), (ARTIFACTS, _index())).put(output, tmp_path)
    before = caught.counts().get("removing a worker's artifacts file (PermissionError)", 0)

    def refuse(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", refuse)
    told = FromWorker.get(output)
    assert told is not None and told.own is not None and told.own[0] == ARTIFACTS
    assert told.process.problems == []
    assert caught.counts()["removing a worker's artifacts file (PermissionError)"] == before + 1
