import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="ResNet: convolutions through XLA")

with app.setup:
    import altair as alt
    import marimo as mo
    import torch

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench.models import get_model, preset_table
    from tpu_workbench.models.resnet import SHAPES

    SMOKE = wb.smoke_mode()
    # What the page trains on open, without a click.
    DEFAULTS = {"steps": 60, "mode": wb.default_modes()[-1]}


@app.function
def flops_verdict(answer: float | None, ratio: float) -> tuple[str, str]:
    """(callout kind, markdown) for the exercise: a prompt until an answer is submitted, a
    range message outside 0.1-1000, else the ratio and whether the answer is within 15%."""
    if answer is None:
        return "neutral", "Enter a ratio and press **check**."
    if not 0.1 <= answer <= 1000:
        return "danger", f"{answer:g} is not a plausible ratio: enter a number from 0.1 to 1000."
    if abs(answer - ratio) / ratio <= 0.15:
        return "success", (
            f"Right: **{ratio:.2f}x** from the analytic FLOP counts (you said {answer:g}x). "
            "The 224 input is 49x the pixels, but the stem and max-pool cut the resolution by "
            "4 in each dimension before the first block.")
    return "warn", (
        f"The analytic FLOP counts give **{ratio:.2f}x**; you said {answer:g}x. Hint: "
        "224/4 = 56 pixels wide after the stem and max-pool, against 32 for tiny.")


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # ResNet: convolutions through XLA

    torchvision's ResNet builders, from random weights, learning to tell generated shapes apart
    (disk, square, triangle, bars, ring: drawn with torch ops, in random colours, sizes and
    places, with noise): six classes, one per shape. The `tiny` preset is a CIFAR-style
    ResNet-18 (3x3 stem, no max-pool) on 16x16 images, 32 a batch, which trains at interactive
    speed on a laptop; every step sees new images, and the accuracy below is measured on 512
    others it never trained on. `resnet18` and `resnet50` are the ImageNet shapes a v6e trains.
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
    steps = mo.ui.slider(10, 200, value=DEFAULTS["steps"], step=10, label="training steps",
                         show_value=True)
    mode = mo.ui.dropdown(wb.available_modes(), value=DEFAULTS["mode"], label="mode")
    run_button = mo.ui.run_button(label="train")
    mo.vstack([
        mo.hstack([steps, mode, run_button], justify="start", gap=2),
        mo.md("_ResNet on XLA:CPU is slow: the default 60 steps take a few minutes on a "
              "laptop (the first step compiles), 200 steps several more._"),
    ])
    return mode, run_button, steps


@app.cell
def _(mode, run_button, steps):
    _pick = {"steps": steps.value, "mode": mode.value}
    # On open (default settings) this runs by itself; other settings wait for **train**.
    mo.stop(_pick != DEFAULTS and not run_button.value,
            mo.md("_Settings changed: press **train** to train with them (minutes)._"))
    # Smoke mode (CI) trains 3 steps in plain PyTorch; full mode runs the picked mode.
    _spec = wb.ExperimentSpec(model="resnet", preset="tiny",
                              mode="torch_eager" if SMOKE else _pick["mode"],
                              steps=3 if SMOKE else _pick["steps"])
    # Without a click this shows a stored run of the same spec if there is one.
    result = wb.run_live([_spec], reuse=nb.reuse_ok() and not run_button.value).result()
    _chance = 1 / len(SHAPES)
    mo.vstack([
        mo.md(nb.provenance(result, button="train")),
        mo.md(f"Accuracy on {result.summary['eval_items']} held-out images after "
              f"{_spec.steps} steps: **{result.summary['metric']:.0%}** (chance: {_chance:.0%})."),
    ])
    return (result,)


@app.cell
def _(result):
    # Both charts end at the last step trained (no empty axis past it).
    run_steps = result.steps.assign(mode=result.spec.mode)
    step_x = alt.X("step:Q", title="step", axis=alt.Axis(tickMinStep=1, format="d"),
                   scale=alt.Scale(domain=[0, int(run_steps["step"].max())], nice=False))
    wb.charts.step_times(run_steps).encode(x=step_x)
    return run_steps, step_x


@app.cell
def _(result, run_steps, step_x):
    wb.charts.loss_curves(run_steps, title=f"training loss, mode {result.spec.mode}").encode(
        x=step_x)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    The tiny preset keeps ResNet-18's layers but works on 32x32 pictures with a stride-1 stem.
    **How many times more FLOPs per image does ImageNet `resnet18` (224x224, stride-2 stem and
    max-pool) need than `tiny`?** Estimate it from the shapes (or from `gflops_per_step` and
    `batch_size` in the presets table), then check.
    """)
    return


@app.cell
def _():
    answer = mo.ui.number(start=-1000, stop=10000, step=0.1, value=1.0,
                          label="resnet18 / tiny").form(submit_button_label="check",
                                                        bordered=False)
    answer
    return (answer,)


@app.cell
def _(presets):
    _p = presets.set_index("preset")
    _per_image = _p["gflops_per_step"] / _p["batch_size"]
    flops_ratio = float(_per_image["resnet18"] / _per_image["tiny"])
    return (flops_ratio,)


@app.cell
def _(answer, flops_ratio):
    _kind, _text = flops_verdict(answer.value, flops_ratio)
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
