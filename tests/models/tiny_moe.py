"""A user's own model file: a tiny top-1 mixture of experts, written the way many are.

``forward`` routes each point to its best expert and loops over the experts with
``if mask.any():``, a Python branch on a tensor's value: Dynamo cannot trace it, and since the
break sits inside a loop it gives up on the whole frame (``forward`` runs uncompiled). Task as
tiny_mlp's: 16-dimensional points labelled by which of 4 fixed directions they point along most.
Used as ``model="tests/models/tiny_moe.py:make"``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

D_IN, D_HIDDEN, N_EXPERTS, N_CLASSES = 16, 16, 4, 4
DIRECTIONS = torch.randn(D_IN, N_CLASSES, generator=torch.Generator().manual_seed(7))


class TinyMoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(D_IN, N_EXPERTS)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(D_IN, D_HIDDEN), nn.ReLU(), nn.Linear(D_HIDDEN, N_CLASSES))
            for _ in range(N_EXPERTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.router(x).softmax(dim=-1)
        weight, choice = gate.max(dim=-1)
        out = x.new_zeros(x.shape[0], N_CLASSES)
        for i, expert in enumerate(self.experts):
            mask = choice == i
            if mask.any():  # skip an expert no point was routed to
                out[mask] = weight[mask, None] * expert(x[mask])
        return out


def build() -> nn.Module:
    return TinyMoE()


def make_batch(batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    x = torch.randn(batch_size, D_IN, generator=generator)
    return {"x": x, "y": (x @ DIRECTIONS).argmax(dim=1)}


def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["x"]), batch["y"])


def evaluate(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return (model(batch["x"]).argmax(dim=1) == batch["y"]).float().mean()


def make() -> SimpleNamespace:
    return SimpleNamespace(build=build, make_batch=make_batch, loss=loss, evaluate=evaluate,
                           metric_name="accuracy", batch_size=32, lr=1e-2, name="tiny_moe")
