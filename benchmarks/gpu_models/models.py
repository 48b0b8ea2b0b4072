"""Three real models for GPU runs: timm's resnet18, a 2-layer BERT from transformers, a max-autotune MLP."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

MODELS = ("resnet18", "bert", "mlp_max_autotune")


def build(name: str) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """(model, inputs, torch.compile keyword arguments) for a model name, seeded and on the GPU."""
    torch.manual_seed(0)
    if name == "resnet18":
        import timm

        model = timm.create_model("resnet18", pretrained=False).cuda().eval()
        return model, (torch.randn(8, 3, 224, 224, device="cuda"),), {}
    if name == "bert":
        from transformers import BertConfig, BertModel

        config = BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=1024, max_position_embeddings=256)
        model = BertModel(config).cuda().eval()
        return model, (torch.randint(0, 1000, (4, 128), device="cuda"),), {}
    if name == "mlp_max_autotune":
        layers: list[torch.nn.Module] = []
        for _ in range(3):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.GELU()]
        model = torch.nn.Sequential(*layers).cuda().eval()
        return model, (torch.randn(64, 1024, device="cuda"),), {"mode": "max-autotune-no-cudagraphs"}
    raise ValueError(name)


def compile_and_run(name: str) -> float:
    """Compile a model and run it once; the seconds it took, GPU work included."""
    import time

    model, inputs, kwargs = build(name)
    profile_dir = os.environ.get("GPU_MODELS_PROFILE")
    profiler = None
    if profile_dir:
        import cProfile

        profiler = cProfile.Profile()
    torch.cuda.synchronize()
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    with torch.no_grad():
        torch.compile(model, **kwargs)(*inputs)
    torch.cuda.synchronize()
    took = time.perf_counter() - start
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(os.path.join(profile_dir, f"{name}.prof"))
    return took


def warm_up_process() -> None:
    """Pay the once-per-process start-up (CUDA context, Triton, Inductor imports) on a small compile,
    the same graph in every run, so that a warm run finds it in its cache on either side; its
    seconds are logged as the model ``start-up`` where ``GPU_MODELS_LOG`` is set."""
    import json
    import time

    start = time.perf_counter()
    torch.compile(lambda x: torch.relu(x) + 1.0)(torch.randn(16, device="cuda"))
    torch.cuda.synchronize()
    if os.environ.get("GPU_MODELS_LOG"):
        with open(os.environ["GPU_MODELS_LOG"], "a") as f:
            f.write(json.dumps({"model": "start-up", "seconds": time.perf_counter() - start}) + "\n")
