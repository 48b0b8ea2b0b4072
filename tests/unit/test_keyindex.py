"""The key index (``keyindex.py``): keys' components and usage records, packed as a head and groups, and read back."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest

from pytest_compilecache.bundle import keyindex
from pytest_compilecache.bundle.keyindex import (MAX_GRAPH_TEXT, MAX_RUNS, MAX_TEXT, KeyIndex, KeyIndexError,
                                                 artifact_id, binary_id)

FX_A, FX_B, AOT = "f" + "a" * 30, "f" + "b" * 30, "a" + "c" * 30
CONFIG = {"inductor_config[max_autotune]": ("h1", "False"), "functorch_config[x]": ("h2", "1")}


def index() -> KeyIndex:
    """Three keys of two layers and codes, one config set, two runs, a use and a drop."""
    made = KeyIndex(torch="2.13.0+cpu")
    made.add(FX_A, "inductor", "the MLP", {"gm": ("g1", "graph a"), **CONFIG})
    made.add(FX_B, "inductor", "the MLP", {"gm": ("g2", "graph b"), **CONFIG})
    made.add(AOT, "aot_autograd", "the Sequential module", {"aot_config": ("h3", "aot text"), **CONFIG})
    made.note_run(100.0, [artifact_id("inductor", FX_A)])
    made.note_run(200.0, [artifact_id("aot_autograd", AOT)], counted=False)
    made.dropped["f" + "d" * 30] = ("`prune --max-size`", 150.0)
    made.note_kernels(200.0, ["ab/cabc.main.so"])
    return made


def head_of(blob: bytes) -> dict[str, Any]:
    """The head of a packed index (its first zlib stream), as JSON."""
    head: dict[str, Any] = json.loads(zlib.decompressobj().decompress(blob))
    return head


def test_pack_and_unpack_round_trip_every_field() -> None:
    """An index packed and unpacked holds the same torch, config sets, keys and records, runs, uses and drops."""
    made = index()
    read = KeyIndex.unpack(made.pack())
    assert (read.torch, read.configs, read.runs, read.whole_runs, read.used, read.dropped, read.kernels_since) == (
        made.torch, made.configs, made.runs, made.whole_runs, made.used, made.dropped, made.kernels_since)
    assert {k: read.keys[k] for k in read.keys} == {k: made.keys[k] for k in made.keys}
    assert read.components(AOT) == {"aot_config": ("h3", "aot text"), **CONFIG}


def test_an_unpacked_index_packs_to_the_same_bytes() -> None:
    """Repacking an index read from a bundle copies each group as stored: the bytes are the same."""
    blob = index().pack()
    assert KeyIndex.unpack(blob).pack() == blob


def test_keys_are_grouped_by_layer_and_code() -> None:
    """The head lists one group per layer and code, holding its keys with their config set."""
    groups = head_of(index().pack())["groups"]
    assert [(layer, code, [k for k, _ in keys]) for layer, code, _, keys in groups] == [
        ("inductor", "the MLP", [FX_A, FX_B]), ("aot_autograd", "the Sequential module", [AOT])]


def test_a_config_set_shared_by_keys_is_stored_once() -> None:
    """Config components (``inductor_config[...]``, ``functorch_config[...]``) go to one set that the keys name."""
    made = index()
    (config_id,) = made.configs
    assert made.configs[config_id] == {name: list(pair) for name, pair in CONFIG.items()}
    assert {made.keys.about(k)[2] for k in made.keys} == {config_id}
    assert "inductor_config[max_autotune]" not in made.keys[FX_A]["components"]


def test_a_key_recorded_twice_keeps_its_first_components() -> None:
    """``add`` of a key already there changes nothing of it."""
    made = index()
    made.add(FX_A, "inductor", "another code", {"gm": ("changed", "changed")})
    assert made.components(FX_A)["gm"] == ("g1", "graph a")
    assert made.keys.about(FX_A)[:2] == ("inductor", "the MLP")


def test_a_key_saved_again_leaves_the_dropped_records() -> None:
    """A dropped key recorded anew is no longer named as dropped."""
    made = index()
    gone = "f" + "d" * 30
    made.add(gone, "inductor", "the MLP", {"gm": ("g", "back")})
    assert gone not in made.dropped and gone in made.keys


@pytest.mark.parametrize(("name", "limit"), [("gm", MAX_GRAPH_TEXT), ("aot_config", MAX_TEXT)])
def test_long_texts_are_cut_at_their_limit(name: str, limit: int) -> None:
    """A component's text is kept up to 2,000 characters (30,000 for the graph's code), then ``...``."""
    made = KeyIndex()
    made.add(FX_A, "inductor", "c", {name: ("h", "x" * (limit + 50))})
    assert made.components(FX_A)[name][1] == "x" * limit + "..."


def test_of_layer_and_of_code_list_keys_without_reading_their_groups() -> None:
    """Keys by layer and by code are known from the head alone: a stored group is not inflated for them."""
    read = KeyIndex.unpack(index().pack())
    assert read.of_layer("inductor") == [FX_A, FX_B] and read.of_layer("pgo") == []
    assert read.of_code("aot_autograd", "the Sequential module") == [AOT]
    assert all(group._parsed is None for group in read.keys._groups.values())


def test_runs_are_capped_at_the_most_recent() -> None:
    """Only the last 200 runs are remembered."""
    made = KeyIndex()
    for when in range(MAX_RUNS + 5, 0, -1):
        made.note_run(float(when), [])
    assert len(made.runs) == MAX_RUNS and made.runs[0] == 6.0 and made.runs[-1] == MAX_RUNS + 5


def test_unused_for_counts_only_whole_runs() -> None:
    """An artifact none of the last N whole runs used is unused; one with no record counts as used at the first run;
    with fewer whole runs than N, nothing is unused."""
    made = KeyIndex()
    made.note_run(1.0, ["inductor/old", "inductor/kept"])
    made.note_run(2.0, ["inductor/kept"])
    made.note_run(3.0, ["inductor/kept"], counted=False)
    names = ["inductor/old", "inductor/kept", "inductor/unrecorded"]
    assert made.unused_for(1, names) == {"inductor/old", "inductor/unrecorded"}
    assert made.unused_for(2, names) == set()
    assert made.unused_for(3, names) == set()


def test_unused_kernels_need_every_run_in_the_window_to_have_recorded_its_asks() -> None:
    """No C++ kernel is judged unused over a window of runs that begins before kernels were recorded."""
    made = KeyIndex()
    made.note_run(1.0, [])
    made.note_run(2.0, [])
    made.note_kernels(2.0, ["ab/cused.main.so"])
    kernels = [binary_id("ab/cused.main.so"), binary_id("cd/cstale.main.so")]
    assert made.unused_kernels(2, kernels) == set()
    assert made.unused_kernels(1, kernels) == {"cpp/cstale"}


@pytest.mark.parametrize(("path", "name"), [("ab/cabc.main.so", "cpp/cabc"), ("ab/cabc.cpp", "cpp/cabc"),
                                            ("cabc", "cpp/cabc")])
def test_a_carried_kernel_is_named_by_its_key(path: str, name: str) -> None:
    """A C++ kernel's files (and the kernel's own key) are named ``cpp/<key>`` in usage records."""
    assert binary_id(path) == name


def test_restricted_keeps_only_the_given_keys_and_notes_the_others_dropped() -> None:
    """A restriction keeps the keys asked for, their config sets and usage (and every C++ kernel's use), and
    records the rest as dropped, by what and when."""
    made = index()
    kept = made.restricted({FX_A}, "`prune --max-size`", 300.0)
    assert list(kept.keys) == [FX_A] and kept.configs == made.configs
    assert kept.used == {"inductor/" + FX_A: 100.0, "cpp/cabc": 200.0}
    assert kept.dropped == {FX_B: ("`prune --max-size`", 300.0), AOT: ("`prune --max-size`", 300.0),
                            "f" + "d" * 30: ("`prune --max-size`", 150.0)}


def test_a_restricted_index_repacks_only_its_keys() -> None:
    """A rewrite keeping part of a stored group compresses that group again with the kept keys only."""
    read = KeyIndex.unpack(index().pack())
    again = KeyIndex.unpack(read.restricted({FX_B, AOT}).pack())
    assert sorted(again.keys) == sorted([FX_B, AOT])
    assert again.components(FX_B)["gm"] == ("g2", "graph b")


def test_union_lets_earlier_parts_win_and_keeps_the_latest_use() -> None:
    """A key in two parts keeps the first part's record; uses take the latest time; a key held is not dropped."""
    first, second = KeyIndex(torch="2.13"), KeyIndex(torch="2.11")
    first.add(FX_A, "inductor", "first", {"gm": ("1", "first")})
    second.add(FX_A, "inductor", "second", {"gm": ("2", "second")})
    second.add(FX_B, "inductor", "second", {"gm": ("3", "b")})
    first.note_run(10.0, ["inductor/" + FX_A])
    second.note_run(20.0, ["inductor/" + FX_A])
    second.dropped[FX_A] = ("why", 15.0)
    both = KeyIndex.union([first, second])
    assert both.torch == "2.13" and both.components(FX_A)["gm"] == ("1", "first")
    assert sorted(both.keys) == sorted([FX_A, FX_B])
    assert both.runs == [10.0, 20.0] and both.used == {"inductor/" + FX_A: 20.0}
    assert both.dropped == {}


def test_an_empty_index_is_false_and_a_recorded_run_makes_it_true() -> None:
    """An index with no keys, runs or uses is falsy: an entry then carries none."""
    made = KeyIndex(torch="2.13")
    assert not made
    made.note_run(1.0, [])
    assert made


def compressed(data: object) -> bytes:
    return zlib.compress(json.dumps(data).encode())


def head(**fields: object) -> bytes:
    return compressed({"format": 2, "dictionary": 0, **fields})


@pytest.mark.parametrize(("blob", "reason"), [
    (b"not an index", "the key index is not valid compressed JSON"),
    (compressed([2]), "the key index has an unknown format ([2])"),
    (compressed({"format": 3}), "the key index has an unknown format (3)"),
    (compressed({"format": True}), "the key index has an unknown format (True)"),
    (head()[:-4], "the key index is not valid compressed JSON (cut short)"),
    (head() + b"trailing bytes", "the groups do not add up to the bytes that follow the head"),
    (head(groups=[["inductor", "c", True, []]]), "a group must be [layer, code, size, keys]"),
    (head(groups=[["inductor", "c", 1, [["k"]]]]) + b"x", "a group's key must be [key, config]"),
    (head(runs=["yesterday"]), "expected a number, got 'yesterday'"),
    (head(runs=[1e999]), "expected a finite number"),
    (head(used={"inductor/x": None}), "expected a number, got None"),
    (head(dropped={"k": ["why"]}), "a dropped key must be [why, when]"),
    (head(configs={"c": {"inductor_config[x]": ["only hash"]}}), "must be [hash, text]"),
], ids=["not zlib", "a list", "later format", "format true", "cut short", "trailing bytes", "group size a boolean",
        "group key pair", "run a string", "run infinite",
        "use not a number", "drop not a pair", "component not a pair"])
def test_a_malformed_index_is_refused_with_the_reason(blob: bytes, reason: str) -> None:
    """Whatever is wrong with the head is a :class:`KeyIndexError` saying what (never a TypeError from inside)."""
    with pytest.raises(KeyIndexError) as exc:
        KeyIndex.unpack(blob)
    assert reason in str(exc.value)


def test_an_index_past_the_unpacking_cap_is_not_inflated(monkeypatch: pytest.MonkeyPatch) -> None:
    """An index inflating past the cap (256 MB; made small here) is refused, not inflated."""
    monkeypatch.setattr(keyindex, "MAX_UNPACKED", 32)
    with pytest.raises(KeyIndexError, match="larger than 32 bytes unpacked"):
        KeyIndex.unpack(index().pack())


def with_bad_group() -> tuple[KeyIndex, KeyIndex]:
    """:func:`index` packed, and packed again with its first group's bytes (``the MLP``'s) replaced by garbage."""
    made = index()
    listing, blobs = made.keys.packed()
    listing[0][2] = len(b"garbage")
    data = head_of(made.pack())
    data["groups"] = listing
    return KeyIndex.unpack(made.pack()), KeyIndex.unpack(compressed(data) + b"garbage" + blobs[1])


def test_a_malformed_group_costs_only_its_own_keys() -> None:
    """A group that does not inflate: the head unpacks, its keys are listed, their components raise naming the
    group's code, and the other groups' keys read."""
    good, read = with_bad_group()
    assert sorted(read.keys) == sorted(good.keys)
    with pytest.raises(KeyIndexError, match="^the key details of 'the MLP' are not valid compressed JSON$"):
        read.components(FX_A)
    assert read.components(AOT) == good.components(AOT)


def test_a_rewrite_copies_a_whole_bad_group_and_drops_one_it_must_recompress() -> None:
    """A group kept whole is copied as stored, unread (still listed); one kept in part must be read to be
    compressed again, and where it cannot be, it is left out with its keys."""
    _, read = with_bad_group()
    assert sorted(KeyIndex.unpack(read.pack()).keys) == sorted(read.keys)
    assert list(KeyIndex.unpack(read.restricted({FX_A, AOT}).pack()).keys) == [AOT]


def test_a_group_lacking_a_key_it_lists_is_named() -> None:
    """A group whose listing names a key its details do not hold: asking for that key says so."""
    group = zlib.compress(json.dumps({FX_B: {"gm": ["g", "t"]}}).encode())
    blob = head(groups=[["inductor", "the MLP", len(group), [[FX_A, "c"], [FX_B, "c"]]]]) + group
    read = KeyIndex.unpack(blob)
    assert read.components(FX_B) == {"gm": ("g", "t")}
    with pytest.raises(KeyIndexError, match="lack a key they list"):
        read.components(FX_A)


def dictionary_form() -> bytes:
    """An index as earlier versions wrote it: the head, a compressed preset dictionary (component names and texts
    that recur from key to key), then each group compressed against that dictionary."""
    preset = b'{"gm":["","def forward(self, x):"],"aot_config":["","AOTConfig("]}' * 3
    details = {FX_A: {"gm": ["g1", "def forward(self, x): return x.sin()"]},
               FX_B: {"gm": ["g2", "def forward(self, x): return x.cos()"]}}
    deflater = zlib.compressobj(zdict=preset)
    group = deflater.compress(json.dumps(details).encode()) + deflater.flush()
    stored = zlib.compress(preset)
    top = head(torch="2.11.0+cpu", configs={"cfg": {"inductor_config[x]": ["h", "1"]}}, dictionary=len(stored),
               groups=[["inductor", "the MLP", len(group), [[FX_A, "cfg"], [FX_B, "cfg"]]]], runs=[5.0],
               used={"inductor/" + FX_A: 5.0})
    return top + stored + group


def test_the_preset_dictionary_form_of_older_versions_is_refused() -> None:
    """An index whose groups are compressed against a preset dictionary is no longer read: it is refused as a
    malformed one is (the bundle loads, only explanations are lost), saying it was written by an older version."""
    with pytest.raises(KeyIndexError, match="^written by an older version; `--compile-cache-rebuild` writes it anew$"):
        KeyIndex.unpack(dictionary_form())
