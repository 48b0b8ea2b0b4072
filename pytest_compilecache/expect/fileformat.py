"""The expectations file (docs/expectations.md): JSON, one test per line, the same bytes for the same records.
A file that cannot be read whole is an :class:`ExpectFileError` naming the file and the line, never a partial read."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import files
from .records import FIELDS, Record

FORMAT = 1


class ExpectFileError(ValueError):
    """The expectations file cannot be read: ``path:line: why``."""

    def __init__(self, path: Path, line: int, why: str) -> None:
        super().__init__(f"{path}:{line}: {why}")


@dataclass
class Expectations:
    """The records of an expectations file, and the torch version and device they were made with."""

    made_with: dict[str, str] = field(default_factory=dict)
    tests: dict[str, Record] = field(default_factory=dict)

    def render(self) -> bytes:
        """The file's bytes: sorted, one test per line, ending in a newline."""
        head = json.dumps(dict(sorted(self.made_with.items())), ensure_ascii=False)
        rows = [f"  {json.dumps(nodeid, ensure_ascii=False)}: "
                f"{json.dumps({k: record.get(k) for k in FIELDS})}" for nodeid, record in sorted(self.tests.items())]
        body = "{\n" + ",\n".join(rows) + "\n }" if rows else "{}"
        return f'{{\n "format": {FORMAT},\n "made_with": {head},\n "tests": {body}\n}}\n'.encode()


def read(path: Path) -> Expectations | None:
    """The expectations at ``path``; ``None`` when there is no file. Raises :class:`ExpectFileError`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ExpectFileError(path, 1, f"cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ExpectFileError(path, raw[:exc.start].count(b"\n") + 1, "is not UTF-8 text") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except _Duplicate as dup:
        raise ExpectFileError(path, _line_of_repeat(text, dup.key), f"{dup.key!r} appears twice") from None
    except json.JSONDecodeError as exc:
        raise ExpectFileError(path, exc.lineno, f"not valid JSON ({exc.msg}); the file is truncated or was "
                                                "edited by hand: restore it from version control, or delete it "
                                                "and record again with --compile-cache-expect-update") from None
    return _checked(path, text, data)


def write(path: Path, expectations: Expectations) -> bool:
    """Write ``expectations`` to ``path`` atomically, unless the file already holds these very bytes; whether it did."""
    data = expectations.render()
    with contextlib.suppress(OSError):
        if path.read_bytes() == data:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(path, data)
    return True


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _line_of(text: str, key: str) -> int:
    """The line of ``key`` (as a JSON object key) in ``text``."""
    at = text.find(json.dumps(key, ensure_ascii=False))
    return text.count("\n", 0, at) + 1 if at >= 0 else 1


#: A JSON string (with the colon after it, where it is a key), or a brace.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"\s*:?|[{}]')


def _line_of_repeat(text: str, key: str) -> int:
    """The line where ``key`` is a key of one JSON object for the second time (1 where that cannot be told)."""
    objects: list[set[str]] = []
    for token in _TOKENS.finditer(text):
        found = token.group()
        if found == "{":
            objects.append(set())
        elif found == "}":
            if objects:
                objects.pop()
        elif found.endswith(":") and objects:
            name = json.loads(found[:-1])
            if name == key and name in objects[-1]:
                return text.count("\n", 0, token.start()) + 1
            objects[-1].add(name)
    return 1


def _checked(path: Path, text: str, data: Any) -> Expectations:
    if not isinstance(data, dict):
        raise ExpectFileError(path, 1, "is not an expectations file (a JSON object with 'format', 'made_with' "
                                       "and 'tests')")
    if data.get("format") != FORMAT:
        why = (f"format {data.get('format')!r} is not one this pytest-compilecache reads (it reads {FORMAT}); "
               "it may be from a newer version" if "format" in data else "lacks 'format'; it is not an "
               "expectations file")
        raise ExpectFileError(path, _line_of(text, "format"), why)
    unknown = sorted(set(data) - {"format", "made_with", "tests"})
    if unknown:
        raise ExpectFileError(path, _line_of(text, unknown[0]), f"unknown entry {unknown[0]!r}")
    made_with = data.get("made_with", {})
    if not isinstance(made_with, dict) or not all(isinstance(v, str) for v in made_with.values()):
        raise ExpectFileError(path, _line_of(text, "made_with"), "'made_with' must be an object of strings")
    tests = data.get("tests")
    if not isinstance(tests, dict):
        raise ExpectFileError(path, _line_of(text, "tests"), "'tests' must be an object of {test id: record}")
    for nodeid, record in tests.items():
        if not isinstance(record, dict):
            raise ExpectFileError(path, _line_of(text, nodeid), f"the record of {nodeid} is not an object")
        extra = sorted(set(record) - set(FIELDS))
        missing = [f for f in FIELDS if f not in record]
        bad = [f for f in FIELDS if f in record and record[f] is not None
               and (not isinstance(record[f], int) or isinstance(record[f], bool) or record[f] < 0)]
        if extra or missing or bad:
            why = (f"unknown field {extra[0]!r}" if extra else f"lacks {missing[0]!r}" if missing
                   else f"{bad[0]!r} must be a count (a whole number >= 0, or null), not {record[bad[0]]!r}")
            raise ExpectFileError(path, _line_of(text, nodeid), f"the record of {nodeid}: {why}")
    return Expectations(dict(made_with), {str(k): dict(v) for k, v in tests.items()})
