"""Explained misses: each kind of key difference this machine can produce, through real compiles
against a real bundle, and the reasoning on its own (no torch) for the cases a machine cannot stage."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
from pathlib import Path
from typing import Callable

import pytest

from pytest_compilecache.bundle.format import Bundle, parse, read_manifest
from pytest_compilecache.bundle.writing import write_bundle
from pytest_compilecache.explain import Known, explain
from pytest_compilecache.bundle.keyindex import KeyIndex

FNS = '''
import torch

MODE = "a"

def f_config(x): return torch.sin(x) * 2 + 1
def f_shape(x): return torch.cos(x) - 1
def f_dtype(x): return torch.tanh(x) * 3
def f_stride(x): return (x * 2).relu() + 1
def f_graph(x): return torch.exp(x) + 1 if MODE == "a" else torch.exp(x) - x
def f_tag(x): return torch.sigmoid(x) + 4
def f_hit(x): return torch.erf(x) + 5

def run(f, x):
    with torch.no_grad():
        return torch.compile(f, dynamic=False)(x)

def warm_all():
    for f in (f_config, f_shape, f_dtype, f_graph, f_tag, f_hit):
        run(f, torch.randn(8))
    run(f_stride, torch.randn(8, 8))
'''

CONFTEST = '''
import pytest

@pytest.hookimpl(optionalhook=True)
def pytest_compilecache_warmup(cache):
    import fns
    fns.warm_all()
'''

TESTS = '''
import torch
import fns
from torch._inductor import config

def only_fx(cache):
    cache.assert_misses(fx_graph=1)
    (why,) = cache.stats.fx_graph.explanations
    print(why)
    return why

def test_config(warm_cache):
    with warm_cache.not_saved(), config.patch(max_fusion_size=32):
        fns.run(fns.f_config, torch.randn(8))
    why = only_fx(warm_cache)
    assert "FX graph miss in f_config (fns.py)" in why
    assert "config `max_fusion_size` changed (was 64, now 32)" in why

def test_shape(warm_cache):
    with warm_cache.not_saved():
        fns.run(fns.f_shape, torch.randn(9))
    assert "input 0 shape [8] -> [9]" in only_fx(warm_cache)

def test_dtype(warm_cache):
    with warm_cache.not_saved():
        fns.run(fns.f_dtype, torch.randn(8, dtype=torch.float64))
    assert "input 0 dtype torch.float32 -> torch.float64" in only_fx(warm_cache)

def test_stride(warm_cache):
    with warm_cache.not_saved():
        fns.run(fns.f_stride, torch.randn(8, 8).t())
    assert "input 0 stride (8, 1) -> (1, 8)" in only_fx(warm_cache)

def test_graph(warm_cache):
    fns.MODE = "b"
    try:
        with warm_cache.not_saved():
            fns.run(fns.f_graph, torch.randn(8))
    finally:
        fns.MODE = "a"
    why = only_fx(warm_cache)
    assert "the graph changed (only in the entry: `add" in why and "only now: `sub" in why, why

def test_tag(warm_cache):
    with warm_cache.not_saved(), torch.compiler.config.patch(cache_key_tag="another-tag"):
        fns.run(fns.f_tag, torch.randn(8))
    assert "cache_key_tag changed (was '', now 'another-tag')" in only_fx(warm_cache)

def test_hit(warm_cache):
    fns.run(fns.f_hit, torch.randn(8))
    warm_cache.assert_hits(fx_graph=1)
    assert warm_cache.stats.fx_graph.explanations == ()
    assert warm_cache.stats.aot_autograd.explanations == ()

def test_new_code(warm_cache):
    with warm_cache.not_saved():
        fns.run(lambda x: x.abs() + 7, torch.randn(8))
    assert "no entry for this code at all (new code)" in only_fx(warm_cache)
'''


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(fns=FNS, test_kinds=TESTS)
    pytester.makeconftest(CONFTEST)
    return pytester


@pytest.mark.slow
@pytest.mark.compat
def test_each_kind_of_difference_is_named(project: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]) -> None:
    bundle = project.path / "kinds.bundle"
    report = project.path / "report.json"
    args = (f"--compile-cache-bundle={bundle}", f"--compile-cache-report={report}", "-p", "no:randomly")
    run_inner(*args, "-k", "hit").assert_outcomes(passed=1)
    warm = run_inner(*args)
    warm.assert_outcomes(passed=8)
    warm.stdout.fnmatch_lines([
        "misses explained:",
        "*fx_graph: 7 misses explained:*",
    ])
    summary = next(line for line in warm.stdout.lines if "fx_graph: 7 misses explained" in line)
    for kind in ("config `max_fusion_size` changed", "input shapes changed", "input dtypes changed",
                 "input strides changed", "graph changed", "cache_key_tag changed", "new code"):
        assert kind in summary, summary
    # Every miss of the warm run is inside a not_saved() block: by design, so no advice to update the bundle.
    warm.stdout.fnmatch_lines(["*misses in not_saved() blocks (left out of the bundle on purpose), of all misses: fx_graph 7 of 7*"])
    assert "add --compile-cache-update" not in warm.stdout.str()
    warm.stdout.fnmatch_lines(["*every compile outside cold_cache tests and not_saved() blocks hit: nothing to add to it*"])
    tests = json.loads(report.read_text())["tests"]
    assert tests["test_kinds.py::test_config"]["misses_not_saved"]["fx_graph"] == 1
    assert "misses_not_saved" not in tests["test_kinds.py::test_hit"]
    config = tests["test_kinds.py::test_config"]["fx_graph"]
    assert config["explained"] == 1 and config["miss_kinds"] == {"config `max_fusion_size` changed": 1}
    assert "explanations" not in tests["test_kinds.py::test_hit"]["fx_graph"]
    aot = tests["test_kinds.py::test_shape"]["aot_autograd"]["explanations"]
    assert len(aot) == 1 and "AOTAutograd miss in f_shape (fns.py)" in aot[0] and "shape [8] -> [9]" in aot[0]

    with read_manifest(bundle) as b:
        b.read_all()
        (entry,) = b.entries
        index, problem = b.key_index(entry)
    assert not problem and index is not None
    assert {r["code"] for r in index.keys.values()} >= {"f_config (fns.py)", "f_stride (fns.py)", "f_hit (fns.py)"}
    assert len(index.configs) == 2, "the FX keys share one config set, the AOTAutograd keys (functorch's too) another"

    index.torch = "2.9.0+cpu"
    entry.reset_index()
    write_bundle(Bundle(bundle, [entry]))
    other = run_inner(*args, "-k", "config")
    other.assert_outcomes(failed=1)
    other.stdout.fnmatch_lines(["*cannot explain: the bundle's key details were recorded by torch 2.9.0+cpu, not *"])

    entry.index, entry.index_section, entry._index_blob = None, None, None
    write_bundle(Bundle(bundle, [entry]))
    old = run_inner(*args, "-k", "config")
    old.assert_outcomes(failed=1)
    old.stdout.fnmatch_lines(["*cannot explain: the bundle holds no key details for this entry*"])

    # A key index is unpacked when a miss first needs it, not at the session's start (0.17 s for a GPU
    # suite's): a malformed one is said once, then, and its entry's artifacts still load and hit.
    entry.index, entry.index_section, entry._index_blob = None, None, b"not a key index"
    write_bundle(Bundle(bundle, [entry]))
    malformed = run_inner(*args, "-k", "config or hit")
    malformed.assert_outcomes(passed=1, failed=1)
    malformed.stdout.fnmatch_lines(["*cannot explain: the bundle's key details are unusable (see the bundle's problems)*"])
    said = [line for line in malformed.stdout.lines if "is unusable (the key index is not valid compressed JSON)" in line]
    assert len(said) == 1 and str(bundle) in said[0], malformed.stdout.str()
    hits = run_inner(*args, "-k", "hit")
    hits.assert_outcomes(passed=1)
    assert "the key index" not in hits.stdout.str(), "no miss asked for it: it was never unpacked"
    strict = run_inner(*args, "-k", "hit", "--compile-cache-strict")
    assert strict.ret != 0, "--compile-cache-strict checks the whole bundle before the first test"
    strict.stderr.fnmatch_lines(["*--compile-cache-strict: bundle problem at session start:*",
                                 "*the key index * is unusable (the key index is not valid compressed JSON)*"])

    # An entry read from other bytes than a file (as from an object store) keeps its index as stored, damage and all.
    data = bytearray(bundle.read_bytes())
    data[-1] ^= 0xFF  # the key index is the entry's last section
    downloaded = parse(io.BytesIO(bytes(data)), bundle)
    (entry,) = downloaded.entries
    downloaded.read_key_index(entry)
    downloaded.close()
    index, problem = downloaded.key_index(entry)
    assert index is None and "fails its checksum" in problem, problem


@pytest.mark.slow
def test_explain_on_request_in_a_cold_test(pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]) -> None:
    """--compile-cache-explain: a cold_cache test's miss is explained against what it compiled before,
    and so is a plain test's (session-wide)."""
    pytester.makepyfile(fns=FNS, test_cold='''
import torch, fns
from torch._inductor import config

def test_cold(cold_cache):
    fns.run(fns.f_config, torch.randn(8))
    cold_cache.reset_in_memory()
    with config.patch(max_fusion_size=16):
        fns.run(fns.f_config, torch.randn(8))
    (first, second) = cold_cache.stats.fx_graph.explanations
    # A newcomer read "new code" about code they had not changed: the cache starts empty by design.
    assert "new code" not in first and "this cache starts empty by design" in first, first
    assert "no compile before it in this session was of this code" in first, first
    assert "nearest entry in this session's earlier compiles" in second
    assert "config `max_fusion_size` changed (was 64, now 16)" in second

def test_plain():
    import torch._dynamo
    fns.run(fns.f_shape, torch.randn(8))
    torch._dynamo.reset()
    fns.run(fns.f_shape, torch.randn(4))
''')
    report = pytester.path / "r.json"
    run_inner("--compile-cache-explain", f"--compile-cache-report={report}", "-p", "no:xdist").assert_outcomes(passed=2)
    plain = json.loads(report.read_text())["tests"]["test_cold.py::test_plain"]["fx_graph"]
    assert any("input 0 shape [8] -> [4]" in text for text in plain["explanations"]), plain


