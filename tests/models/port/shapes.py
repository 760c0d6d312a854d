"""A text classifier written the way GPU code often is: three planted TPU blockers.

Each blocker's line ends with ``# BLOCKER: <kind>``; ``shapes.expected.csv`` lists every finding
``port`` must report (tests/test_port.py). Used as ``model="tests/models/port/shapes.py:make"``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, CLASSES = 64, 32, 4


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1]).to(tokens.device)  # BLOCKER: cpu_tensor
        x = self.embed(tokens) + 0.01 * positions[None, :, None]
        return self.head(torch.relu(self.mix(x)).mean(dim=1))


def build() -> nn.Module:
    return Classifier()


def make_batch(batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    length = int(torch.randint(20, 60, (1,), generator=generator))  # a new length every batch
    tokens = torch.randint(0, VOCAB, (batch_size, length), generator=generator)  # BLOCKER: shapes
    return {"tokens": tokens, "y": tokens[:, 0] % CLASSES}


def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    out = F.cross_entropy(model(batch["tokens"]), batch["y"])
    print(f"loss {out.item():.3f}")  # BLOCKER: host_read
    return out


def make() -> SimpleNamespace:
    return SimpleNamespace(build=build, make_batch=make_batch, loss=loss, batch_size=8,
                           name="shapes")
