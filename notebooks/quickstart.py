import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="tpu-workbench quickstart")

with app.setup:
    import math

    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import hlo, profiling, sharding
    from tpu_workbench import notebook as nb

    SMOKE = wb.smoke_mode()
    # Smoke runs (CI) use the smallest model; a user gets the model picked below.
    SMOKE_MODEL = "mlp"


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # tpu-workbench: quickstart

    PyTorch reaches a TPU through **XLA**: your model is traced into an XLA program (HLO), compiled
    once, then run step after step. This notebook shows what that costs and buys you, for real,
    on whatever machine you are on. With no TPU attached it runs on **XLA:CPU**: it takes the very
    same HLO a TPU would and partitions it with the same SPMD partitioner, so the traced program,
    its sharding and the collectives it gets carry over to a v6e. What XLA:CPU's own backend then
    does (fusion, layouts: the optimised HLO) and the times do not.

    Every experiment runs in a separate **worker process** (torch_xla reads its settings once, at
    import, and a crash there must never take this notebook down); records stream back while it
    trains, which is what draws the live charts below.
    """)
    return


@app.cell
def _():
    backend = wb.describe()
    # A worker of the best backend here (TPU, XLA:CPU, or plain PyTorch where torch_xla is not
    # installed, as in .venv-torchtpu without a chip): what it really sees.
    runtime = wb.probe(wb.ExperimentSpec(model="mlp", mode=wb.default_modes()[-1]))
    return backend, runtime


@app.cell(hide_code=True)
def _(backend, runtime):
    _peak = backend["host_peak"]["peak_flops"] / 1e9
    _tpu = backend["tpu"]
    if runtime["runtime"] == "torch":  # no torch_xla in this environment
        _where = (f"**plain PyTorch on {runtime['device'].upper()}** (torch_xla is not installed "
                  "in this environment, so the XLA modes, HLO and SPMD sections are skipped)")
    elif _tpu["available"]:
        _where = f"**TPU** ({runtime['device_count']} x {runtime['device_kind']})"
    else:
        _where = f"**XLA:{runtime['device_hw']}** with {runtime['device_count']} virtual devices"
    _ttpu = backend["torch_tpu"]
    if _ttpu["installed"]:
        _where += (f". TorchTPU {_ttpu['version']} is installed: "
                   + ("its modes tpu_eager, tpu_fused and tpu_compile are offered below"
                      if _ttpu["available"] else f"{_ttpu['reason']}"))
    _v6e = wb.get_chip("v6e")
    mo.vstack([
        mo.md(f"""
    ## Where am I running?

    You are on {_where}. {"" if _tpu["available"] else "No TPU here: " + _tpu["reason"] + "."}
    This host's CPU peaks at **{_peak:,.0f} GFLOP/s** ({nb.host_peak_text(backend["host_peak"])}).
    One v6e chip peaks at **{_v6e.bf16_tflops:,.0f} TFLOP/s** in bf16 with {_v6e.hbm_gb:.0f} GB
    of HBM at {_v6e.hbm_gbps:,.0f} GB/s: about {_v6e.peak_flops / (_peak * 1e9):,.0f}x this CPU.
    On a TPU the traced programs below are the same (its compiler then optimises them its own
    way), and so is their sharding; the optimised HLO and the times change.
    """),
        nb.table(wb.chip_table(), label="TPU chips (published peak figures)"),
    ])
    return


@app.cell
def _():
    _models = wb.model_names()
    model = mo.ui.dropdown(_models, value="mingpt" if "mingpt" in _models else _models[0],
                           label="model")
    # Only the modes this environment can run (plain PyTorch everywhere; XLA where torch_xla is
    # installed; TorchTPU on a chip), the best of them preselected.
    modes = mo.ui.multiselect(wb.available_modes(), value=wb.default_modes(), label="modes")
    steps = mo.ui.slider(5, 100, value=30, step=5, label="steps", show_value=True)
    mo.hstack([model, modes, steps], justify="start", gap=2)
    return model, modes, steps


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Eager vs compiled, live

    Each mode trains the same model from the same random weights on the same generated batches.
    Step 0 includes compiling the step (XLA) or building it (inductor), so it stands apart from the
    steady state that follows. Times are taken after waiting for the device.
    """)
    return


@app.cell
def _(model, modes, steps):
    _n_steps = 5 if SMOKE else steps.value
    specs = [wb.ExperimentSpec(model=SMOKE_MODEL if SMOKE else model.value, preset="tiny",
                               mode=_m, steps=_n_steps)
             for _m in modes.value]
    mo.stop(not specs, mo.callout(mo.md("Pick at least one mode above."), kind="info"))
    # A fresh worker per mode: every first step pays its own compile (a warm worker would
    # serve `compile` the graph `lazy` just compiled). Smoke runs (CI) share workers.
    comparison = wb.run_live(specs, cold=not SMOKE)
    return (comparison,)


@app.cell
def _(comparison):
    summary = wb.summarize(comparison.steps)
    mo.vstack([
        *nb.run_failures(comparison, summary),
        nb.table(summary, label="per-mode summary"),
        wb.charts.loss_curves(comparison.steps) if len(comparison.steps) else mo.md(""),
    ])
    return (summary,)


