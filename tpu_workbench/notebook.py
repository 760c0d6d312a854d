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


def run_live(specs: list, cold: bool = False, every_s: float = 0.4, chart=None):
    """Run `specs` one after another inside a marimo cell: a progress bar over all their steps
    and a chart that grows as records stream in (`chart(steps_frame)`, default the step-time
    chart). Returns the Comparison (``.result()`` for a single spec)."""
    import marimo as mo

    from .charts import step_times
    from .experiments import label, run_many

    chart = chart or step_times

    total = max(sum(s.steps for s in specs), 1)
    shown = [0]
    with mo.status.progress_bar(total=total, title="training", remove_on_exit=True) as bar:

        def update(frame, spec, done: int) -> None:
            bar.update(increment=done - shown[0], subtitle=label(spec))
            shown[0] = done
            if len(frame):
                mo.output.replace(chart(frame))

        comparison = run_many(specs, on_update=update, every_s=every_s, cold=cold)
    if len(comparison.steps):
        mo.output.replace(chart(comparison.steps))
    return comparison
