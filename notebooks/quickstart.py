import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="tpu-workbench quickstart")

with app.setup:
    import math

    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench import sharding

    SMOKE = wb.smoke_mode()
    # Smoke runs (CI) use the smallest model; a user gets the model picked below.
    SMOKE_MODEL = "mlp"
    # What every section measures when the notebook opens (before any click).
    DEFAULT_MODEL = "mingpt"
    DEFAULT_STEPS = 10
    SLOW_MODELS = ("resnet", "unet")
    # Sections that have run since the notebook opened (see `nb.may_measure`).
    OPENED: set[str] = set()


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
    trains, which is what draws the live charts below. Each section measures once when the
    notebook opens, then again only when you press its **run** button. Runs measured before in
    this same environment are shown at once, labelled with when and where they were measured.
    """)
    return


@app.cell
def _():
    # Asked of this process, no worker started; each run below reports what its worker saw.
    backend = wb.describe()
    return (backend,)


@app.cell(hide_code=True)
def _(backend):
    _peak = backend["host_peak"]["peak_flops"] / 1e9
    _tpu = backend["tpu"]
    if not backend["torch_xla_installed"]:
        _where = ("**plain PyTorch on CPU** (torch_xla is not installed in this environment, "
                  "so the XLA modes, HLO and SPMD sections are skipped)")
    elif _tpu["available"]:
        _where = f"**TPU** ({_tpu['reason']})"
    else:
        _where = f"**{_tpu['fallback']}**"
    _why_not = "" if _tpu["available"] else f" No TPU here: {_tpu['reason']}."
    _ttpu = backend["torch_tpu"]
    if _ttpu["installed"] and _ttpu["available"]:
        _why_not += (f" TorchTPU {_ttpu['version']} is installed: its modes tpu_eager, "
                     "tpu_fused and tpu_compile are offered below.")
    elif _ttpu["installed"]:
        # TorchTPU's reason repeats the PCI scan's when there is no chip: say only what it adds.
        _reason = _ttpu["reason"]
        if _reason.startswith(_tpu["reason"]):
            _reason = _reason[len(_tpu["reason"]):].lstrip(" ,").removeprefix("so ")
        _why_not += f" TorchTPU {_ttpu['version']} is installed, but {_reason}."
    _v6e = wb.get_chip("v6e")
    mo.vstack([
        mo.md(f"""
    ## Where am I running?

    The runs below use {_where}.{_why_not}
    This host's CPU peaks at **{_peak:,.0f} GFLOP/s** ({nb.host_peak_text(backend["host_peak"])}).
    One v6e chip peaks at **{_v6e.bf16_tflops:,.0f} TFLOP/s** in bf16 with {_v6e.hbm_gb:.0f} GB
    of HBM at {_v6e.hbm_gbps:,.0f} GB/s: about {_v6e.peak_flops / (_peak * 1e9):,.0f}x this CPU.
    On a TPU the traced programs below are the same (its compiler then optimises them its own
    way), and so is their sharding; the optimised HLO and the times change.
    """),
        nb.table(wb.chip_table()[["name", "bf16_tflops", "hbm_gb", "hbm_gbps", "ici_link_gbps",
                                  "chips_per_host"]],
                 label="TPU chips (published peak figures)", page_size=5),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Eager vs compiled, live

    Each mode trains the same model from the same random weights on the same generated batches,
    each in a fresh worker, so every first step pays its own compile. Step 0 includes compiling
    the step (XLA) or building it (inductor), so it stands apart from the steady state that
    follows. Times are taken after waiting for the device.
    """)
    return


@app.cell
def _():
    _models = wb.model_names()
    model = mo.ui.dropdown(_models, value=DEFAULT_MODEL if DEFAULT_MODEL in _models
                           else _models[0], label="model")
    # Only the modes this environment can run (plain PyTorch everywhere; XLA where torch_xla is
    # installed; TorchTPU on a chip), the best of them preselected.
    modes = mo.ui.multiselect(wb.available_modes(), value=wb.default_modes(), label="modes")
    steps = mo.ui.slider(5, 100, value=DEFAULT_STEPS, step=5, label="steps", show_value=True)
    run_training = mo.ui.run_button(label="run")
    mo.vstack([
        mo.hstack([model, modes, steps, run_training], justify="start", gap=2),
        mo.md(f"_The model is used by every section below. {' and '.join(SLOW_MODELS)} take "
              "minutes per mode on a CPU._"),
    ])
    return model, modes, run_training, steps


