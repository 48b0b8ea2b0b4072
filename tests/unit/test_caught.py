"""Errors caught and gone past are counted by place and type, and a session reports only its own."""

from __future__ import annotations

from pytest_compilecache import caught


def test_counts_are_by_place_and_error_type_and_a_session_takes_only_what_came_after_its_start() -> None:
    caught.caught("an earlier session's place", OSError())
    before = caught.counts()
    caught.caught("reading a thing", FileNotFoundError())
    caught.caught("reading a thing", FileNotFoundError())
    caught.caught("reading a thing", ValueError())
    caught.caught("an earlier session's place", OSError())
    assert caught.since(before) == {"reading a thing (FileNotFoundError)": 2, "reading a thing (ValueError)": 1,
                                    "an earlier session's place (OSError)": 1}
    assert caught.since(caught.counts()) == {}
