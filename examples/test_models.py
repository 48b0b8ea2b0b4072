"""A realistic suite: each test says which cache layers it expects to hit or miss."""

from __future__ import annotations

import pytest
import torch
from models import run_dynamic, run_inference, run_mlp_no_grad, run_training_step


def test_transformer_inference_is_warm(warm_cache):
    run_inference()
    warm_cache.assert_misses(fx_graph=0, aot_autograd=0)
    warm_cache.assert_hits(fx_graph=1, aot_autograd=1)


def test_transformer_training_is_warm(warm_cache):
    run_training_step()
    warm_cache.assert_misses(fx_graph=0, aot_autograd=0)
    warm_cache.assert_hits(fx_graph=2, aot_autograd=1)  # forward and backward graphs


def test_mlp_under_no_grad_is_warm(warm_cache):
    run_mlp_no_grad()
    warm_cache.assert_misses(fx_graph=0)


def test_dynamic_shapes_compile_once_and_are_warm(warm_cache):
    run_dynamic(sizes=(8, 16, 24, 40))
    warm_cache.assert_misses(fx_graph=0)
    assert warm_cache.stats.fx_graph.hits >= 1


def test_a_config_change_misses(cold_cache):
    from torch._inductor import config

    run_mlp_no_grad()
    cold_cache.reset_in_memory()
    with config.patch(fallback_random=True):
        run_mlp_no_grad()
    cold_cache.assert_misses(fx_graph=2)  # an Inductor config value is part of the cache key
    cold_cache.reset_in_memory()
    run_mlp_no_grad()
    cold_cache.assert_hits(fx_graph=1)


def test_explains_why_a_bundle_entry_missed(warm_cache):
    """A config value the bundle was not built with: the miss says which one, and how it changed."""
    from torch._inductor import config

    with warm_cache.not_saved(), config.patch(max_fusion_size=32):  # not_saved: stays a miss next run
        run_mlp_no_grad()
    warm_cache.assert_misses(fx_graph=1)
    (why,) = warm_cache.stats.fx_graph.explanations
    print(why)
    assert "config `max_fusion_size` changed (was 64, now 32)" in why


def test_a_warm_hit_per_layer(warm_cache):
    run_inference()
    stats = warm_cache.stats
    warm_cache.assert_hits(fx_graph=1, aot_autograd=1)
    assert stats.fx_graph.from_bundle == 1, "the hit's code came from the bundle"
    for layer in stats:
        if layer.observable:
            print(f"{layer.layer}: {layer.hits} hits, {layer.misses} misses")
        else:
            print(f"{layer.layer}: not observable here ({layer.reason})")


def test_cold_cache_ignores_the_bundle(cold_cache):
    run_mlp_no_grad()
    cold_cache.assert_misses(fx_graph=1)
    cold_cache.reset_in_memory()
    run_mlp_no_grad()
    cold_cache.assert_hits(fx_graph=1)


@pytest.mark.parametrize("batch", [4, 32])
def test_ordinary_tests_use_the_loaded_bundle_too(batch):
    with torch.no_grad():
        # dynamic=False: which batch a worker saw first must not decide whether this graph is dynamic
        out = torch.compile(torch.nn.functional.gelu, dynamic=False)(torch.randn(batch, 8))
    assert out.shape == (batch, 8)