@app.cell
def _(model, modes, run_training, steps):
    _go = nb.may_measure(OPENED, "training", run_training.value)
    specs = [wb.ExperimentSpec(model=SMOKE_MODEL if SMOKE else model.value, preset="tiny",
                               mode=_m, steps=5 if SMOKE else steps.value)
             for _m in modes.value]
    mo.stop(not specs, mo.callout(mo.md("Pick at least one mode above."), kind="info"))
    _reuse = nb.reuse_ok() and not run_training.value
    mo.stop(not _go and not (_reuse and all(wb.reusable(_s, cold=not SMOKE) for _s in specs)),
            mo.callout(mo.md("Press **run** above to train with these settings."), kind="info"))
    # A fresh worker per mode: every first step pays its own compile (a warm worker would
    # serve `compile` the graph `lazy` just compiled). Smoke runs (CI) share workers.
    comparison = wb.run_live(specs, cold=not SMOKE, reuse=_reuse)
    return (comparison,)


@app.cell
def _(comparison):
    # Beside the step times: the chip's duty cycle, TensorCore use and HBM that the worker
    # sampled (libtpu's monitoring SDK), or why there are none (no chip: nothing is made up).
    nb.chip_metrics_view(comparison)
    return


@app.cell
def _(comparison):
    summary = wb.summarize(comparison.steps)
    _cols = ["mode", "first_step_ms", "steady_median_ms", "compiles_total", "compiles_steady",
             "final_loss"]
    mo.vstack([
        mo.md(nb.provenance(comparison)),
        *nb.run_failures(comparison, summary),
        nb.table(summary[_cols], label="per-mode summary") if len(summary) else mo.md(""),
    ])
    return (summary,)


