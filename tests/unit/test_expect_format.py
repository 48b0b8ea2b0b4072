"""The expectations file, in process: what reads back, and every way a file cannot be read, each an error naming the
file and the line to look at."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from pytest_compilecache.expect.fileformat import ExpectFileError, Expectations, read, write
from pytest_compilecache.expect.records import FIELDS

RECORD = {name: i for i, name in enumerate(FIELDS)}


def _good() -> str:
    """A file of two records: ``t.py::a`` on line 5, ``t.py::b`` on line 6."""
    return Expectations({"torch": "2.9.0", "device": "cpu"}, {"t.py::a": RECORD, "t.py::b": RECORD}).render().decode()


def test_a_missing_file_is_no_expectations(tmp_path: Path) -> None:
    """No file: ``None``, not an error (an update writes it)."""
    assert read(tmp_path / "absent.json") is None


def test_records_with_null_counts_and_unicode_ids_read_back_as_written(tmp_path: Path) -> None:
    """A count this torch cannot keep (``null``) and a non-ASCII test id survive a write and a read."""
    records = Expectations({"torch": "2.9.0", "device": "cpu"},
                           {"t.py::test[é]": {**RECORD, "recompiles": None}, "t.py::b": RECORD})
    path = tmp_path / "sub" / "e.json"
    assert write(path, records) is True
    assert "t.py::test[é]" in path.read_text(encoding="utf-8")
    assert read(path) == records


def test_a_file_of_no_records_reads_back_empty(tmp_path: Path) -> None:
    """An empty ``tests`` object is valid, and reads as no records."""
    path = tmp_path / "e.json"
    write(path, Expectations({"torch": "2.9.0"}))
    assert read(path) == Expectations({"torch": "2.9.0"}, {})


#: ``(how the good file is changed, the line named, words of the reason)``.
BAD: dict[str, tuple[Callable[[str], str], int, str]] = {
    "not-an-object": (lambda text: "[1, 2]\n", 1, "is not an expectations file"),
    "no-format": (lambda text: text.replace(' "format": 1,\n', ""), 1, "lacks 'format'"),
    "unknown-entry": (lambda text: text.replace(' "made_with"', ' "extra": 1,\n "made_with"'), 3,
                      "unknown entry 'extra'"),
    "made-with-not-strings": (lambda text: text.replace('"device": "cpu"', '"device": 1'), 3,
                              "'made_with' must be an object of strings"),
    "tests-not-an-object": (lambda text: text[:text.index(' "tests"')] + ' "tests": []\n}\n', 4,
                            "'tests' must be an object"),
    "record-not-an-object": (lambda text: text.replace('"t.py::b": {', '"t.py::b": [{').replace("}\n }", "}]\n }"),
                             6, "the record of t.py::b is not an object"),
    "field-missing": (lambda text: text.replace('"t.py::b": {"frames": 0, ', '"t.py::b": {'), 6,
                      "the record of t.py::b: lacks 'frames'"),
    "negative-count": (lambda text: text.replace('"t.py::b": {"frames": 0', '"t.py::b": {"frames": -1'), 6,
                       "'frames' must be a count (a whole number >= 0, or null), not -1"),
    "boolean-count": (lambda text: text.replace('"t.py::a": {"frames": 0', '"t.py::a": {"frames": true'), 5,
                      "'frames' must be a count (a whole number >= 0, or null), not True"),
    "fractional-count": (lambda text: text.replace('"t.py::a": {"frames": 0', '"t.py::a": {"frames": 1.5'), 5,
                         "not 1.5"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_file_is_an_error_naming_the_file_and_the_line(tmp_path: Path, name: str) -> None:
    """Every structural fault raises one :class:`ExpectFileError`: ``path:line: why``, never a partial read."""
    change, line, why = BAD[name]
    path = tmp_path / "e.json"
    path.write_text(change(_good()), encoding="utf-8")
    with pytest.raises(ExpectFileError) as error:
        read(path)
    assert str(error.value).startswith(f"{path}:{line}: ") and why in str(error.value), str(error.value)


def test_bytes_that_are_not_utf8_name_their_line(tmp_path: Path) -> None:
    """A byte that cannot be decoded is located on its line."""
    path = tmp_path / "e.json"
    path.write_bytes(_good().encode().replace(b"t.py::b", b"t.py::\xff"))
    with pytest.raises(ExpectFileError, match=rf"^{path}:6: is not UTF-8 text$"):
        read(path)


def test_a_file_that_cannot_be_opened_is_an_error_not_none(tmp_path: Path) -> None:
    """A path that exists but cannot be read (a folder) is an error naming it, not "no expectations"."""
    with pytest.raises(ExpectFileError, match=rf"^{tmp_path}:1: cannot be read: "):
        read(tmp_path)


def test_the_line_of_a_duplicate_is_its_second_appearance(tmp_path: Path) -> None:
    """A test recorded twice names the line of the second record."""
    path = tmp_path / "e.json"
    text = _good()
    path.write_text(text.replace('"t.py::b"', '"t.py::a"'))
    with pytest.raises(ExpectFileError, match=rf"^{path}:6: 't.py::a' appears twice"):
        read(path)


def test_a_field_repeated_in_a_record_names_that_records_line(tmp_path: Path) -> None:
    """A record edited by hand to hold one field twice is located on its own line, whichever record it is."""
    path = tmp_path / "e.json"
    three = Expectations({"torch": "2.9.0"}, {"t.py::a": RECORD, "t.py::b": RECORD, "t.py::c": RECORD}).render()
    path.write_text(three.decode().replace('"t.py::c": {"frames": 0', '"t.py::c": {"frames": 0, "frames": 1'))
    with pytest.raises(ExpectFileError, match=rf"^{path}:7: 'frames' appears twice"):
        read(path)


def test_the_rendered_file_holds_one_test_per_line_its_fields_in_order() -> None:
    """One line per record, its fields in the file's order, so that a changed record is a one-line diff."""
    records = [line for line in _good().splitlines() if line.startswith('  "t.py::')]
    assert [line.split('"')[1] for line in records] == ["t.py::a", "t.py::b"]
    positions = [records[0].index(f'"{name}": {RECORD[name]}') for name in FIELDS]
    assert positions == sorted(positions)
