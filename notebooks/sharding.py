import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Sharding: a model laid out on a TPU slice")

with app.setup:

    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench import sharding

    SMOKE = wb.smoke_mode()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # Sharding: a model laid out on a TPU slice

    On a TPU slice one program runs on every chip; **SPMD** sharding says which slice of every
    tensor each chip holds, and XLA's partitioner turns the global program into a per-chip one,
    inserting the collectives (all-reduce, all-gather...) the layout needs. Here virtual XLA:CPU
    devices stand in for the chips: the SPMD partitioner is the same, so the layouts and the
    collectives it inserts are the ones a v6e's program gets before backend optimisation (the
    TPU compiler may then combine, reorder or overlap them). Pick a mesh shaped like a real
    slice and a strategy, then see every tensor's layout, the memory each device holds, the
    collectives, and what they would cost on a v6e's ICI.
    """)
    return


@app.cell
def _():
    mesh = mo.ui.dropdown(list(sharding.MESHES), value="v6e-8", label="mesh")
    strategy = mo.ui.dropdown(list(sharding.STRATEGIES), value="dp_tp", label="strategy")
    model = mo.ui.dropdown(wb.model_names(), value="mingpt", label="model")
    mo.hstack([model, mesh, strategy], justify="start", gap=2)
    return mesh, model, strategy


@app.cell
def _(mesh, model, strategy):
    mesh_shape = sharding.MESHES[mesh.value]
    _model = "mlp" if SMOKE else model.value
    _strategy = strategy.value
    if len(mesh_shape) == 1 and _strategy in ("tp", "dp_tp"):
        _strategy = "dp"  # tensor parallelism needs a 2-D (data, model) mesh
    spec = wb.ExperimentSpec(model=_model, preset="tiny", mode="compile", steps=3,
                             mesh=mesh_shape,
                             strategy=_strategy, capture=("hlo",))
    with mo.status.spinner(title=f"{_strategy} on a {mesh.value} mesh: compiling and training"):
        result = wb.run(spec)
    layout = sharding.layout_frame(result)
    mo.md(f"**{sharding.STRATEGIES[_strategy]}** on {mesh.value} "
          f"({sharding.mesh_text(mesh_shape)}), {_model} tiny: "
          f"{layout['tensor'].nunique()} tensors laid out.")
    return layout, mesh_shape, result, spec


@app.cell
def _(layout):
    tensor = mo.ui.dropdown(sharding.tensors_by_size(layout),
                            value=sharding.largest_split_tensor(layout), label="tensor")
    tensor
    return (tensor,)


@app.cell
def _(layout, mesh_shape, tensor):
    _rows = layout[layout["tensor"] == tensor.value]
    mo.vstack([
        wb.charts.layout_grid(layout, tensor.value, mesh_shape),
        nb.table(_rows[["device_name", "row", "col", "index_label", "shard_shape",
                        "shard_bytes", "replica_id", "spec"]], label="what each device holds"),
    ])
    return


@app.cell
def _(result):
    memory = sharding.memory_per_device(result)
    mo.vstack([
        mo.md("""
    ## Memory per device

    **Parameters** and **inputs** are the buffers XLA laid out on each device in this run.
    **Gradients** and **optimizer** state are *derived* from them, not measured: a gradient has
    its parameter's layout (the same bytes), and Adam keeps two moments sharded like it (2 x
    the parameter bytes). The black tick, where shown, is XLA's own total for the compiled step.
    """),
        wb.charts.memory_bars(memory),
    ])
    return


@app.cell
def _(result, spec):
    collectives = sharding.collectives_frame(result, chip="v6e", mesh_shape=spec.mesh)
    _total_us = collectives["estimated_us"].sum() if len(collectives) else 0.0
    mo.vstack([
        mo.md(f"""
    ## Collectives XLA inserted

    {len(collectives)} collectives in the partitioned step. On a v6e slice of this shape they
    would take about **{nb.format_us(_total_us)}** per step if none overlapped with compute.

    _{sharding.ici_assumptions("v6e")}_
    """),
        wb.charts.collective_bytes(collectives.assign(strategy=spec.strategy))
        if len(collectives) else mo.md("_No collectives: nothing is split._"),
        nb.table(collectives.drop(columns=["replica_groups"], errors="ignore"),
                 page_size=8, selection=None),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Every strategy, side by side

    The same model and mesh under each strategy: step time here, and collective bytes (what
    would cross the ICI on a TPU). Losses match the single-device run: sharding changes where
    the numbers live, not what they are.
    """)
    return


@app.cell
def _(spec):
    _strategies = (["dp", "fsdp"] if SMOKE else list(sharding.STRATEGIES)) \
        if len(spec.mesh) == 2 else ["dp", "fsdp"]
    _results = []
    for _s in mo.status.progress_bar(_strategies, title="strategies", remove_on_exit=True):
        _results.append(wb.run(spec.replace(strategy=_s, steps=3 if SMOKE else 6)))
    by_strategy = sharding.summary_frame(_results)
    mo.vstack([
        wb.charts.step_time_per_strategy(by_strategy),
        nb.table(by_strategy),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    **Fit a 2.7B-parameter minGPT on one v6e-8 host** (8 chips of 32 GB HBM each) for training
    in fp32 with Adam: parameters, gradients and Adam's two moments, 16 bytes per parameter in
    all (a 1.3B model would still fit replicated, at 20.8 GB a chip). Pick the strategy and mesh
    you would use.
    """)
    return


@app.cell
def _():
    pick_strategy = mo.ui.dropdown(list(sharding.STRATEGIES), value="dp", label="strategy")
    pick_mesh = mo.ui.dropdown(["v6e-8", "v6e-4"], value="v6e-8", label="mesh")
    mo.hstack([pick_strategy, pick_mesh], justify="start", gap=2)
    return pick_mesh, pick_strategy


@app.cell
def _(pick_mesh, pick_strategy):
    _verdict = sharding.fits(2_700_000_000, pick_strategy.value, pick_mesh.value, chip="v6e")
    mo.callout(mo.md(
        f"**{'Fits' if _verdict['fits'] else 'Does not fit'}.** {_verdict['reason']}"),
        kind="success" if _verdict["fits"] else "danger")
    return


if __name__ == "__main__":
    app.run()
