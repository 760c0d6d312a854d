import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Plan a run: the v6e's answer, from a laptop")

with app.setup:
    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench import sharding
    from tpu_workbench.exercises import plan_a_run as exercise

    SMOKE = wb.smoke_mode()
    # The plan on open: a real Llama-3-8B step (a tiny minGPT in smoke runs, CI).
    HF = not SMOKE
    DEFAULT_PLAN = {"model": "hf:llama" if HF else "mingpt",
                    "preset": "llama-3-8b" if HF else "gpt-mini",
                    "slices": ["v6e-8", "v6e-16"] if HF else ["v6e-4"],
                    "strategies": ["fsdp", "dp_tp"] if HF else ["fsdp"],
                    "seq_len": 2048 if HF else 16, "batch": 32 if HF else 8,
                    "recompute": HF, "attention": "flash" if HF else "eager",
                    "optimizer": "adamw"}
    EXERCISE_PARAMS = 2_700_000_000


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # Plan a run: the v6e's answer, from a laptop

    Before renting a slice: does this model fit it, how fast would it train, and what would
    hold it back? The workbench traces the training step here (torch_xla on virtual devices;
    nothing runs) and hands it to **libtpu, the TPU's own compiler**, for each slice: it
    partitions the step, fuses it, schedules its collectives and assigns every buffer of a
    chip's HBM, as it would on the TPU VM. From that compiled program the step time is
    **predicted**: each op on the chip's roofline, the collectives on the slice's torus, the
    asynchronous ones hidden behind compute where there is compute to hide them. Beside it,
    the instant **estimate** of memory per chip by the workbench's one memory convention
    (below).

    ### The record: how far predictions have been from real runs

    Every published v6e run in the workbench's table (MaxText's tpu-recipes and torchprime,
    each with its source file and commit) predicted the same way, by
    `scripts/bench_predict.py --record`. The one fitted constant was fitted on one run (hollow)
    and judged on the others.
    """)
    return


@app.cell
def _():
    record = wb.validation()
    mo.hstack([
        wb.predicted_vs_published(record),
        mo.vstack([
            mo.md(wb.validation_summary(record)),
            nb.table(record[["id", "model", "slice", "workbench_strategy", "global_batch",
                             "seq_len", "published_s", "predicted_s", "ratio", "reason"]],
                     label="published runs and their predictions"),
        ]),
    ], widths=[1, 1])
    return (record,)


@app.cell(hide_code=True)
def _():
    mo.callout(mo.md(sharding.CONVENTION), kind="neutral")
    return


@app.cell
def _():
    plan = mo.md("""
    {model} {preset} {slices} {strategies}

    {seq_len} {batch} {recompute} {attention} {optimizer}
    """).batch(
        model=mo.ui.dropdown(wb.model_names(), value=DEFAULT_PLAN["model"], label="model"),
        preset=mo.ui.text(value=DEFAULT_PLAN["preset"], label="preset"),
        slices=mo.ui.multiselect(list(wb.slice_table()["slice"]),
                                 value=DEFAULT_PLAN["slices"], label="slices"),
        strategies=mo.ui.multiselect(list(sharding.STRATEGIES),
                                     value=DEFAULT_PLAN["strategies"], label="strategies"),
        seq_len=mo.ui.number(start=2, stop=131072, step=2, value=DEFAULT_PLAN["seq_len"],
                             label="sequence length"),
        batch=mo.ui.number(start=1, stop=65536, value=DEFAULT_PLAN["batch"],
                           label="global batch"),
        recompute=mo.ui.checkbox(value=DEFAULT_PLAN["recompute"],
                                 label="activation checkpointing (hf:*)"),
        attention=mo.ui.dropdown(["eager", "flash"], value=DEFAULT_PLAN["attention"],
                                 label="attention (flash: torch_xla's Pallas kernel, hf:*)"),
        optimizer=mo.ui.dropdown(list(wb.OPTIMIZERS), value=DEFAULT_PLAN["optimizer"],
                                 label="optimizer (adafactor: a row and a column per matrix)"),
    ).form(submit_button_label="predict (libtpu compiles each slice and strategy: about "
                 "2 minutes for Llama-3-8B's blocks on 2 cores, then cached)")
    plan
    return (plan,)


@app.cell
def _(plan):
    # The estimate is instant: it is drawn for the plan above before anything compiles.
    _v = plan.value or DEFAULT_PLAN
    plan_kwargs = dict(slices=_v["slices"], strategies=_v["strategies"],
                       seq_len=int(_v["seq_len"]), batch_size=int(_v["batch"]),
                       recompute=_v["recompute"], optimizer=_v["optimizer"])
    plan_model = (_v["model"], _v["preset"].strip(), None if _v["attention"] == "eager"
                  else _v["attention"])
    try:
        fit_plan = wb.fit_check(*plan_model[:2], **plan_kwargs, attention=plan_model[2])
        mo.output.replace(mo.vstack([
            mo.md(f"### Memory per chip, estimated\n\n{plan_model[0]} {plan_model[1]}, "
                  f"global batch {_v['batch']} x {_v['seq_len']} tokens. _By the convention "
                  "above: a formula, not a compile._"),
            wb.charts.fit_bars(fit_plan)]))
    except wb.WorkbenchError as _exc:
        fit_plan = None
        mo.output.replace(mo.callout(mo.md(f"**No plan.** {_exc}"), kind="danger"))
    return fit_plan, plan_kwargs, plan_model


@app.cell
def _(fit_plan, plan, plan_kwargs, plan_model):
    predicted = None
    if fit_plan is not None and plan.value is None:
        mo.output.replace(mo.callout(mo.md(
            "**Compiled for each slice by libtpu** once you press **predict** above (nothing "
            "is compiled before that; a slice compiled before is read from the cache)."),
            kind="info"))
    elif fit_plan is not None:
        try:
            with mo.status.spinner(title="libtpu compiles the step for each slice") as _spin:
                predicted = wb.predict(*plan_model[:2], **plan_kwargs, attention=plan_model[2],
                                       on_progress=lambda _m: _spin.update(subtitle=_m))
            mo.output.replace(wb.predicted_step_times(predicted))
        except wb.WorkbenchError as _exc:
            mo.output.replace(mo.callout(mo.md(f"**Nothing predicted.** {_exc}"),
                                         kind="danger"))
    return (predicted,)


@app.cell
def _(predicted, record):
    mo.stop(predicted is None)
    mo.vstack([
        nb.table(nb.prediction_table(predicted),
                 label="predicted per slice and strategy from libtpu's compile (not run)"),
        mo.md("**How far the closest checked runs were off** (same family, slice size and "
              "strategy count most):"),
        nb.table(wb.validation_record(predicted, record),
                 label="closest published runs per plan"),
        mo.md("**Assumptions of every predicted number:**\n\n" + "\n".join(
            f"- {_a}" for _a in predicted.attrs["assumptions"])),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    **What the workbench cannot show you here.** The times are a model of the compiled
    program, not a run: input pipelines, host overheads, stragglers and a busy ICI are not in
    them. `tpu-workbench acceptance` on a TPU VM measures a real step against this
    prediction.

    ## Workshop exercise

    A **2.7B-parameter** model trained in fp32 with Adam, on one v6e-8 host. **How many GB of
    training state (weights, gradients and Adam's moments) does each chip hold under
    `fsdp`?** Work it out from the convention above; then say to yourself whether `dp` would
    fit, and check. (Activations come on top; leave them out.)
    """)
    return


@app.cell
def _():
    answer = mo.ui.number(start=0, stop=1e5, step=0.01, label="GB per chip").form(
        submit_button_label="check", bordered=False)
    answer
    return (answer,)


@app.cell(hide_code=True)
def _(answer):
    # Judged by tpu_workbench/exercises/plan_a_run.py with the one memory convention.
    _kind, _text = (("neutral", "_Enter a number and press **check**._")
                    if answer.value is None else exercise.judge(answer.value, EXERCISE_PARAMS))
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
