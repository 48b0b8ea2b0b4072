# Shared model/function definitions (imported by both process A and B so
# qualname + first line number are identical across processes).
import torch
import torch.nn as nn


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, 64), nn.ReLU(),
    )


MODEL = make_model()


def fn(x):
    return MODEL(x)


def make_input():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 64, generator=g)
