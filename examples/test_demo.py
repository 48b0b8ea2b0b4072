"""A first look at pytest-compilecache: every test gets its own empty compile cache."""

import torch


def gelu_mlp(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ x.T).softmax(-1)


def test_first_compile_is_a_miss(cold_cache):
    torch.compile(gelu_mlp)(torch.randn(16, 16))
    cold_cache.assert_misses(fx_graph=1, aot_autograd=1)


def test_recompiling_hits_this_tests_own_disk_cache(cold_cache):
    torch.compile(gelu_mlp)(torch.randn(16, 16))
    cold_cache.reset_in_memory()
    torch.compile(gelu_mlp)(torch.randn(16, 16))
    cold_cache.assert_hits(fx_graph=1, aot_autograd=1)
    print(cold_cache.stats.table())