def _index(**records: tuple[str, str, dict[str, tuple[str, str]]]) -> KeyIndex:
    index = KeyIndex(torch="2.13.0+cpu")
    for key, (layer, code, components) in records.items():
        index.add(key, layer, code, components)
    return index


BASE = {
    "gm": ("g1", "GraphModule()\\n\\ndef forward(self, x):\\n    sin = torch.ops.aten.sin.default(x);  x = None\\n"),
    "example_inputs[0]": ("i1", "TensorMetadata(dtype=torch.float32, shape=torch.Size([8]), stride=(1,), "
                                "device=device(type='cpu'), layout=torch.strided)"),
    "inductor_config[fallback_random]": ("c1", "False"),
    "torch_version": ("t1", "\x00binary"),
    "system_info[hash]": ("s1", "abc"),
}


def test_explanations_for_what_a_cpu_machine_cannot_stage() -> None:
    bundle = Known("the bundle b", _index(fold=("fx_graph", "f (x.py)", BASE)), fills=True)
    torch_changed = {**BASE, "torch_version": ("t2", "\x00other"), "system_info[hash]": ("s2", "def")}
    why = explain("fx_graph", "fnew", "f (x.py)", torch_changed, [bundle])
    assert "the torch build differs" in why.text and "torch, Triton, CUDA or GPU versions differ" in why.text
    assert set(why.kinds) == {"torch build changed", "torch/Triton/CUDA/GPU version changed"}

    device = {**BASE, "example_inputs[0]": ("i2", BASE["example_inputs[0]"][1].replace("'cpu'", "'cuda', index=0"))}
    assert "input 0 device" in explain("fx_graph", "fnew", "f (x.py)", device, [bundle]).text

    same_key = explain("fx_graph", "fold", "f (x.py)", BASE, [bundle])
    assert "holds an entry with this very key" in same_key.text
    damaged = explain("fx_graph", "fold", "f (x.py)", BASE, [dataclasses.replace(bundle, damaged=frozenset({"fold"}))])
    assert "holds this very entry, but damaged" in damaged.text and damaged.kinds == ("entry damaged in the bundle",)

    session = Known("this session's earlier compiles", _index(fold=("fx_graph", "f (x.py)", BASE)))
    assert "very key" not in explain("fx_graph", "fold", "f (x.py)", BASE, [session]).text, \
        "only a source that filled the folder can be missing the very key"
    other_code = {**BASE, "gm": ("g9", "GraphModule()\\n\\ndef forward(self, x):\\n    cos = torch.ops.aten.cos.default(x)\\n")}
    renamed = explain("fx_graph", "fnew", "f (x.py)", other_code, [bundle])
    assert "new code" in renamed.text, "a graph sharing no node with the entries of its name is new code"
    assert "the bundle b holds none: an updating run (--compile-cache-update" in renamed.text

    blind = Known("the bundle b", KeyIndex(), undocumented=3)
    assert "cannot explain" in explain("fx_graph", "fnew", "f (x.py)", BASE, [blind]).text
    nothing = explain("fx_graph", "fnew", "f (x.py)", BASE, [], cannot="the bundle holds no key details")
    assert nothing.text.endswith("cannot explain: the bundle holds no key details")


