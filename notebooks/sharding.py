import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Sharding: a model laid out on a TPU slice")

with app.setup:

    import marimo as mo
    import pandas as pd

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench import sharding

    SMOKE = wb.smoke_mode()
    # What the page measures on open, before any control is submitted.
    DEFAULT_SETUP = {"model": "mingpt", "mesh": "v6e-8"}
    DEFAULT_STRATEGY = "dp_tp"
    EXERCISE_PARAMS = 2_700_000_000


@app.function
def strategies_for(mesh_shape: tuple[int, ...]) -> list[str]:
    """The strategies the side-by-side section runs: all four on a 2-D mesh, dp and fsdp on a
    1-D one (tp needs a model axis); dp and fsdp in smoke runs."""
    if len(mesh_shape) == 2 and not SMOKE:
        return list(sharding.STRATEGIES)
    return ["dp", "fsdp"]


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # Sharding: a model laid out on a TPU slice

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
    model_name = "mlp" if SMOKE else chosen["model"]
    mesh_name = chosen["mesh"]
    mesh_shape = tuple(sharding.MESHES[mesh_name])
    return mesh_name, mesh_shape, model_name


@app.cell
def _(mesh_name, mesh_shape, model_name, pick, remeasure, setup):
    _asked = pick.value or DEFAULT_STRATEGY
    _strategy = _asked
    if len(mesh_shape) == 1 and _asked in ("tp", "dp_tp"):
        _strategy = "dp"  # tensor parallelism needs a 2-D (data, model) mesh
    spec = wb.ExperimentSpec(model=model_name, preset="tiny", mode="compile", steps=3,
                             mesh=mesh_shape, strategy=_strategy, capture=("hlo",))
    with mo.status.spinner(title=f"{_strategy} on a {mesh_name} mesh: compiling and training"):
        result = wb.run(spec, reuse=nb.reuse_ok() and setup.value is None
                        and pick.value is None and not remeasure.value)
    layout = sharding.layout_frame(result)
    _note = (f" ({_asked} needs a 2-D mesh, so this is dp.)" if _strategy != _asked else "")
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
    wb.charts.layout_grid(layout, tensor.value, spec.mesh)
    return


@app.cell
def _(layout, tensor):
    _rows = layout[layout["tensor"] == tensor.value].assign(
        shard_kb=lambda f: f["shard_bytes"] / 1e3)
    nb.table(_rows[["device_name", "index_label", "shard_shape", "shard_kb", "replica_id"]]
             .rename(columns={"index_label": "slice held", "shard_kb": "shard (KB)"}),
             page_size=8, label=f"what each device holds of {tensor.value}")
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
    _cols = ["kind", "axis", "shape", "kb", "group_size", "estimated_us"]
    _show = collectives.assign(kb=collectives["bytes"] / 1e3).sort_values(
        "kb", ascending=False, ignore_index=True)[_cols].rename(
        columns={"kb": "KB per device", "group_size": "devices", "estimated_us": "v6e est. µs"})
    nb.table(_show, page_size=8, label="each collective (largest first)") \
        if len(collectives) else None
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Every strategy, side by side

    The same model and mesh under each strategy (the strategy picked above does not matter
    here): the step time on this host, the collective bytes each strategy puts on the ICI, and
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
def _(again, mesh_shape, model_name, setup):
    _reuse = nb.reuse_ok() and setup.value is None and not again.value
    _strategies = strategies_for(mesh_shape)
    strategy_runs = []
    for _s in mo.status.progress_bar(_strategies, title="every strategy", remove_on_exit=True):
        _spec = wb.ExperimentSpec(model=model_name, preset="tiny", mode="compile",
                                  steps=3 if SMOKE else 6, mesh=mesh_shape, strategy=_s,
                                  capture=("hlo",))
        strategy_runs.append(wb.run(_spec, reuse=_reuse))
    by_strategy = sharding.summary_frame(strategy_runs)
    mo.vstack([mo.md(nb.provenance(strategy_runs, button="run every strategy again")),
               wb.charts.step_time_per_strategy(by_strategy)])
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
def _():
    mo.md(r"""
    ## Many processes: DTensor training

    TorchTPU has no single SPMD controller: it runs one process per chip, launched by
    `torchrun`, and shards with DTensor. The same path runs here over gloo on the CPU: the
    form below trains minGPT tiny as a gang of processes, each a rank holding its part
    (FSDP2's `fully_shard` for fsdp, `parallelize_module` column/row plans for tp, the same
    on a 2-D mesh with the gradients averaged over the data axis for dp_tp, DDP for dp: each
    rank holds what the SPMD device at its place holds under tp and dp_tp). The losses must
    equal one process's; the collectives are
    what `CommDebugMode` counted in one step on rank 0 (bytes measured; the times come from
    the same ICI model as above, the ranks on a v6e slice's chips). On a TPU the same code runs
    over `tpu_dist`.
    """)
    return


