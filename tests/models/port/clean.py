"""A small classifier written for a TPU: every tensor made on the device, static shapes, no read
in the step. ``port`` must find nothing (``clean.expected.csv`` holds no finding)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

DIM, CLASSES = 8, 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, CLASSES)
        self.register_buffer("scale", torch.full((DIM,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.body(x)) * self.scale
        keep = torch.where(h > 0.1, h, torch.zeros_like(h))  # a mask with a static shape
        return self.head(keep + torch.arange(DIM, device=x.device) * 0.01)


def build() -> nn.Module:
    return Net()


def make_batch(batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    x = torch.randn(batch_size, DIM, generator=generator)
    return {"x": x, "y": x[:, :CLASSES].argmax(dim=1)}


def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["x"]), batch["y"])


def make() -> SimpleNamespace:
    return SimpleNamespace(build=build, make_batch=make_batch, loss=loss, batch_size=8,
                           name="clean")