@app.cell
def _(comparison):
    wb.charts.loss_curves(comparison.steps) if len(comparison.steps) else mo.md("")
    return


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

    One more `compile` run of the model picked above, this time capturing XLA's HLO dumps and a
    profile of its steps.
    """)
    return


@app.cell
def _():
    run_hlo = mo.ui.run_button(label="run")
    run_hlo
    return (run_hlo,)


@app.cell
def _(backend, model, run_hlo):
    mo.stop(not backend["torch_xla_installed"], mo.callout(mo.md(
        "**Skipped: this environment has no torch_xla** (it is the TorchTPU environment, "
        "`.venv-torchtpu`). The HLO dumps come from XLA; run this notebook from `.venv` to see "
        "them. On a TPU, the TorchTPU mode `tpu_compile` with `capture=('hlo',)` writes the "
        "StableHLO of its graphs instead."), kind="info"))
    _spec = wb.ExperimentSpec(model=SMOKE_MODEL if SMOKE else model.value, preset="tiny",
                              mode="compile", steps=3 if SMOKE else 5, capture=("hlo", "profile"))
    _reuse = nb.reuse_ok() and not run_hlo.value
    _go = nb.may_measure(OPENED, "hlo", run_hlo.value)
    mo.stop(not _go and not (_reuse and wb.reusable(_spec)),
            mo.callout(mo.md(f"Press **run** above to capture {_spec.model}'s HLO and profile."),
                       kind="info"))
    with mo.status.spinner(title="compiling with HLO dumps and profiling"):
        captured = wb.run(_spec, reuse=_reuse)
    hlo_ops, _s = nb.step_hlo(captured)
    profile_ops = nb.profile_ops(captured)
    mo.md(f"""
    {nb.provenance(captured)}

    The optimised step of {_spec.model} has **{len(hlo_ops):,} HLO instructions** in
    {sum(_s["fusions_by_kind"].values())} fusions. FLOPs per step: XLA's cost model
    {nb.xla_flops_text(_s)}; the analytic matmul count {_s["dot_flops"] / 1e9:.3f} GFLOP.
    The *HLO explorer* notebook goes further.
    """)
    return hlo_ops, profile_ops


@app.cell
def _(hlo_ops):
    wb.charts.op_mix(hlo_ops, top=12, title="ops after optimisation", width=420)
    return


@app.cell
def _(profile_ops):
    wb.charts.top_ops(profile_ops, n=12, width=420)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## How is the model laid out on a v6e-8?

    A v6e host has 8 chips in a 2x4 mesh. Here 8 virtual XLA:CPU devices stand in for them:
    the SPMD partitioner is the same. Pick a mesh and a strategy and press **run**; the chart
    shows which slice of a weight each device holds (same colour = same slice, a replica).
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
    _reuse = nb.reuse_ok() and not run_layout.value
    # steps=0: torch_xla places the model on the mesh and reports the layout; nothing compiles
    _spec = wb.ExperimentSpec(model=_model, preset="tiny", mode="compile", steps=0,
                              mesh=tuple(_shape), strategy=strategy.value)
    mo.stop(not nb.may_measure(OPENED, "layout", run_layout.value)
            and not (_reuse and backend["torch_xla_installed"] and wb.reusable(_spec)),
            mo.callout(mo.md(f"Press **run** above to lay {_model} out with "
                             f"`{strategy.value}` on {mesh.value}."), kind="info"))
    # SPMD where torch_xla is installed (a stored run of the same layout is reused), else
    # DTensor over one process per device
    with mo.status.spinner(title=f"laying {_model} out on a {mesh.value} mesh"):
        if backend["torch_xla_installed"]:
            _result = wb.run(_spec, reuse=_reuse)
            layout = sharding.layout_frame(_result)
            _how = ("The *sharding* notebook shows every tensor, memory per device and the "
                    "collectives XLA inserted.")
            _when = nb.provenance(_result)
        else:
            layout, _shape, _how = nb.mesh_layout(_model, _shape, strategy.value, smoke=SMOKE)
            _when = ""
    largest = sharding.largest_split_tensor(layout)
    layout_strategy = strategy.value
    layout_devices = math.prod(_shape)
    mo.vstack([
        mo.md(_when),
        mo.md(f"**{sharding.STRATEGIES[strategy.value]}.** The largest parameter it splits, "
              f"`{largest}`, on the {sharding.mesh_text(_shape)} mesh:"),
        wb.charts.layout_grid(layout, largest, _shape),
        mo.md(_how),
    ])
    return largest, layout, layout_devices, layout_strategy


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    With the mesh and strategy above, **how many devices hold each slice of the parameter drawn
    above** (its replicas)? Work it out from the strategy (which mesh axis splits that weight,
    if any?), then enter it and press **check**. Change the strategy, press **run**, and try
    again.
    """)
    return


@app.cell
def _():
    answer = mo.ui.text(label="devices holding each slice", placeholder="a whole number").form(
        submit_button_label="check", bordered=False)
    answer
    return (answer,)


@app.cell
def _(answer, largest, layout, layout_devices, layout_strategy):
    mo.stop(answer.value is None,
            mo.md("_Enter a number and press **check**; nothing is judged before that._"))
    _rows = layout[layout["tensor"] == largest]
    _each = int(_rows.groupby("index_label")["device_name"].nunique().max())
    _kind, _verdict = judge_replicas(answer.value, _each, layout_devices)
    mo.callout(mo.md(f"`{layout_strategy}`, `{largest}`: {_verdict}"), kind=_kind)
    return


@app.function(hide_code=True)
def judge_replicas(text: str, each: int, devices: int) -> tuple[str, str]:
    """The verdict on the typed answer `text` when `each` devices hold every slice of a weight
    laid out over `devices` devices: ``(callout kind, markdown)``. Pure: it starts nothing."""
    try:
        said = int(str(text).strip())
    except ValueError:
        return "warn", f"Type a whole number of devices, from 1 to {devices} (not `{text}`)."
    if not 1 <= said <= devices:
        return "warn", (f"{said} is out of range: the mesh has {devices} devices, so the answer "
                        f"is between 1 and {devices}.")
    if said == each:
        return "success", f"**Right**: {each} device(s) hold each slice."
    return "warn", (f"You said {said}; not quite. Hint: count the cells of one colour. A weight "
                    "split along one mesh axis is replicated along the other; a weight split "
                    "along none sits whole on every device.")


if __name__ == "__main__":
    app.run()