@app.cell
def _():
    gang_form = mo.md("{strategy} {processes}").batch(
        strategy=mo.ui.dropdown(list(sharding.STRATEGIES), value="fsdp", label="strategy"),
        processes=mo.ui.dropdown(["2", "4"], value="4", label="processes"),
    ).form(submit_button_label="run", label="**Many processes** (a gang under torchrun)")
    gang_form
    return (gang_form,)


@app.cell
def _(gang_form):
    mo.stop(gang_form.value is None,
            mo.md("_Press **run** to train over several processes (about 20-40 s here)._"))
    gang_error = None
    gang_result = gang_one = None
    try:
        _strategy = gang_form.value["strategy"]
        _spec = wb.ExperimentSpec(model="mingpt", preset="tiny", mode="torch_eager", steps=4,
                                  mesh=wb.gang.mesh_for(_strategy,
                                                      int(gang_form.value["processes"])),
                                  strategy=_strategy)
        gang_result = wb.run(_spec)
        gang_one = wb.run(_spec.replace(mesh=None, strategy=None), reuse=nb.reuse_ok())
    except wb.WorkbenchError as _exc:
        gang_error = _exc
    (nb.failed_run_callout("gang", gang_error) if gang_error is not None else
     mo.md(f"Trained on mesh {sharding.mesh_text(gang_result.spec.mesh)}: "
           f"{gang_result.runtime['processes']} processes, "
           f"{gang_result.runtime['dist_backend']}, launched by torchrun."))
    return gang_one, gang_result


@app.cell
def _(gang_one, gang_result):
    mo.stop(gang_result is None)
    nb.table(nb.rounded(wb.gang.loss_comparison(gang_result, gang_one), significant=7),
             label="loss per step: the gang vs one process")
    return


@app.cell
def _(gang_result):
    mo.stop(gang_result is None)
    gang_collectives = wb.gang.collectives_frame(gang_result)
    (wb.charts.collective_bytes(wb.gang.collectives_frame(gang_result, per_call=True))
     .properties(title="collectives CommDebugMode counted in one step")
     if len(gang_collectives) else mo.md("_No collectives: nothing is split._"))
    return (gang_collectives,)


@app.cell
def _(gang_collectives):
    mo.stop(not len(gang_collectives))
    nb.table(gang_collectives[["kind", "phase", "module", "axis", "group_size", "count",
                               "bytes", "estimated_us"]],
             page_size=12, label="collectives of one step (rank 0), per call")
    return


