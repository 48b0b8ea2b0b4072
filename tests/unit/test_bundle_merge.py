"""Merging bundle entries (``merge.py``): one entry per environment, the union of artifacts, what a write drops and
what it brings, each returned as a value."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_compilecache.bundle.binaries import CarriedBinaries, build_id
from pytest_compilecache.bundle.format import Bundle, BundleError, Entry, entry_of, members_of, read_manifest
from pytest_compilecache.bundle.keyindex import KeyIndex, artifact_id
from pytest_compilecache.bundle.members import Members
from pytest_compilecache.bundle.merge import combine, merge_input, merged, stamp, union, without_unused
from pytest_compilecache.bundle.writing import write_bundle

CPU = {"torch": "2.13.0+cpu", "device": "cpu"}
GPU = {"torch": "2.13.0+cu128", "device": "NVIDIA H200"}
FX1 = ("inductor", "f" + "1" * 30, b"graph one")
FX2 = ("inductor", "f" + "2" * 30, b"graph two")
AOT = ("aot_autograd", "a" + "3" * 30, b"aot three")


@pytest.fixture(autouse=True)
def _no_signing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests merge without the signing key (test_signing.py merges with it)."""
    monkeypatch.delenv("PYTEST_COMPILE_CACHE_KEY", raising=False)


def entry(env: dict[str, str], *artifacts: tuple[str, str, bytes], created: float = 0.0,
          index: KeyIndex | None = None, binaries: CarriedBinaries | None = None) -> Entry:
    return entry_of(env, Members.packed(artifacts), created, binaries, index)


def contents(e: Entry) -> set[tuple[str, str, bytes]]:
    return set(members_of(e, "test").contents())


def test_entries_of_one_environment_merge_into_their_union() -> None:
    """Two entries of one machine become one holding every artifact of both, an artifact both hold once."""
    (one,) = union([entry(CPU, FX1, AOT), entry(CPU, AOT, FX2)])
    assert one.env == CPU
    assert sorted(members_of(one, "test").contents()) == sorted([FX1, FX2, AOT])
    assert one.artifacts == {"inductor": {"count": 2, "bytes": 18}, "aot_autograd": {"count": 1, "bytes": 9}}


def test_one_key_with_two_contents_keeps_both_as_variants() -> None:
    """The same type and key with different content (two guard variants) are both kept."""
    variant = (FX1[0], FX1[1], b"graph one, other guards")
    (one,) = union([entry(CPU, FX1), entry(CPU, variant)])
    assert contents(one) == {FX1, variant}


def test_entries_of_other_environments_stay_apart_as_they_were() -> None:
    """An entry alone in its environment is passed through untouched (the same object, its bytes copied later)."""
    cpu, gpu = entry(CPU, FX1), entry(GPU, FX2)
    assert union([cpu, gpu]) == [cpu, gpu]
    assert union([cpu, gpu])[0] is cpu


def test_the_oldest_history_wins_and_its_tests_gain_the_others() -> None:
    """Merged history: the oldest entry's values; ``tests`` gains those it lacks, keeping its own figures."""
    old = entry(CPU, FX1, created=100.0)
    old.history = {"run": 1.0, "warmup_seconds": 3.0, "tests": {"t::a": 1.5}}
    new = entry(CPU, FX2, created=200.0)
    new.history = {"run": 2.0, "headers_seconds": 4.0, "tests": {"t::a": 9.0, "t::b": 2.5}}
    (one,) = union([new, old])
    assert one.created == 100.0
    assert one.history == {"run": 1.0, "warmup_seconds": 3.0, "headers_seconds": 4.0,
                           "tests": {"t::a": 1.5, "t::b": 2.5}}


@pytest.mark.parametrize("coordesc_first", [True, False])
def test_a_coordinate_descent_autotune_result_wins_in_either_order(coordesc_first: bool) -> None:
    """One autotune result per kernel: coordinate descent's over a heuristic one, whichever came first."""
    found = ("autotune", "triton_kernel", b'{"found_by_coordesc": true, "XBLOCK": 64}')
    guessed = ("autotune", "triton_kernel", b'{"XBLOCK": 128}')
    parts = [entry(CPU, found), entry(CPU, guessed)]
    (one,) = union(parts if coordesc_first else parts[::-1])
    assert contents(one) == {found}


