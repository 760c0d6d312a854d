"""A model with four more planted TPU blockers, one of which stops Dynamo: a plain tensor
attribute (not a buffer, so ``.to(device)`` leaves it on the CPU), an op XLA does not lower (a
median), a boolean-mask index and a float64 constant. Each blocker's line ends with
``# BLOCKER: <kind>``; ``masks.expected.csv`` lists every finding ``port`` must report.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

DIM, CLASSES = 16, 4


class Scorer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, CLASSES)
        self.scale = torch.ones(DIM)  # a plain attribute: model.to(device) does not move it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.body(x)) * self.scale  # BLOCKER: cpu_tensor
        h = h - h.median(dim=0).values  # BLOCKER: fallback
        bonus = h[h > 0.5].mean()  # BLOCKER: data_dependent
        half = torch.full((DIM,), 0.5, dtype=torch.float64, device=x.device)  # BLOCKER: float64
        return self.head(h * half.float()) + bonus


def build() -> nn.Module:
    return Scorer()


def make_batch(batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    x = torch.randn(batch_size, DIM, generator=generator)
    return {"x": x, "y": (x[:, :CLASSES]).argmax(dim=1)}


def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["x"]), batch["y"])


def make() -> SimpleNamespace:
    return SimpleNamespace(build=build, make_batch=make_batch, loss=loss, batch_size=8,
                           name="masks")
