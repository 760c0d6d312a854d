import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Sharding: a model laid out on a TPU host")

with app.setup:
    import marimo as mo
    import pandas as pd

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench import sharding
    from tpu_workbench.exercises import sharding as exercise

    SMOKE = wb.smoke_mode()
    # What the page measures on open, before any control is submitted.
    DEFAULT_SETUP = {"model": "mingpt", "mesh": "v6e-8"}
    DEFAULT_STRATEGY = "dp_tp"


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # Sharding: a model laid out on a TPU host

    On a TPU slice one program runs on every chip; **SPMD** sharding says which slice of every
    tensor each chip holds, and XLA's partitioner turns the global program into a per-chip one,
    inserting the collectives (all-reduce, all-gather...) the layout needs. Here virtual XLA:CPU
    devices stand in for the chips: the SPMD partitioner is the same, so the layouts are the
    ones a v6e's program gets. The collectives listed are those left in XLA:CPU's optimised
    step (the partitioner inserted them; XLA:CPU's later passes may merge some, and the TPU's
    compiler would combine, reorder and overlap them its own way). Pick a mesh shaped like a
    real slice and a strategy, then see every tensor's layout, the memory each device holds,
    the collectives, and what they would cost on the ICI of a v6e slice of that many chips.
    """)
    return


@app.cell
def _():
    setup = mo.md("{model} {mesh}").batch(
        model=mo.ui.dropdown(wb.model_names(), value=DEFAULT_SETUP["model"], label="model"),
        mesh=mo.ui.dropdown(list(sharding.MESHES), value=DEFAULT_SETUP["mesh"], label="mesh"),
    ).form(submit_button_label="run", label="**Model and mesh** (every section)")
    pick = mo.ui.dropdown(list(sharding.STRATEGIES), value=DEFAULT_STRATEGY,
                          label="strategy").form(
        submit_button_label="run", label="**Strategy** (layout, memory and collectives)")
    # A form sends nothing when submitted unchanged: measuring the same again is this button.
    remeasure = mo.ui.run_button(label="measure again")
    mo.vstack([
        mo.hstack([setup, pick], justify="start", align="start", gap=2),
        mo.md("_The page measured the defaults when it opened. **run** measures a new choice: "
              "a new strategy is one training run; a new model or mesh is that and every "
              "strategy below (four runs on a 2-D mesh). minGPT and the MLP take seconds a run "
              "on XLA:CPU, **ResNet and UNet minutes**._"),
        mo.hstack([remeasure, mo.md("the picked strategy with the same choices")],
                  justify="start", align="center", gap=1),
    ])
    return pick, remeasure, setup


@app.cell
def _(setup):
    # Both sections read the model and mesh from here; only the next one reads the strategy.
    chosen = setup.value or DEFAULT_SETUP
    model_name = chosen["model"]
    mesh_name = chosen["mesh"]
    mesh_shape = tuple(sharding.MESHES[mesh_name])
    # What this model takes on this mesh: the side-by-side section runs every one of them.
    model_strategies = sharding.model_strategies(model_name, "tiny", mesh_shape)
    # (sequences, tokens) of one batch of the model: the exercise doubles it
    exercise_tokens = wb.batch_items(model_name, "tiny")
    return exercise_tokens, mesh_name, mesh_shape, model_name, model_strategies


@app.cell
def _(mesh_name, mesh_shape, model_name, model_strategies, pick, remeasure, setup):
    _asked = pick.value or DEFAULT_STRATEGY
    _strategy = _asked if _asked in model_strategies else "dp"
    _why_not = ""
    if _strategy != _asked:  # the spec's own check says why, in its words
        try:
            wb.ExperimentSpec(model=model_name, preset="tiny", mode="compile", steps=3,
                              mesh=mesh_shape, strategy=_asked).validate()
        except wb.SpecError as _exc:
            _why_not = str(_exc)
    spec = wb.ExperimentSpec(model=model_name, preset="tiny", mode="compile", steps=3,
                             mesh=mesh_shape, strategy=_strategy, capture=("hlo",))
    with mo.status.spinner(title=f"{_strategy} on a {mesh_name} mesh: compiling and training"):
        result = wb.run(spec, reuse=nb.reuse_ok() and setup.value is None
                        and pick.value is None and not remeasure.value)
    layout = sharding.layout_frame(result)
    _note = (f" **{_asked} does not apply here, so this is dp:** {_why_not}"
             if _strategy != _asked else "")
    mo.md(f"""
    ## {sharding.STRATEGIES[_strategy]} on {mesh_name}

    {sharding.mesh_text(mesh_shape)} mesh, {model_name} tiny: {layout['tensor'].nunique()}
    tensors laid out.{_note} {nb.provenance(result, button='measure again')}
    """)
    return layout, result, spec


@app.cell
def _(layout):
    tensor = mo.ui.dropdown(sharding.tensors_by_size(layout),
                            value=sharding.largest_split_tensor(layout), label="tensor")
    tensor
    return (tensor,)


@app.cell
def _(layout, spec, tensor):
    grid = mo.ui.altair_chart(wb.charts.layout_grid(layout, tensor.value, spec.mesh))
    mo.vstack([grid, mo.md("_Click a device for everything it holds._")])
    return (grid,)


@app.cell
def _(grid, layout, tensor):
    _picked = nb.picked(grid, "device_name")
    if _picked:
        _held = sharding.device_holdings(layout, _picked[0])
        _view = nb.table(_held, page_size=8, label=f"what {_picked[0]} holds: "
                         f"{_held['shard_bytes'].sum() / 1e6:,.2f} MB of parameters and inputs")
    else:
        _rows = layout[layout["tensor"] == tensor.value].assign(
            shard_kb=lambda f: f["shard_bytes"] / 1e3)
        _view = nb.table(
            _rows[["device_name", "index_label", "shard_shape", "shard_kb", "num_replicas"]]
            .rename(columns={"index_label": "slice held", "shard_kb": "shard (KB)",
                             "num_replicas": "devices holding it"}),
            page_size=8, label=f"what each device holds of {tensor.value}")
    _view
    return


@app.cell
def _(result):
    memory = sharding.memory_per_device(result)
    _xla = sharding.xla_memory_parts(result)
    _bars = float(memory["total_bytes"].max()) if len(memory) else 0.0
    _mb = 1e6
    _why = "" if _xla is None else f"""
    The black tick is XLA's own total for the compiled step, **{_xla['total_bytes'] / _mb:.2f}
    MB** a device against {_bars / _mb:.2f} MB of bars, because it counts everything the step
    touches: its arguments, {_xla['arguments_bytes'] / _mb:.2f} MB (the parameters, Adam's
    moments and the batch: the bars without the gradients), the updated weights and moments it
    returns in new buffers, {_xla['outputs_bytes'] / _mb:.2f} MB, and temporaries,
    {_xla['temporaries_bytes'] / _mb:.2f} MB (activations, gradients and intermediates). On a
    tiny model the temporaries dominate; on a large one the parameters and Adam state do.
    """
    mo.md(f"""
    ## Memory per device

    **Parameters** and **inputs** are the buffers XLA laid out on each device in this run.
    **Gradients** and **optimizer** state are *derived* from them, not measured: a gradient has
    its parameter's layout (the same bytes), and Adam keeps two moments sharded like it (2 x
    the parameter bytes). Activations are not in the bars. {_why}
    """)
    return (memory,)


@app.cell
def _(memory):
    wb.charts.memory_bars(memory)
    return


@app.cell
def _(result, spec):
    collectives = sharding.collectives_frame(result, chip="v6e", mesh_shape=spec.mesh)
    _total_us = collectives["estimated_us"].sum() if len(collectives) else 0.0
    mo.md(f"""
    ## Collectives XLA inserted

    {len(collectives)} collectives in the partitioned step, moving
    {collectives['bytes'].sum() / 1e6 if len(collectives) else 0:.2f} MB per device. On a v6e
    slice of this shape they would take about **{nb.format_us(_total_us)}** per step if none
    overlapped with compute.

    _{sharding.ici_assumptions("v6e")}_
    """)
    return (collectives,)


@app.cell
def _(collectives, spec):
    (wb.charts.collective_bytes(collectives.assign(strategy=spec.strategy))
     if len(collectives) else mo.md("_No collectives: nothing is split._"))
    return


@app.cell
def _(collectives):
    mo.stop(not len(collectives))
    mo.vstack([
        mo.md("**Where they come from.** Each collective moves the operand of an op of the "
              "model; the HLO's metadata names that op and the Python line behind it. "
              "`aten__native_batch_norm` is LayerNorm: torch_xla lowers `layer_norm` to a "
              "batch norm over a [1, B x T, C] view of the activations, whose B x T axis the "
              "partitioner cannot keep split, so it all-gathers the activations there even "
              "under dp. `aten__mm` all-reduces are the gradients of the matmuls' weights "
              "(and, under tp, the row-parallel layers' outputs)."),
        nb.table(sharding.collectives_by_source(collectives),
                 label="collectives by kind, mesh axis and the op that made them (MB per "
                       "device per step)"),
    ])
    return


@app.cell
def _(collectives):
    _cols = ["kind", "axis", "shape", "kb", "group_size", "source", "estimated_us"]
    _show = collectives.assign(kb=collectives["bytes"] / 1e3).sort_values(
        "kb", ascending=False, ignore_index=True)[_cols].rename(
        columns={"kb": "KB per device", "group_size": "devices", "estimated_us": "v6e est. µs"})
    nb.table(_show, page_size=8, label="each collective (largest first; v6e est.: the ICI "
             "model, not measured)") if len(collectives) else None
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Every strategy, side by side

    The same model and mesh under each strategy (the strategy picked above does not matter
    here): the step time on this host's CPU (eight virtual devices sharing its cores: the
    order of the bars is no prediction for a TPU, where *Plan a run* compiles the step for the
    slice), the collective bytes each strategy puts on the ICI, and
    the training loss, which is the same under every strategy: sharding changes where the
    numbers live, not what they are.
    """)
    return


