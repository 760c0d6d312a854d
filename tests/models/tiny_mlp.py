"""A user's own model file, as a workbench user would write one: ``make()`` returns a factory.

Task: 16-dimensional points labelled by which of 4 fixed directions they point along most, a
rule a two-layer MLP learns in a few steps. Used as ``model="tests/models/tiny_mlp.py:make"``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

D_IN, D_HIDDEN, N_CLASSES = 16, 32, 4
DIRECTIONS = torch.randn(D_IN, N_CLASSES, generator=torch.Generator().manual_seed(7))


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(D_IN, D_HIDDEN), nn.ReLU(), nn.Linear(D_HIDDEN, N_CLASSES))


def make_batch(batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    x = torch.randn(batch_size, D_IN, generator=generator)
    return {"x": x, "y": (x @ DIRECTIONS).argmax(dim=1)}


def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["x"]), batch["y"])


def evaluate(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return (model(batch["x"]).argmax(dim=1) == batch["y"]).float().mean()


def flops_per_step(batch_size: int) -> float:
    return 3 * 2.0 * batch_size * (D_IN * D_HIDDEN + D_HIDDEN * N_CLASSES)


def make() -> SimpleNamespace:
    return SimpleNamespace(build=build, make_batch=make_batch, loss=loss, evaluate=evaluate,
                           flops_per_step=flops_per_step, metric_name="accuracy",
                           batch_size=64, lr=1e-2, name="tiny_mlp")
