import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="ResNet: convolutions through XLA")

with app.setup:
    import marimo as mo
    import torch

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench.models import get_model, preset_table
    from tpu_workbench.models.resnet import SHAPES

    SMOKE = wb.smoke_mode()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # ResNet: convolutions through XLA

    torchvision's ResNet builders, from random weights, learning to tell generated shapes apart
    (disk, square, triangle, bars, ring: drawn with torch ops, in random colours, sizes and
    places, with noise). The `tiny` preset is a CIFAR-style ResNet-18 (3x3 stem, no max-pool) at
    32x32, which trains at interactive speed on a laptop's XLA:CPU; `resnet18` and `resnet50`
    are the ImageNet shapes a v6e trains.
    """)
    return


@app.cell
def _():
    family = get_model("resnet")
    cfg = family.config("tiny")
    _batch = family.make_batch(cfg, 16, torch.Generator().manual_seed(0))
    _labels = ", ".join(SHAPES[i] for i in _batch["y"].tolist())
    presets = preset_table("resnet")
    mo.vstack([
        mo.image(wb.image_grid(_batch["x"])),
        mo.md(f"labels, left to right, top to bottom: {_labels}"),
        nb.table(presets[["preset", "params", "batch_size", "gflops_per_step", "arch",
                          "image_size", "num_classes"]], label="presets"),
    ])
    return (presets,)


@app.cell
def _():
    steps = mo.ui.slider(10, 200, value=60, step=10, label="training steps", show_value=True)
    mode = mo.ui.dropdown(wb.available_modes(), value=wb.default_modes()[-1], label="mode")
    mo.hstack([steps, mode], justify="start", gap=2)
    return mode, steps


@app.cell
def _(mode, steps):
    # Smoke mode (CI) trains 3 steps in plain PyTorch; full mode runs XLA.
    _spec = wb.ExperimentSpec(model="resnet", preset="tiny",
                              mode="torch_eager" if SMOKE else mode.value,
                              steps=3 if SMOKE else steps.value)
    result = wb.run_live([_spec]).result()
    _chance = 1 / len(SHAPES)
    mo.vstack([
        mo.md(f"Accuracy on a held-out batch after {_spec.steps} steps: "
              f"**{result.summary['metric']:.0%}** (chance: {_chance:.0%})."),
        mo.hstack([wb.charts.step_times(result.steps.assign(mode=_spec.mode)),
                   wb.charts.loss_curves(result.steps.assign(mode=_spec.mode))]),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    The tiny preset keeps ResNet-18's layers but works on 32x32 pictures with a stride-1 stem.
    **How many times more FLOPs per image does ImageNet `resnet18` (224x224, stride-2 stem and
    max-pool) need than `tiny`?** Estimate it from the shapes, then check.
    """)
    return


@app.cell
def _():
    answer = mo.ui.number(start=0.1, stop=100.0, step=0.1, value=1.0, label="resnet18 / tiny")
    answer
    return (answer,)


@app.cell
def _(answer, presets):
    _p = presets.set_index("preset")
    _per_image = _p["gflops_per_step"] / _p["batch_size"]
    _ratio = float(_per_image["resnet18"] / _per_image["tiny"])
    _ok = abs(answer.value - _ratio) / _ratio <= 0.15
    mo.callout(mo.md(
        f"Measured from the analytic FLOP counts: **{_ratio:.2f}x**. " + (
            "Within 15%: the 224 input is 49x the pixels, but the stem and max-pool cut the "
            "resolution by 4 in each dimension before the first block." if _ok else
            f"You said {answer.value:.1f}x. Hint: 224/4 = 56 pixels wide after the stem, "
            "against 32 for tiny.")), kind="success" if _ok else "warn")
    return


if __name__ == "__main__":
    app.run()