def test_a_malformed_key_index_loses_explanations_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key index that fails its checksum: the entry still reads, the problem is said, nothing
    crashes, and a signed entry keeps its valid signature through a rewrite (the index is copied as it is)."""
    from pytest_compilecache.bundle import signing
    from pytest_compilecache.bundle.format import make_entry

    monkeypatch.setenv(signing.KEY_ENV, "right")
    path = tmp_path / "x.bundle"
    index = _index(fold=("fx_graph", "f (x.py)", BASE))
    write_bundle(Bundle(path, [make_entry({"torch": "t"}, b"payload", {}, index=index)]))
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with read_manifest(path) as b:
        b.read_all()
        entry = b.entries[0]
        assert b.payload(entry) == b"payload"
        found, problem = b.key_index(entry)
        assert b.signature_problem(entry, b"right") == ""
    assert found is None and "fails its checksum" in problem and str(path) in problem
    copy = tmp_path / "copy.bundle"
    write_bundle(Bundle(copy, b.entries))
    with read_manifest(copy) as c:
        assert c.signature_problem(c.entries[0], b"right") == "", "the rewrite keeps the signature valid"
        assert "fails its checksum" in c.key_index(c.entries[0])[1]
    round_trip = KeyIndex.unpack(index.pack())
    assert round_trip.components("fold") == index.components("fold")
    shutil.rmtree(tmp_path)


def test_a_static_compile_against_a_dynamic_entry_says_so_in_the_users_words() -> None:
    """The warmup recompiled the code with symbolic sizes; this test compiled static ones (real key formats)."""
    def tensor(shape: str) -> str:
        return (f"TensorMetadata(dtype=torch.float32, shape=torch.Size([{shape}]), stride=(32, 1), "
                "device=device(type='cpu'), layout=torch.strided)")

    static = {"gm": ("g1", "GraphModule()\\n\\ndef forward(self, w, b, x):\\n    linear = torch._C._nn.linear(x, w, b)\\n"),
              "example_inputs[0]": ("w", tensor("32, 32")), "example_inputs[1]": ("b", tensor("32")),
              "example_inputs[2]": ("x1", tensor("4, 32")), "aot_config": ("a1", "(0, True, False)"),
              "inductor_config[fallback_random]": ("c1", "False")}
    dynamic = {"gm": ("g2", "GraphModule()\\n\\ndef forward(self, w, b, s33, x):\\n    linear = torch._C._nn.linear(x, w, b)\\n"),
               "example_inputs[0]": ("w", tensor("32, 32")), "example_inputs[1]": ("b", tensor("32")),
               "example_inputs[2]": ("s", "('s33',)"), "example_inputs[3]": ("x2", tensor("s33, 32")),
               "aot_config": ("a2", "(0, True, True)"), "inductor_config[fallback_random]": ("c1", "False")}
    bundle = Known("the bundle b", _index(kdyn=("fx_graph", "the Sequential module", dynamic)), fills=True)
    why = explain("fx_graph", "knew", "the Sequential module", static, [bundle])
    assert "the entry has dynamic (symbolic) sizes and this compile static ones" in why.text, why.text
    assert "mark the dimension dynamic" in why.text and "a code object of its own" in why.text
    assert "inputs" not in why.kinds and "graph changed" not in why.kinds and why.kinds == ("static sizes, the entry dynamic",)

    changed = {**static, "inductor_config[fallback_random]": ("c2", "True")}
    both = explain("fx_graph", "knew", "the Sequential module", changed, [bundle])
    assert "config `fallback_random` changed" in both.text, "other differences are still named"

    session = Known("this session's earlier compiles", _index(kstatic=("fx_graph", "the Sequential module", static)))
    reverse = explain("fx_graph", "knew", "the Sequential module", dynamic, [session])
    assert reverse.kinds == ("dynamic sizes, the entry static",), reverse.text


def test_a_static_compile_of_a_shape_only_a_dynamic_entry_covers_names_the_dynamic_entry() -> None:
    """The warmup compiled (8, 16), then (8, 24), which Dynamo recompiled with symbolic sizes; a test
    compiling (8, 24) alone gets a static graph. The static (8, 16) entry is one shape away, but the
    entry made for this very shape is the dynamic one: say that, not only the shape."""
    def tensor(shape: str) -> str:
        return (f"TensorMetadata(dtype=torch.float32, shape=torch.Size([{shape}]), stride=(16, 1), "
                "device=device(type='cpu'), layout=torch.strided)")

    graph = "GraphModule()\\n\\ndef forward(self, x):\\n    sin = torch.ops.aten.sin.default(x)\\n"
    first = {"gm": ("g1", graph), "example_inputs[0]": ("x1", tensor("8, 16")), "aot_config": ("a1", "(0, True, False)")}
    dynamic = {"gm": ("g2", graph.replace("self, x", "self, s0, x")), "example_inputs[0]": ("s", "('s0',)"),
               "example_inputs[1]": ("x2", tensor("8, s0")), "aot_config": ("a2", "(0, True, True)")}
    ours = {"gm": ("g1", graph), "example_inputs[0]": ("x3", tensor("8, 24")), "aot_config": ("a1", "(0, True, False)")}
    bundle = Known("the bundle b", _index(kfirst=("fx_graph", "h (t.py)", first),
                                          kdyn=("fx_graph", "h (t.py)", dynamic)), fills=True)
    why = explain("fx_graph", "knew", "h (t.py)", ours, [bundle])
    assert "the entry has dynamic (symbolic) sizes and this compile static ones" in why.text, why.text
    assert why.kinds == ("static sizes, the entry dynamic",), why.text

    only_static = Known("the bundle b", _index(kfirst=("fx_graph", "h (t.py)", first)), fills=True)
    assert "input 0 shape" in explain("fx_graph", "knew", "h (t.py)", ours, [only_static]).text

    # A static entry for this very shape that differs in one config value is nearer than the dynamic one.
    config = {**ours, "inductor_config[max_fusion_size]": ("m1", "32")}
    configured = Known("the bundle b", _index(kconf=("fx_graph", "h (t.py)", config),
                                              kdyn=("fx_graph", "h (t.py)", dynamic)), fills=True)
    assert "config `max_fusion_size` changed" in explain("fx_graph", "knew", "h (t.py)", ours, [configured]).text

    # Inputs are said as one reason, but an entry differing in one input is nearer than one differing in three.
    three = {"gm": ("g3", graph.replace("self, x", "self, x, y, z")),
             **{f"example_inputs[{i}]": (f"a{i}", tensor("8, 16")) for i in range(3)}}
    far = {**three, **{f"example_inputs[{i}]": (f"b{i}", tensor("4, 16")) for i in range(3)}}
    near = {**three, "example_inputs[0]": ("b0", tensor("4, 16"))}
    both = Known("the bundle b", _index(kfar=("fx_graph", "h (t.py)", far), knear=("fx_graph", "h (t.py)", near)))
    assert "(knear...)" in explain("fx_graph", "knew", "h (t.py)", three, [both]).text


def test_a_miss_in_an_empty_cache_of_a_key_known_elsewhere_is_by_design() -> None:
    bundle = Known("the bundle b", _index(fold=("fx_graph", "f (x.py)", BASE)), fills=False)
    why = explain("fx_graph", "fold", "f (x.py)", BASE, [bundle], starts_empty=True)
    assert why.kinds == ("cache starts empty",) and "the bundle b holds this very entry" in why.text, why.text
    assert "new code" not in why.text


def test_a_dropped_key_is_remembered_until_an_updating_run_saves_it_again() -> None:
    """``prune --max-size`` and ``compile_cache_max_unused_runs`` narrow the index with the artifacts;
    the keys they drop stay named, so that a later miss is the drop, not "new code"."""
    other = {**BASE, "gm": ("g2", "GraphModule()\\n\\ndef forward(self, x):\\n    cos = torch.ops.aten.cos.default(x)\\n")}
    full = _index(fold=("fx_graph", "f (x.py)", BASE), fnew=("fx_graph", "f (x.py)", other))
    pruned = KeyIndex.unpack(full.restricted({"fnew"}, "`prune --max-size`", 1_790_000_000.0).pack())
    assert set(pruned.keys) == {"fnew"} and pruned.dropped == {"fold": ("`prune --max-size`", 1_790_000_000.0)}
    why = explain("fx_graph", "fold", "f (x.py)", BASE, [Known("the bundle b", pruned, fills=True)])
    assert why.kinds == ("dropped from the bundle",), why.text
    assert "the bundle b held this very entry until `prune --max-size` dropped it (2026-09-21)" in why.text
    assert "--compile-cache-update" in why.text and "new code" not in why.text
    cold = explain("fx_graph", "fold", "f (x.py)", BASE, [Known("the bundle b", pruned)], starts_empty=True)
    assert "dropped" not in cold.text and cold.kinds == ("cache starts empty",), cold.text

    again = _index(fold=("fx_graph", "f (x.py)", BASE))
    assert KeyIndex.union([pruned, again]).dropped == {}, "an updating run that saved it again forgets the drop"
    assert KeyIndex.union([pruned]).restricted({"fnew"}).dropped == pruned.dropped, "kept through later writes"


def test_the_key_index_is_read_by_group_and_a_rewrite_copies_the_groups_it_keeps_as_stored() -> None:
    """Format 2 of the key index: its head read at once, each group (one layer and code) when one of its keys is
    asked for; a damaged group costs only the explanations of its code; a rewrite keeping a group whole copies it as
    stored; an index whose groups were compressed against a preset dictionary (as earlier versions wrote) is
    refused."""
    import zlib

    from pytest_compilecache.bundle.keyindex import KeyIndexError

    graph = {**BASE, "gm": ("g2", BASE["gm"][1].replace("sin", "cos"))}
    made = _index(fa=("fx_graph", "f (x.py)", BASE), fb=("fx_graph", "f (x.py)", graph),
                  ga=("fx_graph", "g (x.py)", BASE), aa=("aot_autograd", "f (x.py)", BASE))
    made.note_run(1.0, ["inductor/fa"])
    blob = made.pack()
    index = KeyIndex.unpack(blob)
    assert index.of_code("fx_graph", "f (x.py)") == ["fa", "fb"] and index.of_layer("aot_autograd") == ["aa"]
    assert {k: index.components(k) for k in index.keys} == {k: made.components(k) for k in made.keys}
    assert index.used == {"inductor/fa": 1.0} and KeyIndex.unpack(index.pack()).pack() == blob

    g_group = next(g for g in index.keys._groups.values() if g.code == "g (x.py)")
    at = blob.index(g_group.stored)
    damaged = KeyIndex.unpack(blob[:at + 2] + bytes([blob[at + 2] ^ 0xFF]) + blob[at + 3:])
    assert damaged.components("fa") == made.components("fa"), "the other groups read"
    with pytest.raises(KeyIndexError, match=r"key details of 'g \(x.py\)'"):
        damaged.components("ga")
    why = explain("fx_graph", "gnew", "g (x.py)", BASE, [Known("the bundle b", damaged, fills=True)])
    assert why.kinds == ("cannot explain",) and "the bundle b: the key details of 'g (x.py)'" in why.text
    assert "differs" in explain("fx_graph", "fnew", "f (x.py)", BASE, [Known("the bundle b", damaged)]).text

    kept = damaged.restricted(["fa", "fb", "aa"])
    rewritten = kept.pack()
    f_group = next(g for g in index.keys._groups.values() if g.code == "f (x.py)" and g.layer == "fx_graph")
    assert f_group.stored in rewritten, "a group kept whole is copied as stored"
    again = KeyIndex.unpack(rewritten)
    assert sorted(again.keys) == ["aa", "fa", "fb"] and again.components("fb") == made.components("fb")
    cut = KeyIndex.unpack(damaged.restricted(["fa"]).pack())
    assert list(cut.keys) == ["fa"] and cut.components("fa") == made.components("fa"), "a group cut is packed again"

    other = _index(hb=("fx_graph", "h (y.py)", {**BASE, "gm": ("g3", "GraphModule()\\n    t = torch.tan(x)\\n")}))
    other.add("hc", "aot_autograd", "h (y.py)", BASE)
    joined = KeyIndex.unpack(KeyIndex.union([index, KeyIndex.unpack(other.pack())]).pack())
    assert sorted(joined.keys) == ["aa", "fa", "fb", "ga", "hb", "hc"], "two indexes joined"
    assert {k: joined.components(k) for k in joined.keys} == {
        **{k: made.components(k) for k in made.keys}, **{k: other.components(k) for k in other.keys}}
    for head in (b"2", b"[2]", b'{"format": 2, "groups": [["fx_graph", "f", 5, []]], "dictionary": 0}',
                 b'{"format": 2, "groups": {}, "dictionary": -1}'):
        with pytest.raises(KeyIndexError):
            KeyIndex.unpack(zlib.compress(head))

    dictionary = json.dumps({"fa": made.keys["fa"]["components"]}).encode()
    deflater = zlib.compressobj(6, zdict=dictionary)
    group = deflater.compress(json.dumps({"fa": made.keys["fa"]["components"]}).encode()) + deflater.flush()
    packed_dictionary = zlib.compress(dictionary)
    head = {"format": 2, "torch": "2.13.0+cpu", "configs": made.configs, "dictionary": len(packed_dictionary),
            "groups": [["fx_graph", "f (x.py)", len(group), [["fa", made.keys["fa"]["config"]]]]]}
    with pytest.raises(KeyIndexError, match="written by an older version"):
        KeyIndex.unpack(zlib.compress(json.dumps(head).encode()) + packed_dictionary + group)
    with pytest.raises(KeyIndexError, match="unknown format"):
        KeyIndex.unpack(zlib.compress(b'{"format": 3}'))


@pytest.mark.slow
def test_a_bundle_without_the_warmups_graph_says_what_adds_it(pytester: pytest.Pytester,
                                                               run_inner: Callable[..., pytest.RunResult]) -> None:
    """A bundle another warmup built (another project's, an older one) loads as it is, so the hook does not run: a
    warm test's miss of the hook's graph says the bundle holds no entry for it and which runs add it."""
    pytester.makeconftest("import torch\n\ndef pytest_compilecache_warmup(cache):\n"
                          "    torch.compile(lambda x: x.sin() + 1)(torch.randn(8))\n")
    pytester.makepyfile(test_w="def test_w(warm_cache):\n    pass\n")
    bundle = pytester.path / "older.bundle"
    run_inner(f"--compile-cache-bundle={bundle}").assert_outcomes(passed=1)
    pytester.makeconftest("import torch\n\ndef g(x):\n    return x.cos() * 3\n\n"
                          "def pytest_compilecache_warmup(cache):\n    torch.compile(g)(torch.randn(8))\n")
    pytester.makepyfile(test_w="import torch\nfrom conftest import g\n\ndef test_w(warm_cache):\n"
                               "    torch.compile(g)(torch.randn(8))\n    warm_cache.assert_hits(fx_graph=1)\n")
    result = run_inner(f"--compile-cache-bundle={bundle}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*FX graph miss in g (conftest.py): no entry for this code at all*the bundle "
                                 f"{bundle} holds none*--compile-cache-update*runs the warmup hook*"])


def test_a_damaged_entry_missed_before_the_bundle_is_loaded_again_keeps_its_reason() -> None:
    """An updating run's warmup misses a damaged entry, then publishes and loads the bundle again (which forgets
    what was damaged): the tests' counting must still read why, not raise KeyError."""
    from pytest_compilecache import misses
    from pytest_compilecache._torchapi.keys import Miss

    misses.use_bundle_index("", cannot="none loaded")
    misses.left_out_damaged("fabc", "b.bundle: inductor fabc fails its checksum")
    misses._seen(Miss("fx_graph", "fabc", "f (x.py)", {}, starts_empty=False))
    misses.use_bundle_index("", cannot="loaded again")
    try:
        assert ("fabc", "b.bundle: inductor fabc fails its checksum") in misses.ran_without_damaged()
    finally:
        misses._ran_without.clear()
