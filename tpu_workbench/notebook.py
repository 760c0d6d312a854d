"""Small helpers the notebooks share (kept here so every notebook behaves the same)."""

from __future__ import annotations

import os

SMOKE_ENV = "TPU_WORKBENCH_SMOKE"


def smoke_mode() -> bool:
    """True for quick CI runs: ``TPU_WORKBENCH_SMOKE=1``, or ``-- --smoke`` after a notebook."""
    if os.environ.get(SMOKE_ENV) == "1":
        return True
    try:
        import marimo as mo

        return "smoke" in mo.cli_args()  # a bare `--smoke` parses to "" (falsy), so test `in`
    except Exception:  # no marimo runtime (plain import)
        return False


def image_grid(images, columns: int = 8, scale: int = 3):
    """A PIL image of a batch (N, 3, H, W) with values in [0, 1], `columns` per row, upscaled."""
    import torch
    from PIL import Image
    from torchvision.utils import make_grid

    grid = make_grid(images.clamp(0, 1), nrow=columns, padding=2, pad_value=1.0)
    array = (grid.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    image = Image.fromarray(array)
    return image.resize((image.width * scale, image.height * scale), Image.NEAREST)
