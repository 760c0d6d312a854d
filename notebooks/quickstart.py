import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="tpu-workbench quickstart")

with app.setup:
    import math

    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench import sharding
    from tpu_workbench.exercises import quickstart as exercise

    SMOKE = wb.smoke_mode()
    # Smoke runs (CI) use the smallest model; a user gets the model picked below.
    SMOKE_MODEL = "mlp"
    DEFAULT_MODEL = "mingpt"
    DEFAULT_STEPS = 10
    SLOW_MODELS = ("resnet", "unet")
    SECTIONS = nb.Sections()
    # The training section's runs on open: where they are not stored, workers start now
    nb.warm_for([wb.ExperimentSpec(model=SMOKE_MODEL if SMOKE else DEFAULT_MODEL,
                                   preset="tiny", mode=_m, steps=5 if SMOKE else DEFAULT_STEPS)
                 for _m in wb.default_modes()], cold=True)


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # tpu-workbench: quickstart

    PyTorch reaches a TPU through **XLA**: your model is traced into an XLA program (HLO),
    compiled once, then run step after step. This page is a short tour, for real, on whatever
    machine you are on: what running through XLA costs, what it compiled, and how the model
    is laid out over a TPU host's eight chips. Each section ends with the notebook that goes
    further.

    With no TPU attached everything runs on **XLA:CPU**: the very same HLO a TPU gets, split
    by the same SPMD partitioner, so the traced program, its sharding and its collectives
    carry over to a v6e; the optimised kernels and the times are the CPU's own. Every run
    happens in a separate worker process, and each section measures once when the page opens
    (or shows the run it measured before in this same environment, saying when), then again
    only when you press its **run** button.
    """)
    return


@app.cell
def _():
    # Asked of this process: no worker starts; each run reports what its worker saw.
    backend = wb.describe()
    mo.vstack([
        mo.md("## Where am I running?\n\n" + nb.where_am_i(backend)),
        nb.table(nb.chip_table_view(), label="TPU chips (published figures)", page_size=5),
    ])
    return (backend,)


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Eager vs compiled, live

    Each mode trains the same model from the same random weights on the same generated
    batches, each in a fresh worker so that every first step pays its own compile. Step 0
    includes compiling the step (XLA) or building it (inductor); the steady state follows.
    Times are read after waiting for the device, on this machine. **Click a point** for that
    step's records.
    """)
    return


@app.cell
def _():
    _models = wb.model_names()
    model = mo.ui.dropdown(_models, value=DEFAULT_MODEL if DEFAULT_MODEL in _models
                           else _models[0], label="model")
    # Only the modes this environment runs (plain PyTorch everywhere, XLA where torch_xla is
    # installed, TorchTPU on a chip), the best of them preselected.
    modes = mo.ui.multiselect(wb.available_modes(), value=wb.default_modes(), label="modes")
    steps = mo.ui.slider(5, 100, value=DEFAULT_STEPS, step=5, label="steps", show_value=True)
    run_training = mo.ui.run_button(label="run")
    mo.vstack([
        mo.hstack([model, modes, steps, run_training], justify="start", gap=2),
        mo.md(f"_Every section below uses this model. {' and '.join(SLOW_MODELS)} take "
              "minutes per mode on a CPU._"),
    ])
    return model, modes, run_training, steps


@app.cell
def _(model, modes, run_training, steps):
    _specs = [wb.ExperimentSpec(model=SMOKE_MODEL if SMOKE else model.value, preset="tiny",
                                mode=_m, steps=5 if SMOKE else steps.value)
              for _m in modes.value]
    # A fresh worker per mode (a warm one would serve `compile` the graph `lazy` compiled).
    comparison = (SECTIONS.run_live("training", run_training, _specs, cold=True,
                                    final_chart=False) if _specs else None)
    step_chart = None
    if not _specs:
        mo.output.replace(mo.callout(mo.md("Pick at least one mode above."), kind="info"))
    elif comparison is not None and len(comparison.steps):
        # the live chart, drawn again as a control: a click picks a step
        step_chart = mo.ui.altair_chart(wb.charts.step_times(comparison.steps))
        mo.output.replace(nb.with_chip_metrics(step_chart, nb.chip_samples(comparison.results)))
    return comparison, step_chart


@app.cell
def _(step_chart):
    mo.stop(step_chart is None or not len(step_chart.value))
    nb.table(step_chart.value.drop(columns=["run_id"], errors="ignore"),
             label="the records of the step(s) you clicked")
    return


