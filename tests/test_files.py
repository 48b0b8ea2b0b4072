"""How the plugin writes and locks files: atomic, with the user's umask, never through a planted symlink."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_compilecache.storage.local import lock_file
from pytest_compilecache.bundle import format as bundle_module
from pytest_compilecache import files
from pytest_compilecache.bundle.format import Bundle, BundleError, make_entry, read_manifest
from pytest_compilecache.bundle.writing import write_bundle
from pytest_compilecache.session.folders import Folders
from pytest_compilecache.storage.local import LocalStore

ENV = {"torch": "2.13.0+cpu", "device": "cpu"}


def _bundle(path: Path, payload: bytes) -> Path:
    write_bundle(Bundle(path, [make_entry(ENV, payload, {"inductor": {"count": 1, "bytes": len(payload)}})]))
    return path


def test_a_bundle_written_over_a_planted_symlink_replaces_the_link_not_its_target(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = tmp_path / "cache.bundle"
    path.symlink_to(victim)
    _bundle(path, b"payload")
    assert victim.read_text() == "precious"
    with read_manifest(path) as written:
        assert not path.is_symlink() and written.payload(written.entries[0]) == b"payload"


def test_a_saved_bundle_keeps_the_users_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        path = _bundle(tmp_path / "cache.bundle", b"payload")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["cache.bundle"], "no temporary file left"


@pytest.mark.parametrize("hold_open", [True, False], ids=["posix", "read-whole-file"])
def test_a_reader_sees_one_version_while_a_writer_replaces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hold_open: bool
) -> None:
    """Manifest and payload come from the version the reader opened, in both reading modes."""
    monkeypatch.setattr(bundle_module, "HOLD_OPEN", hold_open)
    path = _bundle(tmp_path / "cache.bundle", b"old payload")
    with read_manifest(path) as reader:
        _bundle(path, b"the new payload, longer")
        assert reader.payload(reader.entries[0]) == b"old payload"
    with read_manifest(path) as reader:
        assert reader.payload(reader.entries[0]) == b"the new payload, longer"


def test_a_symlink_planted_at_the_lock_file_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    """CVE-2025-68146: a lock file that is a symlink must not truncate what it points at."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = tmp_path / "cache.bundle"
    lock_file(path).symlink_to(victim)
    store = LocalStore(path, lock_timeout=1)
    with pytest.raises(BundleError) as info:
        with store.locked():
            pass
    assert str(lock_file(path)) in str(info.value)
    assert victim.read_text() == "precious"


def test_the_lock_timeout_names_the_process_holding_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "cache.bundle"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         f"import filelock, time; lock = filelock.FileLock({str(lock_file(path))!r}); lock.acquire(); print('held', flush=True); "
         "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        with pytest.raises(BundleError) as info:
            with LocalStore(path, lock_timeout=0.5).locked():
                pass
        assert time.monotonic() - start < 5
    finally:
        holder.kill()
        holder.wait()
    message = str(info.value)
    assert f"{lock_file(path)}: could not take the lock within 0.5 s" in message
    if Path("/proc/locks").exists():
        assert f"held by pid {holder.pid} (" in message and "filelock" in message, message


def test_a_failed_write_leaves_the_old_bundle_and_no_temporary_file(tmp_path: Path) -> None:
    path = _bundle(tmp_path / "cache.bundle", b"old payload")
    before = path.read_bytes()
    entry = make_entry(ENV, os.urandom(4096), {})  # stored compressed: bytes that do not compress
    script = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from pytest_compilecache.bundle.format import Bundle, BundleError, make_entry\n"
        "from pytest_compilecache.bundle.writing import write_bundle\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))\n"
        f"entry = make_entry({ENV!r}, {entry.payload!r}, {{}})\n"
        "try:\n"
        f"    write_bundle(Bundle(Path({str(path)!r}), [entry]))\n"
        "except BundleError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{path}: cannot write: File too large"), out.stdout
    assert "unchanged" in out.stdout
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.bundle"]


