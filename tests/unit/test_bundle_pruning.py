"""What ``prune`` keeps (``pruning.py``): entries dropped by number, field or machine, unused artifacts dropped, and
the rest made to fit a size, least recently used first; what it did comes back as values."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pytest_compilecache.bundle.binaries import CarriedBinaries, build_id
from pytest_compilecache.bundle.format import Bundle, BundleError, Entry, entry_of, members_of, read_manifest
from pytest_compilecache.bundle.keyindex import KeyIndex, artifact_id
from pytest_compilecache.bundle.members import Members
from pytest_compilecache.bundle.pruning import fit, prune
from pytest_compilecache.bundle.writing import encoded_size, write_bundle

CPU = {"torch": "2.13.0+cpu", "device": "cpu"}
GPU = {"torch": "2.13.0+cu128", "device": "NVIDIA H200"}
OLD = {"torch": "2.11.0+cpu", "device": "cpu"}
LABEL = "suite.bundle"


def noise(n: int, seed: int) -> bytes:
    """``n`` bytes that do not compress, the same for a seed: sizes in these tests are predictable."""
    return random.Random(seed).randbytes(n)


FX1 = ("inductor", "f" + "1" * 30, noise(2000, 1))
FX2 = ("inductor", "f" + "2" * 30, noise(2000, 2))
AOT = ("aot_autograd", "a" + "3" * 30, noise(1000, 3))


@pytest.fixture(autouse=True)
def _no_signing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_COMPILE_CACHE_KEY", raising=False)


def entry(env: dict[str, str], *artifacts: tuple[str, str, bytes], index: KeyIndex | None = None,
          binaries: CarriedBinaries | None = None) -> Entry:
    return entry_of(env, Members.packed(artifacts), binaries=binaries, index=index)


def read_whole(path: Path, *entries: Entry) -> Bundle:
    """``entries`` written and read whole, as the prune command reads the bundle it rewrites."""
    write_bundle(Bundle(path, list(entries)))
    bundle = read_manifest(path)
    bundle.read_all()
    return bundle


def three(tmp_path: Path) -> Bundle:
    return read_whole(tmp_path / LABEL, entry(CPU, FX1), entry(GPU, FX2), entry(OLD, AOT))


def envs(entries: list[Entry]) -> list[dict[str, str]]:
    return [e.env for e in entries]


@pytest.mark.parametrize(("drop", "left"), [(["1"], [CPU, OLD]), (["device=cpu"], [GPU]),
                                            (["0", "torch=2.11.0+cpu"], [GPU])])
def test_drop_removes_the_entries_named_by_number_or_field(tmp_path: Path, drop: list[str],
                                                           left: list[dict[str, str]]) -> None:
    """``--drop N`` removes entry N; ``--drop FIELD=VALUE`` every entry with that value; several drops add up."""
    kept, said = prune(three(tmp_path), LABEL, drop, None, 0, None)
    assert envs(kept) == left and said == []


@pytest.mark.parametrize(("drop", "reason"), [
    ("3", "--drop 3: there is no entry 3; its entries are numbered 0 to 2 (see inspect)"),
    ("cuda=12.8", "--drop 'cuda=12.8': no entry has a field 'cuda'; the fields are device, torch"),
    ("device=mps", "--drop 'device=mps': no entry has device='mps'; its entries have device='NVIDIA H200', 'cpu'"),
])
def test_a_drop_that_names_no_entry_says_why_and_changes_nothing(tmp_path: Path, drop: str, reason: str) -> None:
    """A drop naming nothing is an error naming the bundle, what is there instead, and that it is unchanged."""
    with pytest.raises(BundleError) as exc:
        prune(three(tmp_path), LABEL, [drop], None, 0, None)
    assert str(exc.value) == f"{LABEL}: {reason}; {LABEL} is unchanged"


def test_dropping_every_entry_is_refused(tmp_path: Path) -> None:
    """A prune that would leave no entry is refused: deleting the file is how a bundle is removed."""
    with pytest.raises(BundleError) as exc:
        prune(three(tmp_path), LABEL, ["device=cpu", "1"], None, 0, None)
    assert str(exc.value) == (f"{LABEL}: no entry would be left (delete the file to remove the bundle); {LABEL} is "
                              "unchanged")


def test_keep_matching_keeps_only_this_machines_entry(tmp_path: Path) -> None:
    """``--keep-matching`` (``here``) keeps the entry equal to this machine's environment alone."""
    kept, _ = prune(three(tmp_path), LABEL, [], dict(OLD), 0, None)
    assert envs(kept) == [OLD]
    assert set(members_of(kept[0], LABEL).contents()) == {AOT}


def used_in_runs(*runs: list[tuple[str, str, bytes]]) -> KeyIndex:
    """A key index recording the keys of the artifacts, and whole-suite runs at 1.0, 2.0, ..., each using those
    listed for it."""
    index = KeyIndex()
    for kind, key, _ in (FX1, FX2, AOT):
        index.add(key, kind, "code", {"gm": (key, "graph")})
    for when, used in enumerate(runs, 1):
        index.note_run(float(when), [artifact_id(kind, key) for kind, key, _ in used])
    return index


def test_max_unused_runs_drops_what_no_recent_run_used_and_says_so(tmp_path: Path) -> None:
    """An artifact none of the last N whole runs used goes; the line says how many of which layer."""
    bundle = read_whole(tmp_path / LABEL, entry(CPU, FX1, FX2, index=used_in_runs([FX1, FX2], [FX2])))
    kept, said = prune(bundle, LABEL, [], None, 1, None)
    assert set(members_of(kept[0], LABEL).contents()) == {FX2}
    assert said == ["dropped as unused in the last 1 updating run: 1 fx_graph"]


