"""Reading what ``phases.py`` wrote, and printing medians of it side by side (plugin against kept folder)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path


def read_phases(log: Path) -> dict[str, float]:
    """The phases of the run just ended (the log's last line), then the log is removed; ``{}`` when none."""
    if not log.exists():
        return {}
    line = log.read_text().splitlines()[-1]
    log.unlink()
    return {key: float(value) for key, value in re.findall(r"\s*([^=]+)=(-?[0-9.]+)", line)}


def print_table(heading: str, by_side: dict[str, dict[str, list[float]]], missing: str = "-") -> None:
    """A markdown table of each key's median on the plugin's side and the kept folder's."""
    print(f"\n{heading}")
    print("| phase | plugin | kept folder |\n|---|---|---|")
    for key in sorted(set(by_side["plugin"]) | set(by_side["kept"])):
        cells = [f"{statistics.median(by_side[side][key]):.2f}" if by_side[side].get(key) else missing
                 for side in ("plugin", "kept")]
        print(f"| {key} | {cells[0]} | {cells[1]} |")