@app.cell
def _(gang_result):
    mo.stop(gang_result is None)
    nb.table(wb.gang.rank_frame(gang_result).pivot(index="step", columns="rank",
                                                values="wall_ms").add_prefix("rank ")
             .reset_index(),
             label="step time of every rank (ms): a straggler shows as one slow column")
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Plan a run: predicted step time on a TPU slice

    Before renting a slice: does this model fit it, how fast would it train, and what would
    hold it back? The workbench traces the training step here (torch_xla on virtual devices;
    nothing runs) and hands it to **libtpu, the TPU's own compiler**, for each slice: the
    compiler partitions it, fuses it, schedules its collectives and assigns every buffer of
    a chip's HBM, as it would on the TPU VM. From that compiled program the step time is
    predicted: each op on the chip's roofline, the collectives on the slice's torus, the
    asynchronous ones hidden behind compute where there is compute to hide them. A large model
    is compiled with one and two blocks at its real width and scaled to all its blocks. Every
    number below is **predicted**, not measured; the assumptions are listed under the chart.
    The memory per chip is the compiler's; the analytic estimate (instant, beside it) shows
    how far a formula gets.
    """)
    return


@app.cell
def _():
    _hf = not SMOKE
    plan = mo.md("""
    {model} {preset} {slices} {strategies}

    {seq_len} {batch} {recompute} {attention}
    """).batch(
        model=mo.ui.dropdown(wb.model_names(), value="hf:llama" if _hf else "mingpt",
                             label="model"),
        preset=mo.ui.text(value="llama-3-8b" if _hf else "gpt-mini", label="preset"),
        slices=mo.ui.multiselect(list(wb.slice_table()["slice"]),
                                 value=["v6e-8", "v6e-16"] if _hf else ["v6e-4"],
                                 label="slices"),
        strategies=mo.ui.multiselect(list(sharding.STRATEGIES),
                                     value=["fsdp", "dp_tp"] if _hf else ["fsdp"],
                                     label="strategies"),
        seq_len=mo.ui.number(start=2, stop=131072, step=2, value=2048 if _hf else 16,
                             label="sequence length"),
        batch=mo.ui.number(start=1, stop=65536, value=32 if _hf else 8, label="global batch"),
        recompute=mo.ui.checkbox(value=_hf, label="activation checkpointing (hf:*)"),
        attention=mo.ui.dropdown(["eager", "flash"], value="flash" if _hf else "eager",
                                 label="attention (flash: torch_xla's Pallas kernel, hf:*)"),
    ).form(submit_button_label="predict (libtpu compiles each slice and strategy: about "
                 "2 minutes for Llama-3-8B's blocks on 2 cores, then cached)")
    plan
    return (plan,)


@app.cell
def _(plan):
    mo.stop(plan.value is None, mo.md("_Choose a model and slices, then press **predict**. "
                                      "Nothing is compiled before that._"))
    _v = plan.value
    plan_kwargs = dict(slices=_v["slices"], strategies=_v["strategies"],
                       seq_len=int(_v["seq_len"]), batch_size=int(_v["batch"]),
                       recompute=_v["recompute"])
    try:
        fit_plan = wb.fit_check(_v["model"], _v["preset"].strip(), **plan_kwargs)
        with mo.status.spinner(title="libtpu compiles the step for each slice") as _spin:
            predicted = wb.predict(
                _v["model"], _v["preset"].strip(), **plan_kwargs,
                attention=None if _v["attention"] == "eager" else _v["attention"],
                on_progress=lambda _m: _spin.update(subtitle=_m))
        plan_error = None
    except wb.WorkbenchError as _exc:
        fit_plan, predicted, plan_error = None, None, _exc
    (mo.callout(mo.md(f"**Nothing predicted.** {plan_error}"), kind="danger") if plan_error
     else mo.hstack([wb.predicted_step_times(predicted), wb.charts.fit_bars(fit_plan)],
                    wrap=True, justify="start"))
    return plan_error, predicted


@app.cell
def _(plan_error, predicted):
    mo.stop(plan_error is not None or predicted is None)
    _show = pd.DataFrame({
        "slice": predicted["slice"], "strategy": predicted["strategy"],
        "fits (compiler)": predicted["fits"],
        "HBM per chip, compiler (GB)": predicted["compiler_memory_gb"].round(1),
        "HBM per chip, estimate (GB)": predicted["estimated_memory_gb"].round(1),
        "predicted step (ms)": predicted["predicted_step_ms"].round(1),
        "range (ms)": [f"{a:,.0f} - {b:,.0f}" if a == a else "-" for a, b in zip(
            predicted["predicted_step_min_ms"], predicted["predicted_step_max_ms"],
            strict=True)],
        "predicted MFU": predicted["predicted_mfu"].map(
            lambda _m: f"{_m:.0%}" if _m == _m else "-"),
        "bottleneck": predicted["bottleneck"].fillna("-"),
        "collectives (as compiled)": predicted["collectives"].fillna("-"),
        "why not": predicted["reason"].fillna(""),
    })
    mo.vstack([
        nb.table(_show, label="predicted per slice and strategy (not measured)"),
        mo.md("**Assumptions of every predicted number:**\n\n" + "\n".join(
            f"- {_a}" for _a in predicted.attrs["assumptions"])),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Plan for a v6e-16 / v6e-32

    A model that outgrows one v6e-8 host runs as one program on **every host** of a larger
    slice: a v6e-16 is 4 hosts of 4 chips (4x4), a v6e-32 8 hosts of 4 (4x8) (a multi-host
    slice is built of 4-chip hosts; 8 chips is the largest single host, a v6e-8). torch_xla runs
    one SPMD process per host over a mesh of all the slice's chips; TorchTPU runs `torchrun` on
    every host, one process per chip. Either way every host must start, or the others wait
    forever. Pick a slice, a runtime and a launcher: the page shows the memory each chip would
    hold, the collectives one step needs with their ICI time, and the exact commands to copy.
    The model is the one of **Plan a run** above (its defaults until you press predict).
    Nothing here runs or compiles: it is all computed from the slice table and the model's
    shapes.
    """)
    return


