"""How long making a file takes on a file system, before and after many files are removed.

A plugin run makes and removes about a thousand files and folders that a kept cache folder never
does. On an ext4 without a journal, the kernel does not reuse an inode freed in the last minute (six
while its inode table block is not yet written back) when it picks one for a new file (``recently_deleted``
in ``fs/ext4/ialloc.c``), and each inode it passes over is a lookup: for a minute or more after many
removals, making a file costs many times what it costs on a journaled file system. (Right after the
removals it is still fast: a time of removal counts only once the clock's second has turned.)

    python benchmarks/probe/inode_churn.py DIR [COUNT] [WAIT]

Makes COUNT empty files in a new folder under DIR, removes them, makes COUNT more at once, then
after WAIT seconds; prints the microseconds a file each time. Run it twice: the second run starts
after the first one's removals (its "fresh" line is not fresh). It times files only (ext4 places new
folders by another rule), and on a disk without a journal it leaves 3 x COUNT freed inodes that slow
whatever makes files there in the next minutes, a benchmark included.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path


def make(folder: Path, count: int, tag: str) -> float:
    """Microseconds a file to make ``count`` empty files in ``folder``."""
    folder.mkdir(exist_ok=True)
    start = time.perf_counter()
    for i in range(count):
        os.close(os.open(folder / f"{tag}{i}", os.O_CREAT | os.O_WRONLY, 0o644))
    return (time.perf_counter() - start) / count * 1e6


def main() -> None:
    where = Path(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
    wait = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0
    folder = Path(tempfile.mkdtemp(prefix="inode-churn-", dir=where)) / "files"
    try:
        print(f"{where}: {count} files, microseconds a file")
        print(f"  fresh:                  {make(folder, count, 'a'):8.1f}")
        shutil.rmtree(folder)
        print(f"  right after removing:   {make(folder, count, 'b'):8.1f}")
        shutil.rmtree(folder)
        time.sleep(wait)
        print(f"  {wait:g} s after removing:  {make(folder, count, 'c'):8.1f}")
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
