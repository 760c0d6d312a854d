"""A two-layer MLP on a generated classification task: the smallest model, for quick checks.

Task: points in ``d_in`` dimensions labelled by which of ``n_classes`` fixed random centres is
nearest. The centres come from a fixed seed, so every batch belongs to the same task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import SpecError
from .base import Batch, ModelFamily

if TYPE_CHECKING:  # imported where used: checking a spec needs no torch (the net: mlp_net)
    import torch
    from torch import nn


@dataclass(frozen=True)
class MLPConfig:
    d_in: int = 64
    d_hidden: int = 256
    n_classes: int = 10
    batch_size: int = 32


class MLPFamily(ModelFamily):
    name = "mlp"
    presets = {"tiny": MLPConfig(), "wide": MLPConfig(d_in=256, d_hidden=2048, batch_size=128)}
    item_unit = "samples"
    default_lr = 3e-3

    def check_config(self, cfg: MLPConfig) -> None:
        for key in ("d_in", "d_hidden", "n_classes", "batch_size"):
            value = getattr(cfg, key)
            if not isinstance(value, int) or value <= 0:
                raise SpecError(f"mlp {key} must be a positive int, got {value!r}")
        if cfg.n_classes < 2:
            raise SpecError(f"mlp n_classes must be at least 2, got {cfg.n_classes}")

    def build(self, cfg: MLPConfig) -> nn.Module:
        from .mlp_net import MLP

        return MLP(cfg.d_in, cfg.d_hidden, cfg.n_classes)

    def _centres(self, cfg: MLPConfig) -> torch.Tensor:
        import torch

        return torch.randn(cfg.n_classes, cfg.d_in, generator=torch.Generator().manual_seed(1234))

    def make_batch(self, cfg: MLPConfig, batch_size: int, generator: torch.Generator) -> Batch:
        import torch

        x = torch.randn(batch_size, cfg.d_in, generator=generator)
        y = torch.cdist(x, self._centres(cfg)).argmin(dim=1)
        return {"x": x, "y": y}

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        import torch.nn.functional as F

        return F.cross_entropy(model(batch["x"]), batch["y"])

    def evaluate(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return (model(batch["x"]).argmax(dim=1) == batch["y"]).float().mean()

    def flops_per_step(self, cfg: MLPConfig, batch_size: int) -> float:
        macs = cfg.d_in * cfg.d_hidden + cfg.d_hidden**2 + cfg.d_hidden * cfg.n_classes
        return 3 * 2.0 * batch_size * macs