@app.cell
def _():
    _slices = wb.slice_table()
    slice_controls = mo.md("{slice} {strategy} {runtime} {via}\n\n{zone} {cluster}").batch(
        slice=mo.ui.dropdown(list(_slices[_slices["hosts"] > 1]["slice"]), value="v6e-16",
                             label="slice"),
        strategy=mo.ui.dropdown(list(sharding.STRATEGIES), value="fsdp", label="strategy"),
        runtime=mo.ui.dropdown(list(wb.launch_runtimes), value="torch_xla", label="runtime"),
        via=mo.ui.dropdown(list(wb.launch_vias), value="gcloud", label="launcher"),
        zone=mo.ui.text(value="", label="zone (gcloud, xpk; empty: gcloud's default)"),
        cluster=mo.ui.text(value="my-cluster", label="GKE cluster (xpk)"),
    )
    slice_controls
    return (slice_controls,)


@app.cell
def _(plan, slice_controls):
    _hf = not SMOKE
    _v = plan.value or {"model": "hf:llama" if _hf else "mingpt",
                        "preset": "llama-3-8b" if _hf else "gpt-mini",
                        "seq_len": 2048 if _hf else 64, "batch": 32, "recompute": _hf}
    _c = slice_controls.value
    slice_model = (_v["model"], _v["preset"].strip())
    try:
        slice_fit = wb.fit_check(*slice_model, slices=[_c["slice"]],
                                 strategies=list(sharding.STRATEGIES),
                                 seq_len=int(_v["seq_len"]), batch_size=int(_v["batch"]),
                                 recompute=_v["recompute"])
        slice_collectives = wb.model_step_collectives(
            *slice_model, _c["slice"], _c["strategy"], int(_v["batch"]), int(_v["seq_len"]))
        slice_launch = wb.launch_plan(
            _c["slice"], _c["runtime"], _c["via"], model=slice_model[0],
            preset=slice_model[1], batch_size=int(_v["batch"]), strategy=_c["strategy"],
            zone=_c["zone"].strip() or None, cluster=_c["cluster"].strip() or None)
        slice_error = None
    except wb.WorkbenchError as _exc:
        slice_fit = slice_collectives = slice_launch = None
        slice_error = _exc
    _row = None if slice_fit is None else slice_fit[
        slice_fit["strategy"] == _c["strategy"]].iloc[0]
    (mo.callout(mo.md(f"**No plan.** {slice_error}"), kind="danger") if slice_error else
     mo.vstack([
         mo.md(f"### Memory per chip on {_c['slice']}\n\n{slice_model[0]} {slice_model[1]}, "
               f"global batch {_v['batch']}, {_v['seq_len']} tokens: **{_c['strategy']}** "
               f"{'fits' if _row['fits'] else 'does not fit'}. {_row['reason']}. "
               "_Estimated from the parameter count and the activation formula of "
               "`sharding.fit_table`, not measured._"),
         wb.charts.fit_bars(slice_fit),
     ]))
    return slice_collectives, slice_error, slice_launch


