"""The load-or-warm-up protocol's whole table, without a process or a file (``session/protocol.py``)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache.session.protocol import Next, Outcome, Published, decide

N, E, R, T = Published.NOTHING, Published.NO_ENTRY, Published.EARLIER_ENTRY, Published.THIS_RUNS_ENTRY
LOAD, NONE, WARM = Next.LOAD_PUBLISHED, Next.NOTHING, Next.WARM_UP

#: Before any warmup of the session ended (no marker): ``(published, update, rebuild, to_path) -> next``.
#: ``rebuild`` comes with ``update`` (the options make it so); rows without are listed all the same.
FIRST = {
    # a run that only reads: an entry at PATH is loaded, anything else warms up
    (N, False, False, True): WARM, (E, False, False, True): WARM,
    (R, False, False, True): LOAD, (T, False, False, True): LOAD,
    # publishing to the session's own bundle (PATH unreadable, or no PATH): warm up whatever is there
    (N, False, False, False): WARM, (E, False, False, False): WARM,
    (R, False, False, False): WARM, (T, False, False, False): WARM,
    # an updating run warms up, whatever PATH holds
    **{(p, True, rebuild, to_path): WARM for p in (N, E, R, T) for rebuild in (False, True) for to_path in (False, True)},
    # rebuild without update (not offered): an entry of an earlier run is not loaded, nor warmed over
    (N, False, True, True): WARM, (E, False, True, True): WARM,
    (R, False, True, True): NONE, (T, False, True, True): LOAD,
    (N, False, True, False): WARM, (E, False, True, False): WARM,
    (R, False, True, False): WARM, (T, False, True, False): WARM,
}


def test_the_table_before_any_warmup_ended_covers_every_case() -> None:
    assert len(FIRST) == 4 * 2 * 2 * 2


@pytest.mark.parametrize("case", sorted(FIRST, key=str), ids=lambda c: "-".join(str(getattr(x, "name", x)) for x in c))
def test_before_any_warmup_ended(case: tuple[Published, bool, bool, bool]) -> None:
    assert decide(None, *case) is FIRST[case]


@pytest.mark.parametrize("outcome", [Outcome.PUBLISHED, Outcome.NOTHING])
def test_after_a_warmup_ended_nobody_warms_up_again(outcome: Outcome) -> None:
    """The published entry is loaded where there is one (under rebuild, only this run's); else nothing."""
    for published, update, rebuild, to_path in itertools.product(Published, (False, True), (False, True), (False, True)):
        step = decide(outcome, published, update, rebuild, to_path)
        usable = published is T or (published is R and not (rebuild and to_path))
        assert step is (LOAD if usable else NONE), (published, update, rebuild, to_path)


@pytest.mark.parametrize("outcome, expected", [(Outcome.FAILED, Next.SAY_FAILED),
                                               (Outcome.KEPT_APART, Next.LOAD_KEPT_APART)])
def test_a_failed_or_kept_apart_warmup_decides_alone(outcome: Outcome, expected: Next) -> None:
    steps = {decide(outcome, *case) for case in itertools.product(Published, (False, True), (False, True), (False, True))}
    assert steps == {expected}


def test_a_workers_key_index_that_cannot_be_read_leaves_its_artifacts_home() -> None:
    """What a worker sends home rides in ``workeroutput``; a key index damaged on the way costs only the artifacts'
    key details, never the controller (an INTERNALERROR would fail a passing suite)."""
    from pytest_compilecache.bundle.keyindex import KeyIndex
    from pytest_compilecache.channel import FromWorker
    from pytest_compilecache.report.model import ProcessReport

    output: dict[str, Any] = {}
    FromWorker(ProcessReport(process="gw0"), (b"artifacts", KeyIndex())).put(output, Path("."))
    sent = next(iter(output.values()))
    assert FromWorker.get(output) is not None
    sent["index"] = b"\x00not a key index"
    got = FromWorker.get(output)
    assert got is not None and got.own is not None
    assert got.own[0] == b"artifacts" and not got.own[1].keys
