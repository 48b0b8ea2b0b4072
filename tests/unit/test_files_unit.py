"""Atomic files, in process, beside ``tests/test_files.py``: a reader sees the old file or the new one whole, a
failed write leaves the old file and no temporary, and the helpers that place and check files do what they say."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from pytest_compilecache import files


def test_a_write_returns_its_size_and_the_file_holds_every_chunk(tmp_path: Path) -> None:
    """Chunks are written in order; the size returned is the file's."""
    path = tmp_path / "f.bin"
    size = files.write_atomic(path, [b"abc", b"", b"defg"], fsync=False)
    assert path.read_bytes() == b"abcdefg" and size == 7 == path.stat().st_size


def test_a_reader_that_opened_the_old_file_reads_it_whole_after_a_write(tmp_path: Path) -> None:
    """The new file replaces the old by rename: an open reader keeps the old bytes, a new reader gets the new."""
    path = tmp_path / "f.bin"
    files.write_atomic(path, b"old " * 1000, fsync=False)
    with open(path, "rb") as reader:
        files.write_atomic(path, b"new", fsync=False)
        assert reader.read() == b"old " * 1000
    assert path.read_bytes() == b"new"


def test_a_reader_during_a_write_sees_the_old_file_not_a_half_written_one(tmp_path: Path) -> None:
    """While the chunks are still being written, the path holds the old content whole."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    seen: list[bytes] = []

    def chunks() -> Iterator[bytes]:
        yield b"new part one, "
        seen.append(path.read_bytes())
        yield b"new part two"

    files.write_atomic(path, chunks(), fsync=False)
    assert seen == [b"old"] and path.read_bytes() == b"new part one, new part two"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    """A writer that fails midway raises, and the folder holds the old file alone."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")

    def chunks() -> Iterator[bytes]:
        yield b"half"
        raise RuntimeError("the source failed")

    with pytest.raises(RuntimeError, match="the source failed"):
        files.write_atomic(path, chunks(), fsync=False)
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_an_os_error_while_writing_names_the_target(tmp_path: Path) -> None:
    """An :class:`OSError` without a file name gets the target's, for a message that says which file."""
    path = tmp_path / "f.bin"

    def chunks() -> Iterator[bytes]:
        yield b"x"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError) as error:
        files.write_atomic(path, chunks(), fsync=False)
    assert error.value.filename == str(path) and not path.exists() and list(tmp_path.iterdir()) == []


def test_a_write_into_a_missing_folder_names_the_target(tmp_path: Path) -> None:
    """Where the temporary file cannot be made, the error still names the file being written."""
    path = tmp_path / "missing" / "f.bin"
    with pytest.raises(OSError) as error:
        files.write_atomic(path, b"x", fsync=False)
    assert error.value.filename == str(path)


def test_a_written_file_has_the_given_time_and_the_users_umask(tmp_path: Path) -> None:
    """``mtime`` is set before the file appears; its mode is what the umask allows, not mkstemp's 0600."""
    old = os.umask(0o022)
    try:
        files.write_atomic(tmp_path / "f.bin", b"x", fsync=False, mtime=1_600_000_000.0)
    finally:
        os.umask(old)
    st = (tmp_path / "f.bin").stat()
    assert st.st_mtime == 1_600_000_000.0 and st.st_mode & 0o777 == 0o644


def test_the_umask_is_read_without_changing_it() -> None:
    """``umask()`` gives the process's umask and leaves it as it was."""
    old = os.umask(0o027)
    try:
        assert files.umask() == 0o027
        assert files.umask() == 0o027
    finally:
        os.umask(old)


def test_leftovers_of_a_killed_writer_are_removed_and_nothing_else(tmp_path: Path) -> None:
    """Only temporaries of this path's exact pattern go; another file's, or a look-alike, stay."""
    path = tmp_path / "f.bin"
    prefix, suffix = files.temporary_name(path)
    fd, leftover = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=tmp_path)
    os.close(fd)
    other_prefix, _ = files.temporary_name(tmp_path / "g.bin")
    fd, others = tempfile.mkstemp(prefix=other_prefix, suffix=suffix, dir=tmp_path)
    os.close(fd)
    lookalike = tmp_path / f"{prefix}not-random{suffix}"
    lookalike.write_bytes(b"")
    assert files.remove_leftovers(path) == [Path(leftover)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([Path(others).name, lookalike.name])


def test_a_checksum_is_the_sha256_and_size_of_the_whole_file(tmp_path: Path) -> None:
    """Read a chunk at a time, the digest and size are those of every byte."""
    data = os.urandom(1024 * 1024 + 17)
    (tmp_path / "f.bin").write_bytes(data)
    assert files.checksum(tmp_path / "f.bin") == (hashlib.sha256(data).hexdigest(), len(data))


def test_a_folder_that_can_be_written_has_no_reason_and_keeps_no_trace(tmp_path: Path) -> None:
    """``cannot_write`` tries by making a file, looks at the nearest existing parent, and removes what it made."""
    assert files.cannot_write(tmp_path / "not" / "yet") == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes in a read-only folder")
def test_a_folder_that_cannot_be_written_says_why_naming_it(tmp_path: Path) -> None:
    """A read-only folder names itself and the OS's reason."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        assert files.cannot_write(folder / "sub") == f"{folder}: Permission denied"
    finally:
        folder.chmod(0o700)


def test_placing_a_binary_links_it_and_never_overwrites(tmp_path: Path) -> None:
    """A binary is placed as a hard link; a target that exists is left as it was."""
    source, target = tmp_path / "k.so", tmp_path / "placed.so"
    source.write_bytes(b"kernel")
    assert files.place_file(str(source), str(target)) is True
    assert os.path.samefile(source, target)
    source2 = tmp_path / "k2.so"
    source2.write_bytes(b"other")
    assert files.place_file(str(source2), str(target)) is False and target.read_bytes() == b"kernel"


def test_placing_a_source_copies_it(tmp_path: Path) -> None:
    """C++ sources are copied, not linked: torch appends to them in place."""
    source, target = tmp_path / "k.cpp", tmp_path / "placed.cpp"
    source.write_text("int main() {}")
    assert files.place_file(str(source), str(target)) is True
    assert target.read_text() == "int main() {}" and not os.path.samefile(source, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.cpp", "placed.cpp"]


def test_a_linked_tree_with_replace_replaces_only_what_differs(tmp_path: Path) -> None:
    """``replace`` puts the source's file over a different one at the target; the same file is not counted."""
    source, dest = tmp_path / "src", tmp_path / "dest"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "a.so").write_bytes(b"new")
    (source / "b.so").write_bytes(b"b")
    assert files.link_tree(source, dest) == 2
    (dest / "sub" / "a.so").unlink()
    (dest / "sub" / "a.so").write_bytes(b"stale")
    assert files.link_tree(source, dest, replace=True) == 1
    assert (dest / "sub" / "a.so").read_bytes() == b"new" and os.path.samefile(source / "b.so", dest / "b.so")


def test_nobody_holds_a_lock_on_a_plain_file(tmp_path: Path) -> None:
    """A file no process has locked has no holders."""
    (tmp_path / "x.lock").write_bytes(b"")
    assert files.lock_holders(tmp_path / "x.lock") == []
    assert files.lock_holders(tmp_path / "absent.lock") == []