def test_the_merged_key_index_holds_the_union_restricted_to_kept_keys() -> None:
    """Key indexes merge with the entries: keys of both (none an artifact left behind), the latest use of each."""
    first, second = KeyIndex(), KeyIndex()
    first.add(FX1[1], "inductor", "code", {"gm": ("1", "one")})
    first.add("f" + "9" * 30, "inductor", "code", {"gm": ("9", "no artifact")})
    second.add(FX2[1], "inductor", "code", {"gm": ("2", "two")})
    first.note_run(10.0, [artifact_id(*FX1[:2])])
    second.note_run(20.0, [artifact_id(*FX1[:2]), artifact_id(*FX2[:2])])
    (one,) = union([entry(CPU, FX1, index=first), entry(CPU, FX2, index=second)])
    assert one.index is not None
    assert sorted(one.index.keys) == sorted([FX1[1], FX2[1]])
    assert one.index.used == {artifact_id(*FX1[:2]): 20.0, artifact_id(*FX2[:2]): 20.0}
    assert one.index.runs == [10.0, 20.0]


def test_carried_binaries_of_both_entries_are_merged() -> None:
    """The merged entry carries the files of both entries, each under its build."""
    one_id, two_id = {"compiler": "g++ 12"}, {"compiler": "g++ 13"}
    first = CarriedBinaries({build_id(one_id): one_id})
    first.add(build_id(one_id), "ab/cone.main.so", b"one")
    second = CarriedBinaries({build_id(two_id): two_id})
    second.add(build_id(two_id), "cd/ctwo.main.so", b"two")
    (one,) = union([entry(CPU, FX1, binaries=first), entry(CPU, FX2, binaries=second)])
    assert one.binaries is not None
    assert {key: f.content() for key, f in one.binaries.files.items()} == {
        (build_id(one_id), "ab/cone.main.so"): b"one", (build_id(two_id), "cd/ctwo.main.so"): b"two"}
    assert one.binaries.builds == {build_id(one_id): one_id, build_id(two_id): two_id}


def test_a_key_that_could_write_outside_the_cache_folder_refuses_the_merge() -> None:
    """An artifact key that is a path out of the cache folder stops the merge, naming the inputs, the key and that
    the output is unchanged."""
    hostile = ("inductor", "../../.bashrc", b"x")
    with pytest.raises(BundleError) as exc:
        merged([entry(CPU, FX1), entry(CPU, hostile)], "a.bundle, b.bundle", "out.bundle")
    message = str(exc.value)
    assert message.startswith("a.bundle, b.bundle: cannot merge the entries for torch 2.13.0+cpu on cpu: ")
    assert "'../../.bashrc' could write outside the cache folder" in message
    assert message.endswith("; out.bundle is unchanged")


def test_bundles_read_from_files_merge_and_read_back(tmp_path: Path) -> None:
    """The merge command's path in-process: two bundles read whole, merged, written, and read back with the union
    for the shared environment and the other environment as it was."""
    write_bundle(Bundle(tmp_path / "a.bundle", [entry(CPU, FX1), entry(GPU, FX2)]))
    write_bundle(Bundle(tmp_path / "b.bundle", [entry(CPU, FX2, AOT)]))
    inputs: list[Entry] = []
    for name in ("a.bundle", "b.bundle"):
        with read_manifest(tmp_path / name) as bundle:
            inputs += merge_input(bundle)
    out = tmp_path / "out.bundle"
    write_bundle(Bundle(out, merged(inputs, "a.bundle, b.bundle", str(out))))
    with read_manifest(out) as bundle:
        assert [e.env for e in bundle.entries] == [CPU, GPU]
        assert set(bundle.members(bundle.entries[0]).contents()) == {FX1, FX2, AOT}
        assert set(bundle.members(bundle.entries[1]).contents()) == {FX2}


def read_whole(path: Path, *entries: Entry) -> Bundle:
    """``entries`` written to ``path`` and read whole, as an updating session reads its bundle before adding."""
    write_bundle(Bundle(path, list(entries)))
    bundle = read_manifest(path)
    bundle.read_all()
    return bundle