def test_a_rename_blocked_by_a_reader_on_windows_is_retried_then_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Windows ``os.replace`` fails while another process has the target open; retry, then raise."""
    source, target = tmp_path / "new", tmp_path / "old"
    source.write_text("new")
    target.write_text("old")
    real = os.replace
    attempts = []

    def blocked_twice(a: object, b: object) -> None:
        attempts.append(1)
        if len(attempts) <= 2:
            raise PermissionError(13, "The process cannot access the file", str(b))
        real(a, b)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "name", "nt")
    monkeypatch.setattr(os, "replace", blocked_twice)
    slept: list[float] = []
    files.replace(source, target, sleep=slept.append)
    assert target.read_text() == "new" and len(attempts) == 3 and len(slept) == 2

    monkeypatch.setattr(os, "replace", lambda a, b: (_ for _ in ()).throw(PermissionError(13, "held", str(b))))
    with pytest.raises(PermissionError):
        files.replace(source, target, sleep=slept.append)
    assert sum(slept) >= files.REPLACE_RETRY_SECONDS


def test_a_writer_killed_mid_write_leaves_nothing_after_the_next_update(tmp_path: Path) -> None:
    """kill -9 while the bundle's temporary file is being written: the next writer of PATH (under
    its lock, so no other writer can be in flight) removes what the dead one left."""
    path = _bundle(tmp_path / "cache.bundle", b"old payload")
    code = (
        "import sys, time; from pathlib import Path; from pytest_compilecache import files\n"
        "def chunks():\n    yield b'half of a new bundle'\n    print('writing', flush=True)\n    time.sleep(60)\n"
        f"files.write_atomic(Path({str(path)!r}), chunks())\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
    writer.kill()
    writer.wait()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers, "the killed writer should have left its temporary file"

    LocalStore(path, lock_timeout=5).add([make_entry({**ENV, "device": "other"}, b"new", {})])
    assert sorted(p.name for p in tmp_path.iterdir()) == [".cache.bundle.lock", "cache.bundle"]
    assert len(read_manifest(path).entries) == 2


def test_leftovers_of_one_bundle_never_touch_another_files_temporary(tmp_path: Path) -> None:
    path = tmp_path / "ci.bundle"
    mine = tmp_path / ".ci.bundle.abcd1234.tmp"
    others = [tmp_path / ".ci.bundle.gpu.abcd1234.tmp", tmp_path / ".ci.bundle.json.x1y2z3w4.tmp"]
    for p in [mine, *others]:
        p.write_bytes(b"partial")
    assert files.remove_leftovers(path) == [mine]
    assert all(p.exists() for p in others)


def test_a_linked_cache_folder_shares_files_and_never_writes_back(tmp_path: Path) -> None:
    """warm_cache folders are hard links to the template: a file torch writes (a new file renamed over the
    name) replaces the link in that folder alone; sources (appended to in place by torch's
    ahead-of-time builds) are copies; ``replace`` refreshes a kept folder's stale files."""
    torch = pytest.importorskip("torch")
    from torch._inductor.codecache import write_atomic

    template = tmp_path / "template"
    (template / "fxgraph" / "fkey").mkdir(parents=True)
    (template / "fxgraph" / "fkey" / "entry").write_bytes(b"graph")
    (template / "ab").mkdir()
    (template / "ab" / "cabc.so").write_bytes(b"binary")
    (template / "ab" / "cabc.cpp").write_bytes(b"source")
    test = tmp_path / "test"
    assert files.link_tree(template, test) == 3
    assert (test / "ab" / "cabc.so").stat().st_ino == (template / "ab" / "cabc.so").stat().st_ino
    assert (test / "ab" / "cabc.cpp").stat().st_ino != (template / "ab" / "cabc.cpp").stat().st_ino
    write_atomic(str(test / "fxgraph" / "fkey" / "entry"), b"written by the test")
    with open(test / "ab" / "cabc.cpp", "a") as f:
        f.write("// appended, as torch's ahead-of-time build does")
    assert (template / "fxgraph" / "fkey" / "entry").read_bytes() == b"graph"
    assert (template / "ab" / "cabc.cpp").read_bytes() == b"source"
    assert files.link_tree(template, test) == 0, "what the folder has is left alone"
    assert files.link_tree(template, test, replace=True) == 2, "stale files replaced, the same file kept"
    assert (test / "fxgraph" / "fkey" / "entry").read_bytes() == b"graph"
    assert not [p for p in test.rglob("*") if p.name.endswith(".link")], "no temporary link left"
    del torch


def test_link_tree_leaves_out_top_level_names_and_suffixes(tmp_path: Path) -> None:
    """``leave_out`` names top-level entries, ``without`` file suffixes at any depth; a source is copied
    whole, under a temporary name of its own that is gone afterwards, and never over a file that exists."""
    template = tmp_path / "template"
    (template / "fxgraph" / "k").mkdir(parents=True)
    (template / "fxgraph" / "k" / "entry").write_bytes(b"graph")
    (template / "ab").mkdir()
    (template / "ab" / "c.so").write_bytes(b"binary")
    (template / "ab" / "c.cpp").write_bytes(b"source")
    (template / "ab" / "d.h").write_bytes(b"header")
    test = tmp_path / "test"
    assert files.link_tree(template, test, leave_out={"fxgraph"}, without=(".cpp",)) == 2
    assert sorted(p.relative_to(test).as_posix() for p in test.rglob("*")) == ["ab", "ab/c.so", "ab/d.h"]
    assert (test / "ab" / "d.h").stat().st_ino != (template / "ab" / "d.h").stat().st_ino, "a source is a copy"
    (test / "ab" / "c.cpp").write_bytes(b"written by torch")
    assert files.link_tree(template, test) == 1, "only the entry was absent"
    assert (test / "ab" / "c.cpp").read_bytes() == b"written by torch", "a file that exists is left alone"
    assert not [p for p in test.rglob("*") if p.name.endswith(".link")], "no temporary copy left"


def _folders_at(tmp_path: Path) -> Folders:
    """A process's folders with ``tmp_path`` as pytest's basetemp."""

    class Config:
        _tmp_path_factory = pytest.TempPathFactory(tmp_path, retention_count=3, retention_policy="all",
                                                   trace=lambda *a: None, _ispytest=True)

    return Folders(Config())  # type: ignore[arg-type]


def test_discarded_test_folders_are_gone_and_a_failed_tests_folder_stays(tmp_path: Path) -> None:
    """A test's folder is removed when discarded; the process's clean-up removes the rest, but a failed
    test's folder, never discarded, stays for inspection."""
    folders = _folders_at(tmp_path)
    made = [folders.for_test(f"test_{i}") for i in range(2)]
    for folder in made:
        (folder / "ab").mkdir(parents=True)
        for n in range(50):
            (folder / "ab" / f"c{n}.so").write_bytes(b"x")
    root = folders.root
    shutil.rmtree(made[0])  # as the test side discards a passed test's folder
    assert not made[0].exists()
    (folders.template / "ab").mkdir(parents=True)
    folders.remove(keep_root=True)
    assert made[1].exists(), "a failed test's folder, never discarded, stays for inspection"
    assert sorted(p.name for p in root.iterdir()) == ["tests"]