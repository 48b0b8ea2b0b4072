"""The examples suite's models, and the compiled calls its tests and warmup make."""

from __future__ import annotations

import torch


class TransformerBlock(torch.nn.Module):
    """A pre-norm transformer block: attention, then a GELU feed-forward."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.ff = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.ff(self.norm2(x))


def transformer_block() -> TransformerBlock:
    torch.manual_seed(0)
    return TransformerBlock()


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(128, 128), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def tokens() -> torch.Tensor:
    return torch.randn(2, 16, 64)


def scaled_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 0.5, dim=-1) + x.mean()


def run_inference() -> torch.Tensor:
    with torch.no_grad():
        return torch.compile(transformer_block().eval())(tokens())


def run_training_step() -> None:
    model = transformer_block()
    torch.compile(model)(tokens()).sum().backward()


def run_mlp_no_grad() -> torch.Tensor:
    with torch.no_grad():
        return torch.compile(mlp())(torch.randn(32, 128))


def run_dynamic(sizes: tuple[int, ...] = (8, 16, 24)) -> None:
    compiled = torch.compile(scaled_softmax, dynamic=True)
    for n in sizes:
        compiled(torch.randn(n, 32))