def test_combine_reports_nothing_new_where_the_bundle_holds_it_all(tmp_path: Path) -> None:
    """An addition whose artifacts the bundle holds already: ``new.nothing`` and no counts."""
    current = read_whole(tmp_path / "b.bundle", entry(CPU, FX1, FX2))
    result = combine(current, [entry(CPU, FX1)])
    assert result.new.nothing and result.new.counts == {}
    assert result.dropped == () and result.unused == {}
    assert contents(result.entries[0]) == {FX1, FX2}


def test_combine_counts_the_new_keys_an_addition_brings(tmp_path: Path) -> None:
    """New keys are counted by type; a new variant of a held key changes the bundle but counts no new key."""
    current = read_whole(tmp_path / "b.bundle", entry(CPU, FX1))
    variant = (FX1[0], FX1[1], b"variant")
    result = combine(current, [entry(CPU, variant, FX2, AOT)])
    assert not result.new.nothing
    assert result.new.counts == {"inductor": 1, "aot_autograd": 1}
    assert contents(result.entries[0]) == {FX1, variant, FX2, AOT}


def test_combine_counts_every_artifact_of_a_new_environment(tmp_path: Path) -> None:
    """An addition for an environment the bundle lacks is new as its manifest counts it, and added beside."""
    current = read_whole(tmp_path / "b.bundle", entry(CPU, FX1))
    result = combine(current, [entry(GPU, FX1, FX2, AOT)])
    assert result.new.counts == {"inductor": 2, "aot_autograd": 1}
    assert [e.env for e in result.entries] == [CPU, GPU]


def test_rebuild_replaces_what_the_bundle_held_for_that_environment(tmp_path: Path) -> None:
    """With ``rebuild``, the stored entry of the added environment goes (other environments stay)."""
    current = read_whole(tmp_path / "b.bundle", entry(CPU, FX1), entry(GPU, FX1))
    addition = entry(CPU, FX2)
    stamp([addition], {}, run=5.0)
    result = combine(current, [addition], run=5.0, rebuild=True)
    assert [(e.env, contents(e)) for e in result.entries] == [(GPU, {FX1}), (CPU, {FX2})]


def test_stamp_gives_the_session_history_and_notes_every_artifact_used() -> None:
    """``stamp``: the session's history with its run time, a creation time, and a key index recording that run
    used each artifact."""
    added = entry(CPU, FX1, AOT)
    added.created = 0.0
    stamp([added], {"built_compile_seconds": 2.0}, run=50.0)
    assert added.history == {"built_compile_seconds": 2.0, "run": 50.0}
    assert added.created > 0
    assert added.index is not None and added.index.whole_runs == [50.0]
    assert added.index.used == {artifact_id(*FX1[:2]): 50.0, artifact_id(*AOT[:2]): 50.0}


def test_combine_drops_artifacts_no_recent_whole_run_used(tmp_path: Path) -> None:
    """With ``max_unused_runs``, an artifact of the added environment none of the last N whole runs used goes:
    counted by type in ``unused``, and noted in the key index as dropped by that setting."""
    recorded = KeyIndex()
    for _, key, _ in (FX1, FX2):
        recorded.add(key, "inductor", "code", {"gm": (key, "graph")})
    held = entry(CPU, FX1, FX2, index=recorded)
    stamp([held], {}, run=1.0)
    current = read_whole(tmp_path / "b.bundle", held)
    addition = entry(CPU, FX2)
    stamp([addition], {}, run=2.0)
    result = combine(current, [addition], run=2.0, max_unused_runs=1)
    assert result.unused == {"inductor": 1}
    (one,) = result.entries
    assert contents(one) == {FX2}
    assert one.index is not None and one.index.dropped[FX1[1]][0].endswith("(compile_cache_max_unused_runs)")


def test_without_unused_leaves_an_entry_with_no_key_index_as_it_is() -> None:
    """Without a key index there is no record of use: the entry stays (the same object) and nothing is counted."""
    e = entry(CPU, FX1)
    assert without_unused([e], 1) == ([e], {})