@app.cell(hide_code=True)
def _(backend, summary):
    mo.stop(summary.empty)  # the cell above shows why (a failed-run callout)
    _fast = summary.sort_values("steady_median_ms").iloc[0]
    _why = (
        "XLA is not a speed-up on a CPU; its value here is that `lazy` and `compile` produce the "
        "very programs a TPU runs, compiled once (see `compiles_total`) and never again in "
        "steady state (`compiles_steady`). More in the *eager vs compiled* notebook."
        if backend["torch_xla_installed"] else
        "This environment has no torch_xla and no TPU chip, so only plain PyTorch runs: eager "
        "against `torch.compile` (inductor). On a TPU the TorchTPU modes join them.")
    mo.md(f"""
    **Reading the numbers.** The fastest steady state here is
    **{_fast["mode"]}** at {_fast["steady_median_ms"]:.1f} ms per step.
    {_why}
    """)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## What did XLA compile, and where does a step's time go?

    One more `compile` run, this time capturing XLA's HLO dumps and a profile of its steps.
    """)
    return


@app.cell
def _(backend, model):
    mo.stop(not backend["torch_xla_installed"], mo.callout(mo.md(
        "**Skipped: this environment has no torch_xla** (it is the TorchTPU environment, "
        "`.venv-torchtpu`). The HLO dumps come from XLA; run this notebook from `.venv` to see "
        "them. On a TPU, the TorchTPU mode `tpu_compile` with `capture=('hlo',)` writes the "
        "StableHLO of its graphs instead."), kind="info"))
    _spec = wb.ExperimentSpec(model=SMOKE_MODEL if SMOKE else model.value, preset="tiny",
                              mode="compile", steps=3 if SMOKE else 8, capture=("hlo", "profile"))
    with mo.status.spinner(title="compiling with HLO dumps and profiling"):
        captured = wb.run(_spec)
    _after = hlo.main_module(hlo.load_run_hlo(captured), "after_optimizations")
    _ops = hlo.instructions(_after)
    _s = hlo.summary(_after)
    _profile = profiling.load_profile(captured)
    mo.vstack([
        mo.md(f"""
    The optimised step has **{len(_ops):,} HLO instructions** in
    {sum(_s["fusions_by_kind"].values())} fusions. FLOPs per step: XLA's cost model
    {nb.xla_flops_text(_s)}; the analytic matmul count {_s["dot_flops"] / 1e9:.3f} GFLOP.
    The *HLO explorer* notebook goes further.
    """),
        mo.hstack([wb.charts.op_mix(_ops, top=12, title="ops after optimisation"),
                   wb.charts.top_ops(_profile.ops, n=12)]),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## How is the model laid out on a v6e-8?

    A v6e host has 8 chips in a 2x4 mesh. Here 8 virtual XLA:CPU devices stand in for them:
    the SPMD partitioner is the same. Pick a strategy; the chart shows which slice of a weight
    each device holds (same colour = same slice, a replica).
    """)
    return


@app.cell
def _():
    mesh = mo.ui.dropdown({k: k for k, v in sharding.MESHES.items() if math.prod(v) <= 8},
                          value="v6e-8", label="mesh")
    strategy = mo.ui.dropdown(list(sharding.STRATEGIES), value="dp_tp", label="strategy")
    mo.hstack([mesh, strategy], justify="start", gap=2)
    return mesh, strategy


@app.cell
def _(backend, mesh, model, strategy):
    _shape = sharding.MESHES[mesh.value]
    _model = SMOKE_MODEL if SMOKE else model.value
    # SPMD where torch_xla is installed, else DTensor over one process per device
    with mo.status.spinner(title=f"laying {_model} out on a {mesh.value} mesh"):
        layout, _shape, _how = nb.mesh_layout(_model, _shape, strategy.value, smoke=SMOKE)
    largest = sharding.largest_split_tensor(layout)
    mo.vstack([
        mo.md(f"**{sharding.STRATEGIES[strategy.value]}.** The largest parameter it splits, "
              f"`{largest}`, on the {sharding.mesh_text(_shape)} mesh:"),
        wb.charts.layout_grid(layout, largest, _shape),
        mo.md(_how),
    ])
    return largest, layout


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    With the mesh and strategy picked above, **how many devices hold each slice of the parameter
    drawn above** (its replicas: the cells of one colour)? Work it out from the strategy (which
    mesh axis splits that weight, if any?), then enter it and change the strategy to try again.
    """)
    return


@app.cell
def _():
    answer = mo.ui.number(start=1, stop=64, value=1, label="devices holding each slice")
    answer
    return (answer,)


@app.cell
def _(answer, largest, layout):
    _rows = layout[layout["tensor"] == largest]
    _slices = _rows["index_label"].nunique()
    _devices = _rows["device_name"].nunique()
    _each = int(_rows.groupby("index_label")["device_name"].nunique().max())
    _ok = answer.value == _each
    mo.callout(mo.md(
        f"`{largest}` is cut into **{_slices}** slice(s) over {_devices} devices, so **{_each}** "
        "device(s) hold each slice. " + ("Right." if _ok else
        f"You said {answer.value}. Hint: devices / slices; a weight split along one mesh axis "
        "is replicated along the other.")), kind="success" if _ok else "warn")
    return


if __name__ == "__main__":
    app.run()