@app.cell
def _(slice_collectives, slice_controls, slice_error):
    mo.stop(slice_error is not None)
    _chip = wb.get_slice(slice_controls.value["slice"]).chip
    _show = pd.DataFrame({
        "collective": slice_collectives["collective"], "kind": slice_collectives["kind"],
        "axis (chips)": slice_collectives["axis"] + " ("
        + slice_collectives["physical_axes"] + ")",
        "per step": slice_collectives["count"],
        "MB each": (slice_collectives["bytes"] / 1e6).round(1),
        "est. ms per step": (slice_collectives["total_us"] / 1e3).round(2),
    })
    _total_us = float(slice_collectives["total_us"].sum())
    mo.vstack([
        mo.md(f"### Collectives per step\n\nAbout **{nb.format_us(_total_us)}** of ICI time "
              "per step if none overlapped with compute. "
              "_Analytic, not XLA's collectives (the layout sections above count those): dp "
              "all-reduces the gradients, fsdp all-gathers the parameters twice and "
              "reduce-scatters the gradients, tp all-reduces each layer's activations four "
              f"times a step._ _{sharding.ici_assumptions(_chip)}_"),
        nb.table(_show, label=f"collectives of one {slice_controls.value['strategy']} step"),
    ])
    return


@app.cell
def _(slice_error, slice_launch):
    mo.stop(slice_error is not None)
    mo.vstack([
        mo.md(f"""
        ### The launch plan to copy

        {slice_launch.hosts} hosts x {slice_launch.chips_per_host} chips, mesh
        {sharding.mesh_text(slice_launch.mesh)} over all {slice_launch.chips} chips. Run the
        last line(s) from your machine (`tpu-workbench launch ... --execute` does it where the
        launcher and its credentials exist); the `# every host` lines say what each runs.
        """),
        mo.md(f"```bash\n{slice_launch.text()}\n```"),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    **Fit a 2.7B-parameter minGPT on one v6e host** (32 GB of HBM per chip) for training in
    fp32 with Adam: parameters, gradients and Adam's two moments, 16 bytes per parameter in all
    (a 1.3B model would still fit replicated, at 20.8 GB a chip). Pick the strategy and mesh
    you would use, then **check**.
    """)
    return


@app.cell
def _():
    answer = mo.md("{strategy} {mesh}").batch(
        strategy=mo.ui.dropdown(list(sharding.STRATEGIES), label="strategy"),
        mesh=mo.ui.dropdown(["v6e-8", "v6e-4"], label="mesh"),
    ).form(submit_button_label="check")
    answer
    return (answer,)


@app.cell
def _(answer):
    mo.stop(answer.value is None, mo.md("_Pick a strategy and a mesh, then press **check**._"))
    _strategy, _mesh = answer.value["strategy"], answer.value["mesh"]
    mo.stop(not _strategy or not _mesh,
            mo.callout(mo.md("Pick both a strategy and a mesh."), kind="warn"))
    _verdict = sharding.fits(EXERCISE_PARAMS, _strategy, _mesh, chip="v6e")
    mo.callout(mo.md(
        f"**{'Fits' if _verdict['fits'] else 'Does not fit'}.** {_verdict['reason']}"),
        kind="success" if _verdict["fits"] else "danger")
    return


if __name__ == "__main__":
    app.run()