@app.cell
def _(comparison):
    summary = wb.summarize(comparison.steps) if comparison is not None else None
    (mo.vstack([
        mo.md(nb.provenance(comparison)),
        *nb.run_failures(comparison, summary),
        nb.table(summary[["mode", "first_step_ms", "steady_median_ms", "compiles_total",
                          "compiles_steady", "final_loss"]], label="per mode, on this machine")
        if len(summary) else mo.md(""),
    ]) if comparison is not None else None)
    return (summary,)


@app.cell
def _(comparison):
    mo.stop(comparison is None or not len(comparison.steps))
    wb.charts.loss_curves(comparison.steps)
    return


@app.cell(hide_code=True)
def _(backend, summary):
    mo.stop(summary is None or summary.empty)
    _fast = summary.sort_values("steady_median_ms").iloc[0]
    _why = (
        f"{nb.xla_against_pytorch(summary)} Speed on a CPU is not what XLA is for here: "
        "`lazy` and `compile` build the very program a TPU runs, compiled once "
        "(`compiles_total`) and never again in steady state (`compiles_steady`). A steady "
        "compile is a recompilation, the most common performance bug on TPUs: *eager vs "
        "compiled* shows what causes one."
        if backend["torch_xla_installed"] else
        "This environment has no torch_xla and no TPU chip, so only plain PyTorch runs: eager "
        "against `torch.compile` (inductor). On a TPU the TorchTPU modes join them.")
    mo.md(f"""
    **Reading the numbers.** The fastest steady state on this machine is
    **{_fast["mode"]}**, at {_fast["steady_median_ms"]:.1f} ms a step. {_why}
    → `marimo edit notebooks/eager_vs_compiled.py`
    """)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## What did XLA compile?

    One more `compile` run of the model above, capturing XLA's HLO and a profile. Left, the
    kernels the optimised step runs; right, the ops that took the most time. **Click a bar**
    in either to open that kernel below: its HLO and the lines of the model it came from.
    """)
    return


@app.cell
def _():
    run_hlo = mo.ui.run_button(label="run")
    run_hlo
    return (run_hlo,)


@app.cell
def _(backend, model, run_hlo):
    step = None
    if not backend["torch_xla_installed"]:
        mo.output.replace(mo.callout(mo.md(
            "**Skipped: this environment has no torch_xla** (it is the TorchTPU environment, "
            "`.venv-torchtpu`); the HLO comes from XLA. Run this notebook from `.venv` to see "
            "it."), kind="info"))
    else:
        _spec = wb.ExperimentSpec(model=SMOKE_MODEL if SMOKE else model.value, preset="tiny",
                                  mode="compile", steps=3 if SMOKE else 5,
                                  capture=("hlo", "profile"))
        step = nb.captured_step(SECTIONS.run(
            "hlo", run_hlo, _spec, title="compiling with HLO dumps and profiling",
            waiting=f"Press **run** above to capture {_spec.model}'s HLO and profile."))
    if step is not None:
        mo.output.replace(mo.md(
            f"{nb.provenance(step.result)}\n\nThe optimised step of {step.result.spec.model} "
            f"runs **{len(step.kernels):,} kernels**, "
            f"{int((step.kernels['opcode'] == 'fusion').sum())} of them fusions. FLOPs per "
            f"step: XLA's cost analysis {nb.xla_flops_text(step.summary)}."))
    return (step,)


@app.cell
def _(step):
    kinds = (mo.ui.altair_chart(wb.charts.kernel_mix(step.kernels, top=10, width=300))
             if step else None)
    top = (mo.ui.altair_chart(wb.charts.top_ops(nb.profile_ops(step.result), n=10, width=300))
           if step else None)
    mo.hstack([kinds, top], justify="start", gap=1) if step else None
    return kinds, top


@app.cell
def _(kinds, step, top):
    mo.stop(step is None)
    _name = (nb.picked(top, "hlo_op") or [None])[0]
    _kind = (nb.picked(kinds, "opcode") or ["fusion"])[0]
    if _name is None:  # the biggest kernel of the kind picked (fusion until a click)
        _of = step.kernels[step.kernels["opcode"] == _kind]
        _name = _of.sort_values("ops_inside", ascending=False)["name"].iloc[0]
    _d = step.detail(_name)
    mo.vstack([
        mo.md(f"**`{_d.name}`**" + (f" runs `{_d.kernel}`" if _d.kernel != _d.name else "")
              + f": {len(_d.inside)} instruction(s) fused."),
        nb.code_block(_d.text, max_height_px=110),
        nb.table(_d.sources[["source_op", "file", "line", "code"]],
                 label="the model lines behind it (HLO metadata)") if len(_d.sources)
        else mo.md("_No model line: XLA made this op itself._"),
        mo.md("→ `marimo edit notebooks/hlo_explorer.py` (every kernel, the roofline, the "
              "same step compiled by libtpu for a v6e) and `notebooks/profiling.py`"),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## How is the model laid out on a v6e-8?

    A v6e-8 host has 8 chips in a 2x4 mesh; 8 virtual XLA:CPU devices stand in for them, split
    by the same SPMD partitioner. Pick a mesh and a strategy and press **run**: the grid shows
    which slice of a weight each device holds (same colour = the same slice). **Click a
    device** for everything it holds.
    """)
    return


