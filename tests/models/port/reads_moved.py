"""A loss that reads the model's output back in two common ways (the case of issue 54): one
fix keeps the value on the device and helps; the other moves the read to the next line, where
the value is read anyway, and does not. Expected findings: ``reads_moved.expected.csv``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

DIM, CLASSES = 8, 4


def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["x"])
    out = F.cross_entropy(logits, batch["y"])
    preds = logits.argmax(-1).tolist()  # kept on the device, nothing reads it: the fix helps
    probs = logits.softmax(-1).cpu()  # kept on the device, the next line reads it anyway
    confident = float(probs[0, 0]) > 0.5  # a CPU tensor as written: no device read here
    del preds, confident
    return out


def build() -> nn.Module:
    return nn.Linear(DIM, CLASSES)


def make_batch(batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    x = torch.randn(batch_size, DIM, generator=generator)
    return {"x": x, "y": x[:, :CLASSES].argmax(dim=1)}


def make() -> SimpleNamespace:
    return SimpleNamespace(build=build, make_batch=make_batch, loss=loss, batch_size=8,
                           name="reads_moved")