@app.cell
def _():
    again = mo.ui.run_button(label="run every strategy again")
    again
    return (again,)


@app.cell
def _(again, mesh_shape, model_name, model_strategies, setup):
    _reuse = nb.reuse_ok() and setup.value is None and not again.value
    strategy_runs = []
    for _s in mo.status.progress_bar(model_strategies, title="every strategy",
                                     remove_on_exit=True):
        _spec = wb.ExperimentSpec(model=model_name, preset="tiny", mode="compile",
                                  steps=3 if SMOKE else 6, mesh=mesh_shape, strategy=_s,
                                  capture=("hlo",))
        strategy_runs.append(wb.run(_spec, reuse=_reuse))
    by_strategy = sharding.summary_frame(strategy_runs)
    mo.vstack([mo.md(nb.provenance(strategy_runs, button="run every strategy again")),
               wb.charts.step_time_per_strategy(by_strategy).properties(
                   title="steady step time per strategy on this machine's XLA:CPU "
                         "(median, p10-p90): not a TPU's")])
    return by_strategy, strategy_runs


@app.cell
def _(mesh_shape, strategy_runs):
    _frames = [sharding.collectives_frame(r, chip="v6e", mesh_shape=mesh_shape)
               .assign(strategy=r.spec.strategy) for r in strategy_runs]
    _all = pd.concat([f for f in _frames if len(f)], ignore_index=True) \
        if any(len(f) for f in _frames) else pd.DataFrame()
    (wb.charts.collective_bytes(_all) if len(_all)
     else mo.md("_No strategy here needs a collective._"))
    return


