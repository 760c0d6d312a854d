"""A model that runs well on XLA in lazy mode but that Dynamo (torch.compile) splits: a print
of a plain string in ``forward`` (no tensor, so no host read). Expected findings:
``graph_breaks.expected.csv``.
"""

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.body(x))
        print("forward: body done")  # a graph break under torch.compile, no host read
        return self.head(h)


def build() -> nn.Module:
    return Net()


def make_batch(batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    x = torch.randn(batch_size, DIM, generator=generator)
    return {"x": x, "y": x[:, :CLASSES].argmax(dim=1)}


def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["x"]), batch["y"])


def make() -> SimpleNamespace:
    return SimpleNamespace(build=build, make_batch=make_batch, loss=loss, batch_size=8,
                           name="graph_breaks")
