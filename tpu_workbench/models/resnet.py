"""ResNet (torchvision's resnet18 / resnet50, random weights) classifying generated shapes.

Task: each image shows one shape (disk, square, triangle, horizontal bar, vertical bar, ring) of a
random size, position and colour on a random background, plus pixel noise; the label is the
shape. Presets with more classes than shapes (the 1000-class ImageNet-sized ones) simply never
see the other labels. ``shape_images`` is shared with the UNet family.

The ``tiny`` preset is ResNet-18 with a CIFAR-style stem (3x3 stride-1 first conv, no max-pool) on
16x16 images, one class per shape, 32 images a batch: 60 steps on fresh batches reach about 80%
accuracy on 512 held-out images (chance 17%; measured on this CPU's three ATen kernel sets).
``resnet18`` and ``resnet50`` are torchvision's ImageNet models at 224x224.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SpecError
from .base import Batch, ModelFamily

SHAPES = ("disk", "square", "triangle", "hbar", "vbar", "ring")


def shape_images(batch_size: int, image_size: int, generator: torch.Generator, n_shapes: int,
                 noise: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (B, 3, S, S) in [0, 1], labels (B,) in range(n_shapes)) drawn with torch ops.

    Everything random comes from `generator`, so a seeded generator gives the same batch.
    """
    g, B = generator, batch_size
    labels = torch.randint(n_shapes, (B,), generator=g)
    r = 0.15 + 0.15 * torch.rand(B, 1, 1, generator=g)  # size, as a fraction of the image
    cy, cx = (0.25 + 0.5 * torch.rand(2, B, 1, 1, generator=g)).unbind(0)
    fg = 0.6 + 0.4 * torch.rand(B, 3, 1, 1, generator=g)  # light shape on a dark background
    bg = 0.4 * torch.rand(B, 3, 1, 1, generator=g)
    coords = (torch.arange(image_size, dtype=torch.float32) + 0.5) / image_size
    dy, dx = coords.view(1, -1, 1) - cy, coords.view(1, 1, -1) - cx  # (B, S, 1), (B, 1, S)
    dist = (dx**2 + dy**2).sqrt()
    s = 0.8 * r  # half side of the square and triangle, so their areas are close to the disk's
    masks = torch.stack([
        dist < r,  # disk
        (dx.abs() < s) & (dy.abs() < s),  # square
        (dy < s) & (dx.abs() < (dy + s) / 2),  # triangle, apex up
        (dx.abs() < r) & (dy.abs() < 0.3 * r),  # horizontal bar
        (dx.abs() < 0.3 * r) & (dy.abs() < r),  # vertical bar
        (dist < r) & (dist > 0.6 * r),  # ring
    ][:n_shapes])  # (n_shapes, B, S, S)
    mask = masks[labels, torch.arange(B)].unsqueeze(1).float()  # (B, 1, S, S)
    img = mask * fg + (1 - mask) * bg
    img = img + noise * torch.randn(B, 3, image_size, image_size, generator=g)
    return img.clamp(0, 1), labels


@dataclass(frozen=True)
class ResNetConfig:
    arch: str = "resnet18"  # resnet18 | resnet50
    image_size: int = 16
    num_classes: int = len(SHAPES)
    cifar_stem: bool = True  # 3x3 stride-1 first conv and no max-pool (for small images)
    batch_size: int = 32


_ARCHS = ("resnet18", "resnet50")


