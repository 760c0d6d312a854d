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
    from tpu_workbench.models.unet import picture_scores

    SMOKE = wb.smoke_mode()
    PRESET = "pictures16"  # 16x16 pictures: learns to draw in a few hundred steps on a CPU
    SAMPLE_SEED = 1  # the same starting noise for the untrained and the trained model
    N_SAMPLES = 8 if SMOKE else 16
    SAMPLE_STEPS = 5 if SMOKE else 50


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # UNet: a diffusion model on XLA

    A denoising diffusion model: diffusers' `UNet2DModel` learns to predict the noise that a
    DDPM schedule added to a picture at a random timestep. Trained on generated pictures (one
    flat-coloured disc or square on black; nothing is downloaded), it then turns pure noise
    into new pictures, 50 DDIM steps at a time. Training runs in a worker (plain PyTorch or
    XLA); sampling runs here, in plain PyTorch, from the weights the worker saved.
    """)
    return


@app.cell
def _():
    family = get_model("unet")
    cfg = family.config(PRESET)
    _batch = family.make_batch(cfg, 16, torch.Generator().manual_seed(0))
    mo.vstack([
        mo.md(f"**What it learns from**: generated {cfg.image_size}x{cfg.image_size} pictures "
              "like these 16 (the model sees them with noise added; the schedule below says "
              "how much)."),
        mo.image(wb.image_grid((_batch["x"] + 1) / 2, scale=4)),
    ])
    return cfg, family


@app.cell
def _():
    _presets = preset_table("unet")
    nb.table(_presets.iloc[:, :6], label="presets")
    return


@app.cell
def _(cfg, family):
    _acp = family.build(cfg).alphas_cumprod
    schedule = pd.DataFrame({"t": range(len(_acp)), "signal": _acp.sqrt().numpy(),
                             "noise": (1 - _acp).sqrt().numpy()})
    alt.Chart(schedule.melt("t", var_name="part", value_name="scale")).mark_line().encode(
        x=alt.X("t:Q", title="timestep t", axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("scale:Q", title="scale (multiplies the picture or the noise)"),
        color=alt.Color("part:N", title="part", sort=["signal", "noise"]),
        tooltip=["t", "part", alt.Tooltip("scale:Q", format=".3f")],
    ).properties(title=f"{cfg.beta_schedule} schedule: noisy = signal * picture + noise * eps",
                 width=480, height=180)
    return (schedule,)


@app.cell
def _():
    train_form = mo.md(
        "{steps} {mode}\n\n_`torch_eager` (plain PyTorch) trains the default 500 steps in a "
        "few minutes on two CPU cores. The XLA modes (`eager`, `lazy`, `compile`, `dynamo`) first "
        "compile the UNet's training step: on XLA:CPU that takes minutes._"
    ).batch(
        steps=mo.ui.slider(50, 1500, value=500, step=50, label="training steps",
                           show_value=True),
        mode=mo.ui.dropdown(wb.available_modes(), value="torch_eager", label="mode"),
    ).form(submit_button_label="run", bordered=False)
    train_form
    return (train_form,)


@app.cell
def _(train_form):
    # On open: the defaults, reusing a stored run of them if there is one; after that only a
    # press of "run" trains (and measures again). Smoke mode (CI): 3 plain-PyTorch steps.
    _choice = train_form.value or {"steps": 500, "mode": "torch_eager"}
    spec = wb.ExperimentSpec(model="unet", preset=PRESET,
                             mode="torch_eager" if SMOKE else _choice["mode"],
                             steps=3 if SMOKE else _choice["steps"], capture=("checkpoint",))
    result = nb.run_live([spec], chart=lambda f: wb.charts.loss_curves(f, "training loss"),
                         reuse=nb.reuse_ok() and train_form.value is None).result()
    mo.vstack([
        mo.md(nb.provenance(result)),
        mo.md(f"Trained {spec.steps} steps in `{spec.mode}` mode: noise-prediction MSE on "
              f"{result.summary['eval_items']} held-out pictures "
              f"**{result.summary['metric']:.3f}** (1.0 = predicting zero noise)."),
        wb.charts.loss_curves(result.steps.assign(mode=spec.mode), "training loss"),
    ])
    return result, spec


@app.cell
def _(cfg, family, result):
    _, _cfg, _trained = wb.load_trained(result)
    torch.manual_seed(0)  # the same initial weights the worker trained from (seed 0)
    _untrained = family.build(cfg).eval()
    with mo.status.spinner(title=f"sampling {N_SAMPLES} pictures twice (DDIM, on the CPU)"):
        before = family.sample(_untrained, cfg, n=N_SAMPLES, steps=SAMPLE_STEPS,
                               generator=torch.Generator().manual_seed(SAMPLE_SEED))
        after = family.sample(_trained, _cfg, n=N_SAMPLES, steps=SAMPLE_STEPS,
                              generator=torch.Generator().manual_seed(SAMPLE_SEED))
    return after, before


@app.cell
def _(after, before, spec):
    mo.vstack([
        mo.md(f"**Sampled from the same pure noise** ({SAMPLE_STEPS} DDIM steps) by the "
              "untrained model (top) and after "
              f"{spec.steps} training steps (bottom):"),
        mo.image(wb.image_grid(before, scale=4)),
        mo.image(wb.image_grid(after, scale=4)),
    ])
    return


@app.cell
def _(after, before, cfg, family, spec):
    _real = (family.make_batch(cfg, N_SAMPLES, torch.Generator().manual_seed(7))["x"] + 1) / 2
    scores = pd.DataFrame([
        {"pictures": "generated training pictures", **picture_scores(_real, cfg.image_size)},
        {"pictures": "untrained model's samples", **picture_scores(before, cfg.image_size)},
        {"pictures": f"samples after {spec.steps} steps", **picture_scores(after, cfg.image_size)},
    ])
    mo.vstack([
        mo.md("**What the training bought**, measured on the pictures above: the share of "
              "black background pixels, and the distance (RMS, 0-1 pixel scale) from each "
              "picture to the nearest of 512 other generated training pictures, averaged."),
        nb.table(scores, label="scores"),
    ])
    return (scores,)


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    At timestep $t$ a training picture is mixed as
    $\sqrt{\bar\alpha_t}\,x + \sqrt{1-\bar\alpha_t}\,\epsilon$. **At which timestep does the
    noise first weigh as much as the signal** ($\bar\alpha_t \le 0.5$)? Read it off the
    schedule chart (hover over the lines for values) and check your answer.
    """)
    return


@app.cell
def _(schedule):
    answer = mo.ui.text(placeholder="a timestep, e.g. 100", label="timestep t").form(
        submit_button_label="check", bordered=False)
    last_t = len(schedule) - 1
    answer
    return answer, last_t


@app.cell
def _(answer, last_t, schedule):
    mo.stop(answer.value is None, mo.md("_Enter a timestep and press **check**._"))
    try:
        _guess = int(str(answer.value).strip())
    except ValueError:
        _guess = None
    mo.stop(_guess is None or not 0 <= _guess <= last_t,
            mo.callout(mo.md(f"Enter a whole timestep from 0 to {last_t} "
                             f"(you entered {str(answer.value)!r})."), kind="warn"))
    _t = int(schedule[schedule["signal"] <= schedule["noise"]]["t"].iloc[0])
    _ok = abs(_guess - _t) <= 15
    mo.callout(mo.md(
        f"Right: the noise catches up with the signal at **t = {_t}** of {len(schedule)} "
        f"(you said {_guess})." if _ok else
        f"You said {_guess}: not quite. Find where the signal and noise curves cross."),
        kind="success" if _ok else "warn")
    return


if __name__ == "__main__":
    app.run()
