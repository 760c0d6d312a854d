import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="ResNet: convolutions through XLA")

with app.setup:
    import altair as alt
    import marimo as mo
    import torch

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench.exercises import resnet as exercise
    from tpu_workbench.models import get_model, preset_table
    from tpu_workbench.models.resnet import SHAPES

    SMOKE = wb.smoke_mode()
    FAMILY = get_model("resnet")
    TINY = FAMILY.config("tiny")
    # When the training section measures: on open, then on its button (notebook.Sections).
    SECTIONS = nb.Sections()


@app.cell(hide_code=True)
def _():
    mo.md(rf"""
    # ResNet: convolutions through XLA

    torchvision's ResNet-18, from random weights, learning to tell {len(SHAPES)} generated
    shapes apart ({", ".join(SHAPES)}; drawn with torch ops in random colours, sizes and
    places, with pixel noise): {len(SHAPES)} classes, one per shape, so a guess scores
    {1 / len(SHAPES):.0%}. The `tiny` preset is a CIFAR-style ResNet-18 (3x3 stride-1 stem, no
    max-pool) on {TINY.image_size}x{TINY.image_size} images, {TINY.batch_size} a batch: every
    training step sees new images, and the accuracy is measured on {FAMILY.eval_items} others
    it never trained on. `resnet18` and `resnet50` are the ImageNet shapes (224x224, 1,000
    classes) a v6e trains; they are built here only on PyTorch's meta device, for their counts.
    """)
    return


@app.cell
def _():
    _batch = FAMILY.make_batch(TINY, 16, torch.Generator().manual_seed(0))
    _labels = ", ".join(SHAPES[i] for i in _batch["y"].tolist())
    _presets = preset_table("resnet")
    mo.vstack([
        mo.image(wb.image_grid(FAMILY.pixels(_batch["x"]))),
        mo.md(f"Sixteen training images; their labels, left to right, top to bottom: "
              f"{_labels}."),
        nb.table(_presets[["preset", "params", "arch", "image_size", "num_classes",
                           "cifar_stem", "batch_size"]],
                 label="presets: parameters counted on the meta device"),
    ])
    return


@app.cell
def _():
    steps = mo.ui.slider(10, 200, value=60, step=10, label="training steps", show_value=True)
    mode = mo.ui.dropdown(wb.available_modes(), value=wb.default_modes()[-1], label="mode")
    run_button = mo.ui.run_button(label="train")
    mo.vstack([
        mo.hstack([steps, mode, run_button], justify="start", gap=2),
        mo.md("_The first step compiles; every step after it trains on 32 new 32x32 images "
              "through a ResNet-18, which XLA:CPU runs at seconds a step on a laptop's cores. "
              "The run below says how long its steps took here._"),
    ])
    return mode, run_button, steps


@app.cell
def _(mode, run_button, steps):
    _spec = wb.ExperimentSpec(model="resnet", preset="tiny", mode=mode.value,
                              steps=3 if SMOKE else steps.value, capture=("checkpoint",))
    # On open this trains (or shows a stored run of the same spec); then only on **train**.
    _runs = SECTIONS.run_live(
        "train", run_button, [_spec],
        waiting="Press **train** above to train with these settings.")
    result = None if _runs is None else _runs.result()
    _view = None
    if result is not None:
        _steps = result.steps.assign(mode=_spec.mode)
        _timing = wb.summarize_results([result]).iloc[0]
        _x = alt.X("step:Q", title="step", axis=alt.Axis(tickMinStep=1, format="d"),
                   scale=alt.Scale(domain=[0, int(_steps["step"].max())], nice=False))
        _view = mo.vstack([
            mo.md(nb.provenance(result, button="train")),
            mo.md(f"Accuracy on **{result.summary['eval_items']} held-out images** after "
                  f"{_spec.steps} steps of {TINY.batch_size} fresh images each: "
                  f"**{result.summary['metric']:.1%}** (a guess: {1 / len(SHAPES):.0%}). "
                  f"Step times, measured where the line above says: first step "
                  f"{_timing['first_step_ms'] / 1e3:.1f} s (it compiles), steady step "
                  f"{_timing['steady_median_ms'] / 1e3:.2f} s (median), "
                  f"{int(_timing['compiles_steady'])} compilations in the steady state; the "
                  f"{_spec.steps} steps took **{nb.format_us(result.steps['wall_ms'].sum() * 1e3)}"
                  "** in all."),
            mo.hstack([wb.charts.step_times(_steps).encode(x=_x),
                       wb.charts.loss_curves(_steps, title=f"training loss, mode "
                                                           f"{_spec.mode}").encode(x=_x)],
                      wrap=True, justify="start"),
        ])
    _view
    return (result,)


