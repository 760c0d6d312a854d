import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="UNet: a diffusion model learns to draw, on XLA")

with app.setup:
    import altair as alt
    import marimo as mo
    import pandas as pd
    import torch

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench.exercises import unet as exercise
    from tpu_workbench.models import get_model, preset_table
    from tpu_workbench.models.unet import alphas_cumprod, beside_nearest, picture_scores

    SMOKE = wb.smoke_mode()
    # 16x16 pictures, the UNet predicting the clean picture: flat shapes on black after ~100
    # steps (see the preset's comment in tpu_workbench/models/unet.py).
    PRESET = "pictures16"
    MODE = "lazy" if "lazy" in wb.available_modes() else wb.default_modes()[-1]
    STEPS = 120  # 1.7-6 min on two shared cores (see the note under the controls)
    SAMPLE_SEED = 1  # the same starting noise for the untrained and the trained model
    N_SAMPLES = 8 if SMOKE else 16
    SAMPLE_STEPS = 4 if SMOKE else 20
    # When the training section measures: on open, then on its button (notebook.Sections).
    SECTIONS = nb.Sections()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # UNet: a diffusion model learns to draw, on XLA

    A denoising diffusion model: diffusers' `UNet2DModel` sees a picture with Gaussian noise
    mixed in at a random timestep t and learns to say what the clean picture was. Trained on
    generated pictures (one flat-coloured disc or square on black; nothing is downloaded), it
    then turns pure noise into new pictures: 20 DDIM steps, each asking the UNet for the clean
    picture and stepping towards it. Training runs in a worker through torch_xla (the `lazy`
    mode: the whole step is traced and compiled once); sampling runs here, in plain PyTorch,
    from the weights the worker saved.
    """)
    return


@app.cell
def _():
    family = get_model("unet")
    cfg = family.config(PRESET)
    _batch = family.make_batch(cfg, 16, torch.Generator().manual_seed(0))
    mo.vstack([
        mo.md(f"**What it learns from**: generated {cfg.image_size}x{cfg.image_size} pictures "
              "like these 16. The worker cycles through up to 64 generated batches, and every "
              "step mirrors its pictures and draws fresh noise and timesteps for them, so the "
              "model cannot memorise what it sees."),
        mo.image(wb.image_grid((_batch["x"] + 1) / 2, scale=4)),
    ])
    return cfg, family


@app.cell
def _():
    nb.table(preset_table("unet")[["preset", "params", "batch_size", "image_size",
                                   "block_out_channels", "beta_schedule", "prediction",
                                   "attn_levels"]],
             label="presets: parameters counted on PyTorch's meta device")
    return


@app.cell
def _():
    steps = mo.ui.slider(40, 600, value=STEPS, step=20, label="training steps",
                         show_value=True)
    mode = mo.ui.dropdown(wb.available_modes(), value=MODE, label="mode")
    run_button = mo.ui.run_button(label="train")
    mo.vstack([
        mo.hstack([steps, mode, run_button], justify="start", gap=2),
        mo.md(f"_The first step compiles the UNet's whole training step (forward, backward "
              "and AdamW) into one XLA program; every later step reruns it. Measured while "
              "writing this page, on two CPU cores shared with two other busy sessions: the "
              "compile took 42-165 s and a step 0.48-1.4 s at batch 32 (the busier the cores, "
              f"the longer), so the {STEPS} steps on open took 1.7-6 minutes. `torch_eager` "
              "is plain PyTorch, for comparison._"),
    ])
    return mode, run_button, steps


@app.cell
def _(mode, run_button, steps):
    # Smoke mode (CI): 3 plain-PyTorch steps (an XLA compile alone would take ~40 s).
    _spec = wb.ExperimentSpec(model="unet", preset=PRESET,
                              mode="torch_eager" if SMOKE else mode.value,
                              steps=3 if SMOKE else steps.value, capture=("checkpoint",))
    # On open this trains (or shows a stored run of the same spec); then only on **train**.
    _runs = SECTIONS.run_live(
        "train", run_button, [_spec], chart=wb.charts.loss_curves,
        waiting="Press **train** above to train with these settings.")
    result = None if _runs is None else _runs.result()
    _timing = None if _runs is None else _runs.summary.iloc[0]
    (None if result is None else mo.vstack([
        mo.md(nb.provenance(result, button="train")),
        mo.md(f"**{result.spec.steps} steps in `{result.spec.mode}` mode**: the first step "
              f"took {_timing['first_step_ms'] / 1e3:,.1f} s (compiling, under XLA), the "
              f"steady ones {_timing['steady_median_ms']:,.0f} ms each (median), with "
              f"**{_timing['compiles_total']}** compile(s) in all and "
              f"**{_timing['compiles_steady']}** after the first step. Prediction MSE on "
              f"{result.summary['eval_items']} held-out noisy pictures: "
              f"**{result.summary['metric']:.3f}** (predicting the clean picture, in [-1, 1])."),
        wb.charts.loss_curves(result.steps.assign(mode=result.spec.mode),
                              title="training loss"),
        wb.charts.step_times(result.steps.assign(mode=result.spec.mode)),
    ]))
    return (result,)


@app.cell
def _(cfg, family, result):
    # The same initial weights the worker trained from (seed 0), sampled from the same noise.
    if result is not None:
        _, _cfg, _trained = wb.load_trained(result)
        torch.manual_seed(0)
        _untrained = family.build(cfg).eval()
        with mo.status.spinner(title=f"sampling {N_SAMPLES} pictures twice (DDIM, on the CPU)"):
            samples = {
                "untrained": family.sample(_untrained, cfg, n=N_SAMPLES, steps=SAMPLE_STEPS,
                                           generator=torch.Generator().manual_seed(SAMPLE_SEED)),
                "trained": family.sample(_trained, _cfg, n=N_SAMPLES, steps=SAMPLE_STEPS,
                                         generator=torch.Generator().manual_seed(SAMPLE_SEED)),
            }
    else:
        samples = None
    return (samples,)


@app.cell
def _(cfg, result, samples):
    (None if samples is None else mo.vstack([
        mo.md(f"**Sampled from the same pure noise** ({SAMPLE_STEPS} DDIM steps) after "
              f"{result.spec.steps} training steps. Each row of samples has, below it, the "
              "nearest of 512 freshly generated training pictures to each sample (RMS pixel "
              "distance): a sample that looks like its neighbour below is a picture the task "
              "could have drawn."),
        mo.image(wb.image_grid(beside_nearest(samples["trained"], cfg.image_size), scale=4)),
        mo.md("**The untrained model** (the same starting weights), from the same noise, "
              "above its nearest pictures:"),
        mo.image(wb.image_grid(beside_nearest(samples["untrained"], cfg.image_size), scale=4)),
    ]))
    return


@app.cell
def _(cfg, family, result, samples):
    if samples is not None:
        _real = (family.make_batch(cfg, N_SAMPLES, torch.Generator().manual_seed(7))["x"]
                 + 1) / 2
        scores = pd.DataFrame([
            {"pictures": f"{N_SAMPLES} generated training pictures",
             **picture_scores(_real, cfg.image_size)},
            {"pictures": "the untrained model's samples",
             **picture_scores(samples["untrained"], cfg.image_size)},
            {"pictures": f"samples after {result.spec.steps} steps",
             **picture_scores(samples["trained"], cfg.image_size)},
        ])
    else:
        scores = None
    (None if scores is None else mo.vstack([
        mo.md("**What the training bought**, measured on the pictures above: the share of "
              "black background pixels (every channel below 0.1), and the RMS distance (0-1 "
              "pixel scale) from each picture to the nearest of 512 other generated training "
              "pictures, averaged. Training pictures set the mark."),
        nb.table(scores, label="scores"),
        mo.md(f"**What {STEPS} steps buy** (the run on open): one shape per picture, in its "
              "place and about its size, on a black background, with soft edges and at times "
              "a mixed colour. More steps sharpen them: in plain "
              "PyTorch, 400 steps gave mostly flat, single-colour shapes with sharper edges "
              "(measured while writing this page: 74.8% black, nearest RMS 0.100, 32 "
              "samples). Set the slider to 400 and press **train** to see it here (by the "
              "step times above, 4-12 minutes on XLA:CPU)."),
    ]))
    return (scores,)


@app.cell(hide_code=True)
def _(cfg):
    mo.md(rf"""
    ## Workshop exercise

    At timestep $t$ the model sees $\sqrt{{\bar\alpha_t}}\,x + \sqrt{{1-\bar\alpha_t}}\,\epsilon$:
    the picture $x$ scaled down, plus noise. This page's preset uses the cosine schedule of
    Nichol & Dhariwal (2021) over $T = {cfg.num_train_timesteps}$ steps:
    $\bar\alpha_t = f(t) / f(0)$ with
    $f(t) = \cos^2\!\big(\tfrac{{t/T + s}}{{1 + s}} \cdot \tfrac{{\pi}}{{2}}\big)$ and
    $s = 0.008$. **What is the picture's scale $\sqrt{{\bar\alpha_t}}$ at
    $t = {exercise.T}$?** Reason it out (no calculator needed to two digits), enter a number
    from 0 to 1 and press **check**; the whole schedule is drawn after you answer.
    """)
    return


@app.cell
def _():
    signal_answer = mo.ui.text(placeholder="from 0 to 1", label="picture's scale at t").form(
        submit_button_label="check", bordered=False)
    signal_answer
    return (signal_answer,)


@app.cell(hide_code=True)
def _():
    # The schedule read from diffusers' scheduler, for the check.
    signal_facts = exercise.signal_facts()
    return (signal_facts,)


@app.cell(hide_code=True)
def _(signal_answer, signal_facts):
    mo.stop(signal_answer.value is None,
            mo.md("_Enter your answer and press **check**; nothing is judged before that._"))
    _kind, _text = exercise.judge_signal(signal_answer.value, signal_facts)
    mo.callout(mo.md(_text), kind=_kind)
    return


@app.cell
def _(cfg, signal_answer):
    mo.stop(signal_answer.value is None)  # the schedule is drawn once an answer is in
    _acp = alphas_cumprod(cfg)
    _schedule = pd.DataFrame({"t": range(len(_acp)), "picture": _acp.sqrt().numpy(),
                              "noise": (1 - _acp).sqrt().numpy()})
    alt.Chart(_schedule.melt("t", var_name="part", value_name="scale")).mark_line().encode(
        x=alt.X("t:Q", title="timestep t", axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("scale:Q", title="scale"),
        color=alt.Color("part:N", title="multiplies the", sort=["picture", "noise"]),
        tooltip=["t", "part", alt.Tooltip("scale:Q", format=".3f")],
    ).properties(title=f"the {cfg.beta_schedule} schedule: noisy = picture scale * picture + "
                       "noise scale * noise", width=480, height=180)
    return


if __name__ == "__main__":
    app.run()