@app.cell
def _(by_strategy, strategy_runs):
    _base = strategy_runs[0].steps.set_index("step")["loss"]
    loss_gap = {r.spec.strategy: float((r.steps.set_index("step")["loss"] - _base).abs().max())
                for r in strategy_runs}
    _show = pd.DataFrame({
        "strategy": by_strategy["strategy"],
        "step (ms)": by_strategy["steady_median_ms"],
        "collectives": by_strategy["collectives"],
        "collective MB": by_strategy["collective_bytes"] / 1e6,
        "params MB/device": by_strategy["params_bytes_per_device"] / 1e6,
        "final loss": by_strategy["final_loss"],
        f"max |loss - {strategy_runs[0].spec.strategy}|": [
            f"{loss_gap[s]:.1e}" if loss_gap[s] else "0" for s in by_strategy["strategy"]],
    })
    mo.vstack([
        nb.table(_show, label="every strategy: steady step time (median), collectives per "
                 "step, parameters on the fullest device, and the loss"),
        mo.md(f"Largest loss difference between strategies at any step: "
              f"**{max(loss_gap.values()):.2g}** (float rounding: the sums run in a "
              f"different order on different devices)."),
    ])
    return (loss_gap,)


@app.cell(hide_code=True)
def _(exercise_tokens):
    mo.md(rf"""
    **Beyond one host.** Training over one process per device (DTensor under `torchrun`, as
    TorchTPU runs) and launching on a v6e-16 or v6e-32: `marimo edit notebooks/scale_out.py`.
    Whether a real-size model fits a slice, and how fast libtpu's compile of its step would
    run: `notebooks/plan_a_run.py`.

    ## Workshop exercise

    The side-by-side table gives what **dp** moves per device in one step of this model, at
    its batch of {exercise_tokens[0]} sequences. **If the batch were twice as large, how many
    MB per device would dp's collectives move per step?** Pick dp above to see where its
    bytes come from, and reason about what each collective carries; then check.
    """)
    return


@app.cell
def _():
    answer = mo.ui.number(start=0, stop=1e6, step=0.001, label="MB per device per step").form(
        submit_button_label="check", bordered=False)
    answer
    return (answer,)


@app.cell(hide_code=True)
def _(answer, exercise_tokens, mesh_shape, strategy_runs):
    # Judged by tpu_workbench/exercises/sharding.py from dp's run above; checking starts nothing.
    _dp = [r for r in strategy_runs if r.spec.strategy == "dp"]
    if answer.value is None or not _dp:
        _kind, _text = "neutral", "_Enter a number and press **check**._"
    else:
        _kind, _text = exercise.judge(
            answer.value, sharding.collectives_frame(_dp[0], chip="v6e", mesh_shape=mesh_shape),
            exercise_tokens[1])
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
