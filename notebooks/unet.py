import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="UNet: a diffusion model on XLA")

with app.setup:
    import altair as alt
    import marimo as mo
    import pandas as pd
    import torch

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench.models import get_model, preset_table

    SMOKE = wb.smoke_mode()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # UNet: a diffusion model on XLA

    A denoising diffusion model: diffusers' `UNet2DModel` learns to predict the noise that a
    DDPM schedule added to an image, at a random timestep. Trained on generated pictures of
    shapes (nothing is downloaded), it then turns pure noise into new pictures, step by step.
    Training runs through XLA in a worker; sampling runs here, in plain PyTorch, from the
    trained weights the worker saved.
    """)
    return


@app.cell
def _():
    family = get_model("unet")
    cfg = family.config("tiny")
    _batch = family.make_batch(cfg, 16, torch.Generator().manual_seed(0))
    mo.vstack([
        mo.md("**What it learns from**: 16 generated training images (the model sees them with "
              "noise added; the schedule below says how much)."),
        mo.image(wb.image_grid((_batch["x"] + 1) / 2)),
        nb.table(preset_table("unet").iloc[:, :6], label="presets"),
    ])
    return cfg, family


@app.cell
def _(cfg):
    _acp = get_model("unet").build(cfg).alphas_cumprod
    schedule = pd.DataFrame({"t": range(len(_acp)), "signal": _acp.sqrt().numpy(),
                             "noise": (1 - _acp).sqrt().numpy()})
    alt.Chart(schedule.melt("t", var_name="part", value_name="scale")).mark_line().encode(
        x="t:Q", y="scale:Q", color="part:N").properties(
        title="DDPM schedule: noisy = signal * image + noise * eps", width=480, height=180)
    return (schedule,)


@app.cell
def _():
    steps = mo.ui.slider(20, 400, value=150, step=10, label="training steps", show_value=True)
    mode = mo.ui.dropdown(wb.available_modes(), value=wb.default_modes()[-1], label="mode")
    mo.hstack([steps, mode], justify="start", gap=2)
    return mode, steps


@app.cell
def _(mode, steps):
    # Smoke mode (CI) trains 3 steps in plain PyTorch: XLA's compile of the UNet step alone
    # takes tens of seconds on two cores.
    _spec = wb.ExperimentSpec(model="unet", preset="tiny",
                              mode="torch_eager" if SMOKE else mode.value,
                              steps=3 if SMOKE else steps.value, capture=("checkpoint",))
    _n = _spec.steps
    result = wb.run_live([_spec], chart=wb.charts.loss_curves).result()
    _steps = result.steps.assign(mode=_spec.mode)
    mo.vstack([
        mo.md(f"Trained {_n} steps in `{_spec.mode}` mode: noise-prediction MSE on a held-out "
              f"batch **{result.summary['metric']:.3f}** (1.0 = predicting zero noise)."),
        wb.charts.loss_curves(_steps),
    ])
    return (result,)


@app.cell
def _(family, result):
    _, _cfg, _model = wb.load_trained(result)
    with mo.status.spinner(title="sampling 16 pictures (DDIM, on the CPU)"):
        _images = family.sample(_model, _cfg, n=8 if SMOKE else 16, steps=5 if SMOKE else 40,
                                generator=torch.Generator().manual_seed(1))
    mo.vstack([mo.md("**Sampled from pure noise by the trained model** (more training steps "
                     "give cleaner shapes):"), mo.image(wb.image_grid(_images))])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    At timestep $t$ a training image is mixed as
    $\sqrt{\bar\alpha_t}\,x + \sqrt{1-\bar\alpha_t}\,\epsilon$. **At which timestep does the
    noise first weigh as much as the signal** ($\bar\alpha_t \le 0.5$)? Read it off the schedule
    chart and enter it.
    """)
    return


@app.cell
def _():
    answer = mo.ui.number(start=0, stop=999, value=500, label="timestep t")
    answer
    return (answer,)


@app.cell
def _(answer, schedule):
    _t = int(schedule[schedule["signal"] <= schedule["noise"]]["t"].iloc[0])
    _ok = abs(answer.value - _t) <= 15
    mo.callout(mo.md(f"The noise catches up with the signal at **t = {_t}** of "
                     f"{len(schedule)}. " + ("Close enough: well read." if _ok else
                     f"You said {answer.value}: find where the two curves cross.")),
               kind="success" if _ok else "warn")
    return


if __name__ == "__main__":
    app.run()
