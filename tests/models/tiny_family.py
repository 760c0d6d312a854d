"""A user's model file whose ``make`` is a ModelFamily subclass (used as it is, presets and all)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tpu_workbench.models.base import Batch, ModelFamily


@dataclass(frozen=True)
class Config:
    width: int = 8
    batch_size: int = 4


class TinyFamily(ModelFamily):
    name = "tiny_family"
    presets = {"small": Config(), "wide": Config(width=32)}

    def build(self, cfg: Config) -> nn.Module:
        return nn.Linear(cfg.width, 2)

    def make_batch(self, cfg: Config, batch_size: int, generator: torch.Generator) -> Batch:
        x = torch.randn(batch_size, cfg.width, generator=generator)
        return {"x": x, "y": (x.sum(dim=1) > 0).long()}

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(model(batch["x"]), batch["y"])

    def flops_per_step(self, cfg: Config, batch_size: int) -> float:
        return 3 * 2.0 * batch_size * cfg.width * 2


make = TinyFamily