class ResNetFamily(ModelFamily):
    name = "resnet"
    presets = {
        "tiny": ResNetConfig(),
        "resnet18": ResNetConfig(image_size=224, num_classes=1000, cifar_stem=False),
        "resnet50": ResNetConfig(arch="resnet50", image_size=224, num_classes=1000,
                                 cifar_stem=False),
    }
    item_unit = "images"
    default_lr = 1e-3

    def check_config(self, cfg: ResNetConfig) -> None:
        if cfg.arch not in _ARCHS:
            raise SpecError(f"resnet arch {cfg.arch!r} is not one of {', '.join(_ARCHS)}")
        for key in ("image_size", "num_classes", "batch_size"):
            value = getattr(cfg, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SpecError(f"resnet {key} must be a positive int, got {value!r}")
        if cfg.num_classes < 2:
            raise SpecError(f"resnet num_classes must be at least 2, got {cfg.num_classes}")
        # The stem + 3 strided stages halve the size 3 times (CIFAR stem) or 5 times (ImageNet).
        factor = 8 if cfg.cifar_stem else 32
        if cfg.image_size % factor:
            raise SpecError(f"resnet image_size={cfg.image_size} must be a multiple of {factor} "
                            f"(cifar_stem={cfg.cifar_stem} downsamples it {factor}x)")

    def build(self, cfg: ResNetConfig) -> nn.Module:
        import torchvision

        model = getattr(torchvision.models, cfg.arch)(weights=None, num_classes=cfg.num_classes)
        if cfg.cifar_stem:
            model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
            model.maxpool = nn.Identity()
        return model

    def n_shapes(self, cfg: ResNetConfig) -> int:
        """How many classes the task uses (chance accuracy is 1 / n_shapes)."""
        return min(cfg.num_classes, len(SHAPES))

    def make_batch(self, cfg: ResNetConfig, batch_size: int, generator: torch.Generator) -> Batch:
        img, y = shape_images(batch_size, cfg.image_size, generator, self.n_shapes(cfg))
        return {"x": (img - 0.5) / 0.25, "y": y}  # roughly zero mean, unit variance

    @staticmethod
    def pixels(x: torch.Tensor) -> torch.Tensor:
        """A batch's normalised images ``x`` back in [0, 1], as drawn (for showing them)."""
        return (x * 0.25 + 0.5).clamp(0, 1)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(model(batch["x"]), batch["y"])

    def evaluate(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Top-1 accuracy."""
        return (model(batch["x"]).argmax(dim=1) == batch["y"]).float().mean()

    def held_out_predictions(self, model: nn.Module, cfg: ResNetConfig, n: int = 600,
                             seed: int = 12345, batch_size: int = 100):
        """``(frame, images)`` for `n` fresh images drawn with `seed` (none of the training or
        evaluation batches), predicted by the model in eval mode on the CPU, without gradients:
        the frame has the ``true`` and ``predicted`` shape names (what a confusion matrix
        counts), row i describing ``images[i]`` (N, 3, S, S), as the model saw them."""
        import pandas as pd

        gen = torch.Generator().manual_seed(seed)
        true, predicted, images = [], [], []
        model.eval()
        with torch.no_grad():
            for start in range(0, n, batch_size):
                batch = self.make_batch(cfg, min(batch_size, n - start), gen)
                true += batch["y"].tolist()
                images.append(batch["x"])
                predicted += model(batch["x"]).argmax(dim=1).tolist()
        names = list(SHAPES) + [f"class {i}" for i in range(len(SHAPES), cfg.num_classes)]
        frame = pd.DataFrame({"true": [names[i] for i in true],
                              "predicted": [names[i] for i in predicted]})
        return frame, torch.cat(images)

    def forward_matmul_flops(self, cfg: ResNetConfig, batch_size: int) -> float:
        """2 x the multiply-adds of every Conv2d and Linear in one forward pass."""
        return 2.0 * _macs_per_image(cfg) * batch_size

    def flops_per_step(self, cfg: ResNetConfig, batch_size: int) -> float:
        """3 x forward_matmul_flops (BatchNorm, ReLU and pooling are left out)."""
        return 3 * self.forward_matmul_flops(cfg, batch_size)


@functools.cache
def _macs_per_image(cfg: ResNetConfig) -> int:
    """Conv/Linear multiply-adds for one image, counted with hooks on a 'meta' forward pass."""
    with torch.device("meta"):
        model = ResNetFamily().build(cfg)
    return count_macs(model, torch.empty(1, 3, cfg.image_size, cfg.image_size, device="meta"))


def count_macs(model: nn.Module, *inputs: torch.Tensor) -> int:
    """Multiply-adds of the Conv2d and Linear layers of `model` in one forward pass on `inputs`."""
    total = 0

    def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Conv2d):
            k = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
        else:
            k = module.in_features
        total += out.numel() * k

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, nn.Conv2d | nn.Linear)]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return total