def test_max_unused_runs_over_too_few_recorded_runs_drops_nothing_and_says_why(tmp_path: Path) -> None:
    """With fewer whole runs recorded than asked for, nothing goes, and the line says how many were recorded."""
    bundle = read_whole(tmp_path / LABEL, entry(CPU, FX1, FX2, index=used_in_runs([FX2])))
    kept, said = prune(bundle, LABEL, [], None, 3, None)
    assert set(members_of(kept[0], LABEL).contents()) == {FX1, FX2}
    assert said == ["dropped as unused in the last 3 updating runs: nothing (only 1 updating run of the whole suite "
                    "recorded: runs that left tests out, such as CI shards, are not counted)"]


def test_fit_drops_the_least_recently_used_artifact_first(tmp_path: Path) -> None:
    """Made to fit, the bundle loses its least recently used artifact; the lines give the sizes and what went, and
    the key index notes the drop by ``prune --max-size``."""
    bundle = read_whole(tmp_path / LABEL, entry(CPU, FX1, FX2, AOT, index=used_in_runs([FX1, FX2, AOT], [FX1, AOT])))
    start = encoded_size(bundle)
    kept, lines = fit(bundle.path, bundle.entries, start - 1000, LABEL)
    (left,) = kept
    assert set(members_of(left, LABEL).contents()) == {FX1, AOT}
    end = encoded_size(Bundle(bundle.path, kept))
    assert end <= start - 1000
    assert lines == [f"{start:,d} -> {end:,d} bytes", "dropped 1 least recently used artifact (1 fx_graph)"]
    assert left.index is not None and left.index.dropped[FX2[1]][0] == "`prune --max-size`"


def test_fit_drops_aot_autograd_before_fx_graphs_used_as_recently(tmp_path: Path) -> None:
    """Among artifacts used as recently, an AOTAutograd entry goes before an FX graph (it needs its graph)."""
    bundle = read_whole(tmp_path / LABEL, entry(CPU, FX1, AOT))
    kept, lines = fit(bundle.path, bundle.entries, encoded_size(bundle) - 300, LABEL)
    assert set(members_of(kept[0], LABEL).contents()) == {FX1}
    assert lines[-1] == "dropped 1 least recently used artifact (1 aot_autograd)"


def test_fit_says_when_it_drops_what_the_last_run_used(tmp_path: Path) -> None:
    """Dropping artifacts the last recorded run used is said: tests that need them will miss."""
    bundle = read_whole(tmp_path / LABEL, entry(CPU, FX1, FX2, AOT, index=used_in_runs([FX1, FX2, AOT])))
    _, lines = fit(bundle.path, bundle.entries, encoded_size(bundle) - 2500, LABEL)
    assert lines[-1].startswith("dropped 2 least recently used artifacts (")
    assert lines[-1].endswith("; 2 of them the last recorded run used: tests that need them miss until an updating "
                              "run saves them again)")


def test_fit_drops_carried_binaries_rather_than_every_artifact(tmp_path: Path) -> None:
    """Where only dropping the carried binaries makes the bundle fit, they go and every artifact stays."""
    identity = {"compiler": "g++"}
    carried = CarriedBinaries({build_id(identity): identity})
    carried.add(build_id(identity), "ab/cbig.main.so", noise(20000, 4))
    bundle = read_whole(tmp_path / LABEL, entry(CPU, FX1, AOT, binaries=carried))
    kept, lines = fit(bundle.path, bundle.entries, encoded_size(bundle) - 5000, LABEL)
    (left,) = kept
    assert left.binaries is None
    assert set(members_of(left, LABEL).contents()) == {FX1, AOT}
    assert lines[1:] == ["dropped the carried binaries of torch 2.13.0+cpu on cpu"]


def test_fit_where_it_fits_already_drops_nothing(tmp_path: Path) -> None:
    """A bundle under the limit keeps everything; the only line is its size, unchanged."""
    bundle = three(tmp_path)
    size = encoded_size(bundle)
    kept, lines = fit(bundle.path, bundle.entries, size, LABEL)
    assert envs(kept) == [CPU, GPU, OLD] and lines == [f"{size:,d} -> {size:,d} bytes"]


def test_fit_into_too_small_a_size_is_refused(tmp_path: Path) -> None:
    """No artifact left at that size: refused, naming the bundle and the size, and that it is unchanged."""
    bundle = three(tmp_path)
    with pytest.raises(BundleError) as exc:
        fit(bundle.path, bundle.entries, 100, LABEL)
    assert str(exc.value) == f"{LABEL}: cannot fit in 100 bytes with any artifact kept; {LABEL} is unchanged"


def test_a_pruned_bundle_is_written_and_reads_back(tmp_path: Path) -> None:
    """What ``prune`` keeps is written over the bundle (as the command does) and reads back as kept."""
    bundle = three(tmp_path)
    kept, _ = prune(bundle, LABEL, ["device=cpu"], None, 0, None)
    write_bundle(Bundle(bundle.path, kept))
    bundle.release()
    with read_manifest(tmp_path / LABEL) as again:
        assert envs(again.entries) == [GPU]
        assert list(again.members(again.entries[0]).contents()) == [FX2]