@app.cell
def _(result):
    # The trained weights on 600 more fresh images: which shapes it mixes up.
    held_out, held_out_images = (None, None) if result is None else \
        FAMILY.held_out_predictions(wb.load_trained(result)[2], TINY, n=600)
    confusion = None if held_out is None else mo.ui.altair_chart(
        wb.charts.confusion_matrix(held_out, classes=list(SHAPES)))
    (None if confusion is None else mo.vstack([
        mo.md(f"**What it confuses.** The trained model on {len(held_out)} more images drawn "
              f"afresh: {(held_out['true'] == held_out['predicted']).mean():.1%} right. Each "
              "row is a true shape; the diagonal is right, the rest is what it took the shape "
              f"for. {nb.confusion_text(held_out)}"),
        confusion,
    ]))
    return confusion, held_out, held_out_images


@app.cell
def _(confusion, held_out, held_out_images):
    _pairs = [] if confusion is None else nb.picked(confusion, "true")
    _view = None
    if _pairs:
        _true = _pairs[0]
        _predicted = nb.picked(confusion, "predicted")[0]
        _rows = held_out.index[(held_out["true"] == _true)
                               & (held_out["predicted"] == _predicted)][:24]
        _view = mo.vstack([
            mo.md(f"**{len(_rows)} images** that are a *{_true}* and that the model called a "
                  f"*{_predicted}* (up to 24):"),
            mo.image(wb.image_grid(FAMILY.pixels(held_out_images[list(_rows)]))) if len(_rows) else
            mo.md("_none_"),
        ])
    elif confusion is not None:
        _view = mo.md("_Click a cell of the matrix to see its images._")
    _view
    return


@app.cell(hide_code=True)
def _():
    _tiny = exercise.ratio_facts()["small"]
    mo.md(rf"""
    ## Workshop exercise

    One `tiny` image costs {_tiny["macs"] / 1e6:.0f} M multiply-adds in the forward pass. Its
    3x3 stride-1 stem keeps the {TINY.image_size}x{TINY.image_size} image whole, so the four
    stages of residual blocks run on 16, 8, 4 and 2 pixel-wide feature maps. ImageNet's
    `resnet18` has the same blocks and widths, but a 7x7 **stride-2** stem followed by a
    stride-2 **max-pool**, on 224x224 images. **How many times tiny's FLOPs does one
    `resnet18` image need?** Reason from the feature-map sizes (the classifier's 1,000
    classes barely count), then enter a ratio and press **check**.
    """)
    return


@app.cell
def _():
    answer = mo.ui.text(placeholder="for example 20", label="resnet18 / tiny").form(
        submit_button_label="check", bordered=False)
    answer
    return (answer,)


@app.cell(hide_code=True)
def _():
    # Both presets counted on the meta device, for the check.
    ratio_facts = exercise.ratio_facts()
    return (ratio_facts,)


@app.cell(hide_code=True)
def _(answer, ratio_facts):
    mo.stop(answer.value is None,
            mo.md("_Enter your answer and press **check**; nothing is judged before that._"))
    _kind, _text = exercise.judge_ratio(answer.value, ratio_facts)
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
