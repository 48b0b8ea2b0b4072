"""Why a lookup missed, in process, beside ``tests/test_explain.py``: the differences it names in the user's words,
for the kinds of key component that file does not stage."""

from __future__ import annotations

import pytest

from pytest_compilecache.bundle.keyindex import KeyIndex
from pytest_compilecache.explain import SHOWN, Known, explain

CODE = "f (t.py)"
GRAPH = "GraphModule()\\n\\ndef forward(self, x):\\n    sin = torch.ops.aten.sin.default(x)\\n"


def _tensor(shape: str) -> str:
    return (f"TensorMetadata(dtype=torch.float32, shape=torch.Size([{shape}]), stride=(1,), "
            "device=device(type='cpu'), layout=torch.strided)")


BASE = {"gm": ("g1", GRAPH), "example_inputs[0]": ("i1", _tensor("8"))}


def _bundle(components: dict[str, tuple[str, str]]) -> Known:
    index = KeyIndex()
    index.add("kold", "fx_graph", CODE, components)
    return Known("the bundle b", index, fills=True)


@pytest.mark.parametrize("name, was, now, words, kind", [
    ("fx_kwargs[cpp_wrapper]", "False", "True", "compile option `cpp_wrapper` changed (was False, now True)",
     "compile option `cpp_wrapper` changed"),
    ("functorch_config[donated_buffer]", "True", "False",
     "functorch config `donated_buffer` changed (was True, now False)", "functorch config `donated_buffer` changed"),
    ("cache_key_tag", "a", "b", "cache_key_tag changed (was 'a', now 'b')", "cache_key_tag changed"),
    ("deterministic_algorithms_settings", "(False, False)", "(True, False)",
     "`deterministic_algorithms_settings` changed (was (False, False), now (True, False))",
     "`deterministic_algorithms_settings` changed"),
], ids=["compile-option", "functorch-config", "cache-key-tag", "other-component"])
def test_a_changed_component_is_named_with_both_values(name: str, was: str, now: str, words: str, kind: str) -> None:
    """One differing component is said with its value in the entry and now, and counted under its kind."""
    why = explain("fx_graph", "knew", CODE, {**BASE, name: ("n", now)}, [_bundle({**BASE, name: ("w", was)})])
    assert why.text == f"FX graph miss in {CODE}: nearest entry in the bundle b (kold...) differs: {words}"
    assert why.kinds == (kind,)


def test_a_different_number_of_inputs_is_said_as_counts() -> None:
    """A graph taking another number of inputs says both counts, not each input."""
    ours = {**BASE, "example_inputs[1]": ("i2", _tensor("8"))}
    why = explain("fx_graph", "knew", CODE, ours, [_bundle(BASE)])
    assert "the graph takes 2 inputs, the entry 1" in why.text and why.kinds == ("inputs changed",)


def test_differences_past_the_shown_few_are_counted() -> None:
    """Only the first differences are named; the rest are counted."""
    extra = SHOWN + 2
    theirs = {**BASE, **{f"inductor_config[opt{i}]": ("a", "1") for i in range(extra)}}
    ours = {**BASE, **{f"inductor_config[opt{i}]": ("b", "2") for i in range(extra)}}
    why = explain("fx_graph", "knew", CODE, ours, [_bundle(theirs)])
    assert why.text.endswith("; and 2 more differences") and why.text.count("config `opt") == SHOWN
    assert len(why.kinds) == extra


def test_a_changed_graph_names_its_nodes_and_comes_first() -> None:
    """A graph that changed says the nodes only in the entry and only now, before other differences."""
    ours = {"gm": ("g2", GRAPH + "    cos = torch.ops.aten.cos.default(sin)\\n"),
            "example_inputs[0]": BASE["example_inputs[0]"], "inductor_config[x]": ("c2", "2")}
    why = explain("fx_graph", "knew", CODE, ours, [_bundle({**BASE, "inductor_config[x]": ("c1", "1")})])
    assert why.kinds == ("graph changed", "config `x` changed")
    assert "the graph changed (only now: `cos = torch.ops.aten.cos.default(sin)`)" in why.text


def test_a_miss_in_an_empty_cache_of_new_code_is_by_design() -> None:
    """A cold cache's miss of code nobody compiled before is by design, not "new code" to add to a bundle."""
    why = explain("aot_autograd", "knew", CODE, BASE, [Known("this session's earlier compiles", KeyIndex())],
                  starts_empty=True)
    assert why.text.startswith(f"AOTAutograd miss in {CODE}: this cache starts empty by design")
    assert why.kinds == ("cache starts empty",)


def test_new_code_with_no_source_that_fills_the_cache_gives_no_advice() -> None:
    """Where no source filled the lookup's folder, new code is said without advice to update a bundle."""
    why = explain("fx_graph", "knew", "", BASE, [Known("this session's earlier compiles", KeyIndex())])
    assert why.text == "FX graph miss in unknown code: no entry for this code at all (new code)"
    assert why.kinds == ("new code",)