@app.cell
def _():
    mesh = mo.ui.dropdown({k: k for k, v in sharding.MESHES.items() if math.prod(v) <= 8},
                          value="v6e-8", label="mesh")
    strategy = mo.ui.dropdown(list(sharding.STRATEGIES), value="dp_tp", label="strategy")
    run_layout = mo.ui.run_button(label="run")
    mo.hstack([mesh, strategy, run_layout], justify="start", gap=2)
    return mesh, run_layout, strategy


@app.cell
def _(backend, mesh, model, run_layout, strategy):
    _shape = sharding.MESHES[mesh.value]
    _model = SMOKE_MODEL if SMOKE else model.value
    layout = None
    if backend["torch_xla_installed"]:
        # steps=0: torch_xla places the model on the mesh and reports it; nothing compiles
        _spec = wb.ExperimentSpec(model=_model, preset="tiny", mode="compile", steps=0,
                                  mesh=tuple(_shape), strategy=strategy.value)
        _result = SECTIONS.run("layout", run_layout, _spec,
                               title=f"laying {_model} out on a {mesh.value} mesh",
                               waiting=f"Press **run** above to lay {_model} out with "
                                       f"`{strategy.value}` on {mesh.value}.")
        if _result is not None:
            layout, layout_how = sharding.layout_frame(_result), nb.provenance(_result)
    elif SECTIONS.reuse("layout", run_layout.value) is not None:
        # no torch_xla: DTensor over one process per device
        layout, _shape, layout_how = nb.mesh_layout(_model, _shape, strategy.value,
                                                    smoke=SMOKE)
    layout_mesh = tuple(_shape)
    layout_strategy = strategy.value
    return layout, layout_how, layout_mesh, layout_strategy


@app.cell
def _(layout, layout_how, layout_mesh, layout_strategy):
    largest = sharding.largest_split_tensor(layout) if layout is not None else None
    grid = (mo.ui.altair_chart(wb.charts.layout_grid(layout, largest, layout_mesh))
            if layout is not None else None)
    (mo.vstack([
        mo.md(layout_how),
        mo.md(f"**{sharding.STRATEGIES[layout_strategy]}.** The largest parameter it splits, "
              f"`{largest}`, on the {sharding.mesh_text(layout_mesh)} mesh:"),
        grid,
    ]) if layout is not None else None)
    return grid, largest


@app.cell
def _(grid, layout):
    mo.stop(layout is None)
    _device = (nb.picked(grid, "device_name") or [layout["device_name"].iloc[0]])[0]
    _held = sharding.device_holdings(layout, _device)
    mo.vstack([
        nb.table(_held, page_size=6, label=f"what {_device} holds: "
                 f"{_held['shard_bytes'].sum() / 1e6:,.2f} MB of parameters and inputs"),
        mo.md("→ `marimo edit notebooks/sharding.py`: every tensor, memory per device and "
              "the collectives XLA inserted, for every strategy"),
    ])
    return


@app.cell(hide_code=True)
def _(largest, layout_strategy):
    mo.stop(largest is None)
    mo.md(f"""
    ## Workshop exercise

    The grid shows how `{layout_strategy}` lays out `{largest}`. **Under
    `{exercise.asked_strategy(layout_strategy)}` on the same mesh, how many KB of that weight
    would one device hold?** Reason it out from the weight's shape (in the grid's title) and
    what the strategy splits, then check. Nothing runs to judge it.
    """)
    return


@app.cell
def _():
    answer = mo.ui.number(start=0, stop=1e9, step=0.1, label="KB per device").form(
        submit_button_label="check", bordered=False)
    answer
    return (answer,)


@app.cell(hide_code=True)
def _(answer, largest, layout_mesh, layout_strategy, model):
    # Judged by tpu_workbench/exercises/quickstart.py from the workbench's own sharding plan.
    mo.stop(largest is None)
    if answer.value is None:
        _kind, _text = "neutral", "_Enter a number and press **check**._"
    else:
        _asked = exercise.asked_strategy(layout_strategy)
        _model = SMOKE_MODEL if SMOKE else model.value
        _whole = exercise.held_kb(_model, largest, layout_mesh, "dp")  # dp: all of it
        _kind, _text = exercise.judge(
            answer.value, exercise.held_kb(_model, largest, layout_mesh, _asked), _whole,
            _asked, math.prod(layout_mesh))
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
