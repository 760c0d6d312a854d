import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Scale out: many runs, many processes, many hosts")

with app.setup:
    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench import sharding
    from tpu_workbench.exercises import scale_out as exercise

    SMOKE = wb.smoke_mode()
    HF = not SMOKE
    SECTIONS = nb.Sections()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # Scale out: many runs, many processes, many hosts

    Three ways past one process on one host, each for real where this machine allows it:

    1. **Many independent runs** (a sweep), on this host's worker pool or on a Ray cluster.
    2. **One run over many processes**: DTensor training, one process per device under
       `torchrun`, as TorchTPU runs on a TPU host (gloo on the CPU here, `tpu_dist` on chips).
    3. **One run over many hosts**: a v6e-16 or v6e-32 slice, where every host must start
       the same program. That needs the slice, so here it is planned, not run: memory per
       chip, the collectives of a step, and the exact commands to copy.
    """)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## A batch-size sweep, here or on a Ray cluster

    How does the steady step time grow with the batch? One run per batch size, each in a
    workbench worker of its own. The **local** engine runs them one after another on this
    host's pool; **ray** makes each run a Ray task (an embedded local Ray here, a cluster with
    `tpu-workbench sweep --engine ray --address HOST:6379`): Ray places the worker on a node,
    streams its records back while it trains, and runs it again elsewhere if its node dies.
    Either engine times one run per host at a time, so runs never contend for the cores.
    """)
    return


@app.cell
def _():
    sweep_form = mo.md("{model} {engine} {mode} {batch_sizes}").batch(
        model=mo.ui.dropdown(wb.model_names(), value="mingpt", label="model"),
        engine=mo.ui.dropdown(["local", "ray"], value="local", label="engine"),
        mode=mo.ui.dropdown(wb.available_modes(), value="torch_eager", label="mode"),
        batch_sizes=mo.ui.multiselect(["4", "8", "16", "32", "64", "128"],
                                      value=["8", "16", "32"], label="batch sizes"),
    ).form(submit_button_label="sweep", bordered=False)
    sweep_form
    return (sweep_form,)


@app.cell
def _(sweep_form):
    # The sweep in the form's defaults runs when the page opens (several cold workers), then
    # on every submit. Smoke runs (CI) sweep fewer, smaller runs.
    _chosen = sweep_form.value or ({"model": "mlp", "engine": "local", "mode": "torch_eager",
                                    "batch_sizes": ["8", "16"]} if SMOKE else
                                   {"model": "mingpt", "engine": "local",
                                    "mode": "torch_eager", "batch_sizes": ["8", "16", "32"]})
    swept = None
    if not _chosen["batch_sizes"]:
        mo.output.replace(mo.callout(mo.md("Pick at least one batch size."), kind="info"))
    elif SECTIONS.reuse("sweep", sweep_form.value is not None,
                        waiting="Press **sweep** to sweep these batch sizes.") is not None:
        _base = wb.ExperimentSpec(model=_chosen["model"], preset="tiny",
                                  mode=_chosen["mode"], steps=3 if SMOKE else 10)
        _specs = wb.grid(_base, {"batch_size": sorted(int(b) for b in _chosen["batch_sizes"])})
        _live = wb.LiveSteps(_specs,
                             show=lambda f: mo.output.replace(wb.charts.step_times(f)))
        with mo.status.spinner(title=f"sweep of {len(_specs)} runs ({_chosen['engine']})"):
            swept = wb.sweep(_specs, engine=_chosen["engine"], on_record=_live)
        mo.output.replace(nb.run_failures_of_sweep(swept) or
                          wb.charts.sweep_times(swept.summary, "batch_size"))
    return (swept,)


@app.cell
def _(swept):
    mo.stop(swept is None)
    nb.table(swept.runs[["batch_size", "state", "host", "node", "attempts", "run_id"]],
             label="one row per run: where it ran (measured on this machine)")
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Many processes: DTensor training

    TorchTPU has no single SPMD controller: it runs one process per chip, launched by
    `torchrun`, and shards with DTensor. The same path runs here over gloo on the CPU: the
    form below trains minGPT tiny as a gang of processes, each a rank holding its part
    (FSDP2's `fully_shard` for fsdp, `parallelize_module` column/row plans for tp, the same
    on a 2-D mesh with the gradients averaged over the data axis for dp_tp, DDP for dp). The
    losses must equal one process's; the collectives are what `CommDebugMode` counted in one
    step on rank 0 (bytes counted; their times estimated with the ICI model of a v6e slice).
    """)
    return


@app.cell
def _():
    gang_form = mo.md("{strategy} {processes}").batch(
        strategy=mo.ui.dropdown(list(wb.gang.GANG_STRATEGIES), value="fsdp",
                                label="strategy"),
        processes=mo.ui.dropdown(["2", "4"], value="2" if SMOKE else "4", label="processes"),
    ).form(submit_button_label="run", label="**Many processes** (a gang under torchrun)")
    gang_form
    return (gang_form,)


@app.cell
def _(gang_form):
    # The form's defaults train when the page opens; then every submit trains again.
    gang_result = gang_one = None
    _chosen = gang_form.value or {"strategy": "fsdp", "processes": "2" if SMOKE else "4"}
    if SECTIONS.reuse("gang", gang_form.value is not None,
                      waiting="Press **run** to train over several processes.") is not None:
        _strategy = _chosen["strategy"]
        try:
            _spec = wb.ExperimentSpec(
                model="mingpt", preset="tiny", mode="torch_eager", steps=4,
                mesh=wb.gang.mesh_for(_strategy, int(_chosen["processes"])),
                strategy=_strategy)
            with mo.status.spinner(title=f"{_strategy} over a gang of processes"):
                gang_result = wb.run(_spec)
                gang_one = wb.run(_spec.replace(mesh=None, strategy=None),
                                  reuse=nb.reuse_ok())
            mo.output.replace(mo.md(
                f"Trained on mesh {sharding.mesh_text(gang_result.spec.mesh)}: "
                f"{gang_result.runtime['processes']} processes, "
                f"{gang_result.runtime['dist_backend']}, launched by torchrun."))
        except wb.WorkbenchError as _exc:
            mo.output.replace(nb.failed_run_callout("gang", _exc))
    return gang_one, gang_result


@app.cell
def _(gang_one, gang_result):
    mo.stop(gang_result is None)
    mo.vstack([
        nb.table(nb.rounded(wb.gang.loss_comparison(gang_result, gang_one), significant=7),
                 label="loss per step: the gang vs one process"),
        nb.table(wb.gang.rank_frame(gang_result).pivot(index="step", columns="rank",
                                                    values="wall_ms").add_prefix("rank ")
                 .reset_index(),
                 label="step time of every rank (ms, this machine): a straggler shows as "
                       "one slow column"),
    ])
    return


@app.cell
def _(gang_result):
    mo.stop(gang_result is None)
    _per_call = wb.gang.collectives_frame(gang_result, per_call=True)
    (mo.vstack([
        wb.charts.collective_bytes(_per_call).properties(
            title="collectives CommDebugMode counted in one step"),
        nb.table(wb.gang.collectives_frame(gang_result)[
            ["kind", "phase", "module", "axis", "group_size", "count", "bytes",
             "estimated_us"]], page_size=8,
            label="collectives of one step (rank 0), per call; estimated_us: v6e ICI model"),
    ]) if len(_per_call) else mo.md("_No collectives: nothing is split._"))
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Many hosts: a v6e-16 or v6e-32

    A v6e-8 is one host with 8 chips, the largest single host. A larger slice is built of
    4-chip hosts: a v6e-16 is 4 hosts of 4 chips (4x4), a v6e-32 8 hosts of 4 (4x8).
    torch_xla runs one SPMD process per host over a mesh of all the slice's chips; TorchTPU
    runs `torchrun` on every host, one process per chip. Either way every host must start, or
    the others wait forever. Pick a model, a slice, a runtime and a launcher: memory per chip
    and the collectives of a step are **estimated** (the model's shapes, the slice table and
    the ICI model), and the commands are the ones to copy. Nothing here runs or compiles
    (*Plan a run* compiles a step for a slice with libtpu).
    """)
    return


@app.cell
def _():
    _slices = wb.slice_table()
    slice_controls = mo.md(
        "{model} {preset} {batch} {seq_len}\n\n{slice} {strategy} {runtime} {via}\n\n"
        "{zone} {cluster}").batch(
        model=mo.ui.dropdown(wb.model_names(), value="hf:llama" if HF else "mingpt",
                             label="model"),
        preset=mo.ui.text(value="llama-3-8b" if HF else "gpt-mini", label="preset"),
        batch=mo.ui.number(start=1, stop=65536, value=32, label="global batch"),
        seq_len=mo.ui.number(start=2, stop=131072, step=2, value=2048 if HF else 64,
                             label="sequence length"),
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
def _(slice_controls):
    _c = slice_controls.value
    slice_model = (_c["model"], _c["preset"].strip())
    slice_fit = slice_collectives = slice_launch = None
    try:
        if _c["strategy"] not in sharding.model_strategies(*slice_model):
            raise wb.SpecError(f"{slice_model[0]} {slice_model[1]} does not take strategy "
                               f"{_c['strategy']!r}; it takes "
                               f"{', '.join(sharding.model_strategies(*slice_model))}")
        slice_fit = wb.fit_check(*slice_model, slices=[_c["slice"]],
                                 strategies=sharding.model_strategies(*slice_model),
                                 seq_len=int(_c["seq_len"]), batch_size=int(_c["batch"]),
                                 recompute=HF)
        slice_collectives = wb.model_step_collectives(
            *slice_model, _c["slice"], _c["strategy"], int(_c["batch"]), int(_c["seq_len"]))
        slice_launch = wb.launch_plan(
            _c["slice"], _c["runtime"], _c["via"], model=slice_model[0],
            preset=slice_model[1], batch_size=int(_c["batch"]), strategy=_c["strategy"],
            zone=_c["zone"].strip() or None, cluster=_c["cluster"].strip() or None)
        _row = slice_fit[slice_fit["strategy"] == _c["strategy"]].iloc[0]
        mo.output.replace(mo.vstack([
            mo.md(f"### Memory per chip on {_c['slice']}\n\n{slice_model[0]} "
                  f"{slice_model[1]}: **{_c['strategy']}** "
                  f"{'fits' if _row['fits'] else 'does not fit'}. {_row['reason']}. "
                  f"_Estimated ({sharding.CONVENTION}), not compiled._"),
            wb.charts.fit_bars(slice_fit),
        ]))
    except wb.WorkbenchError as _exc:
        slice_launch = None
        mo.output.replace(mo.callout(mo.md(f"**No plan.** {_exc}"), kind="danger"))
    return slice_collectives, slice_launch


@app.cell
def _(slice_collectives, slice_controls, slice_launch):
    mo.stop(slice_launch is None)
    _total_us = float(slice_collectives["total_us"].sum())
    mo.vstack([
        mo.md(f"### Collectives per step\n\nAbout **{nb.format_us(_total_us)}** of ICI time "
              "per step if none overlapped with compute. _Estimated from the strategy's rule "
              "(dp all-reduces the gradients, fsdp all-gathers the parameters twice and "
              "reduce-scatters the gradients, tp all-reduces each layer's activations four "
              "times a step), not read from a compiled program. "
              f"{sharding.ici_assumptions(wb.get_slice(slice_controls.value['slice']).chip)}_"),
        nb.table(nb.slice_collectives_view(slice_collectives),
                 label=f"collectives of one {slice_controls.value['strategy']} step"),
    ])
    return


@app.cell
def _(slice_launch):
    mo.stop(slice_launch is None)
    mo.vstack([
        mo.md(f"""
        ### The launch plan to copy

        {slice_launch.hosts} hosts x {slice_launch.chips_per_host} chips, mesh
        {sharding.mesh_text(slice_launch.mesh)} over all {slice_launch.chips} chips. Run the
        last line(s) from your machine (`tpu-workbench launch ... --execute` does it where the
        launcher and its credentials exist); the `# every host` lines say what each runs.
        """),
        nb.code_block(slice_launch.text(), max_height_px=400),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## TorchTitan's own trainer: FSDP2, TP and 2D

    [TorchTitan](https://github.com/pytorch/torchtitan) is PyTorch's own trainer for FSDP2,
    tensor and pipeline parallelism. Here it trains its Llama 3 **debug model** (6 layers,
    width 256) three ways over gloo ranks under `torchrun`, each its own gang: **FSDP2** (every
    weight sharded over all ranks), **TP** (every layer split over all ranks) and **2D**
    (FSDP2 across one mesh axis, TP along the other). The workbench runs TorchTitan's own
    `Trainer` from its TOML (`tpu-workbench titan`), on text and a tokenizer made here, and
    streams its metrics into the same records as its own runs; the same seed and global
    batch for all three.
    """)
    return


@app.cell
def _():
    # All three layouts train when the page opens (or show this environment's stored runs);
    # smoke runs (CI) train fewer steps of shorter sequences, FSDP2 and TP over 2 ranks.
    titan_button = mo.ui.run_button(label="train the three layouts again")
    titan_button
    return (titan_button,)


@app.cell
def _(titan_button):
    titan_runs = None
    _ranks = 2 if SMOKE else 4
    _layouts = {"FSDP2": dict(ranks=_ranks, dp_shard=_ranks, tp=1),
                "TP": dict(ranks=_ranks, dp_shard=1, tp=_ranks),
                "2D": dict(ranks=4, dp_shard=2, tp=2)}
    try:
        _specs = [wb.titan_spec(steps=3 if SMOKE else 30, seq_len=32 if SMOKE else None,
                                global_batch=4 if SMOKE else 8, seed=0, **_d)
                  for _d in _layouts.values()]
    except wb.SpecError as _exc:  # no .venv-torchtpu here: say how to get it
        mo.output.replace(mo.callout(mo.md(f"**TorchTitan cannot run here.** {_exc}"),
                                     kind="warn"))
    else:
        _comparison = SECTIONS.run_live(
            "titan", titan_button, _specs,
            chart=lambda f: wb.charts.titan_losses(f, "TorchTitan: training loss, live"),
            final_chart=False)
        if _comparison is not None:
            if _comparison.errors:
                mo.output.replace(nb.failed_run_callout(
                    "titan", next(iter(_comparison.errors.values()))))
            else:
                titan_runs = _comparison.results
    return (titan_runs,)


@app.cell
def _(titan_runs):
    mo.stop(titan_runs is None)
    _first = wb.titan_first_losses(titan_runs)
    _worst = float(_first["rel_diff"].max())
    _fell = bool((_first["heldout_last"] < _first["heldout_first"]).all())
    mo.vstack([
        wb.charts.titan_losses(wb.titan_losses(titan_runs)),
        mo.md(f"{nb.provenance(titan_runs)} The three first losses are within "
              f"**{_worst:.2%}** of each other (same seed, same global batch of "
              f"{int(_first['global_batch'].iloc[0])} sequences; each layout initialises "
              f"its own shards, so not to the bit). The held-out loss "
              f"{'fell under every layout' if _fell else 'did not fall under every layout'}: "
              + ", ".join(f"{r.strategy} {r.heldout_first:.3f} to {r.heldout_last:.3f}"
                          for r in _first.itertuples()) + "."),
        nb.table(nb.rounded(_first, significant=4),
                 label="first step's loss per layout, and the held-out loss after the first "
                       "and the last step (measured on this machine)"),
    ])
    return


@app.cell
def _(titan_runs):
    mo.stop(titan_runs is None)
    _memory = wb.titan_memory(titan_runs)
    _state = _memory.groupby(["strategy", "source"], sort=False).apply(
        lambda g: g.groupby("rank")["bytes"].sum().max(), include_groups=False).unstack()
    _ratio = (_state["measured"] / _state["estimate"]).round(3)
    mo.vstack([
        wb.charts.titan_memory(_memory),
        mo.md("Per rank, TorchTitan's weights, gradients and AdamW state (its ranks' own "
              "shards, **measured** from their tensors) against the workbench's **estimated** "
              "share for the same layout (its one memory convention: 16 bytes a parameter, "
              "split as the layout splits weights, the rule every fit table here uses). "
              "Measured over estimated, largest rank: "
              + ", ".join(f"{k}: {v:g}" for k, v in _ratio.items()) + ". "
              + (("Above 1 for " + ", ".join(_ratio[_ratio > 1].index) + ": what a layout "
                  "keeps whole on every rank (the norms, under TP) or pads (FSDP2 rounds a "
                  "dimension up to a multiple of its ranks), which the estimate splits evenly.")
                 if (_ratio > 1).any() else "The estimate is the measured share on every "
                 "layout.")),
    ])
    return


@app.cell
def _():
    titan_plans = wb.titan_recorded_plans()
    _fit = titan_plans[titan_plans["fits"]]
    mo.vstack([
        mo.md("### TorchTitan's Llama-3 configs on a v6e slice\n\n"
              "`tpu-workbench predict --titan-config llama3_8b --slice v6e-8` reads TorchTitan's "
              "own TOML (flavor, degrees, batch, sequence length, activation checkpointing) "
              "and plans it as any model: the step **compiled by libtpu** for the slice, "
              "never run; the step time **predicted** from the compiled program. "
              + (" ".join(f"{r.titan_config} on a {r.slice} ({r.titan_layout}, global batch "
                          f"{r.batch_size}): {r.compiler_memory_gb:.1f} GB per chip, "
                          f"{r.predicted_step_ms / 1e3:.2f} s a step predicted."
                          for r in _fit.itertuples()) or "No recorded plan fits.")
              + "".join(f" {r.titan_config} on a {r.slice} ({r.titan_layout}): {r.reason}."
                        for r in titan_plans[~titan_plans["fits"]].itertuples())
              + " Recorded by `scripts/bench_titan.py --plan --record` ("
              + ", ".join(sorted(set(titan_plans["recorded_at"].astype(str))))
              + "; libtpu " + ", ".join(sorted(set(titan_plans["libtpu"].dropna().astype(str))))
              + ")."),
        nb.table(titan_plans[["titan_config", "slice", "titan_layout", "batch_size", "fits",
                              "compiler_memory_gb", "predicted_step_ms", "predicted_mfu",
                              "bottleneck"]],
                 label="plans of TorchTitan's own Llama-3 TOMLs (compiled by libtpu, not run)"),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    A **v5p-64** slice (v5p slices are named by TensorCores, two per chip: look it up in the
    slice table, `wb.slice_table()`, or reason from the name). You train on it once with
    **torch_xla** and once with **TorchTPU**. **How many Python processes run the training
    step across the slice in each case?** Answer as two numbers, torch_xla first, e.g. `2, 16`.
    """)
    return


@app.cell
def _():
    answer = mo.ui.text(label="processes (torch_xla, TorchTPU)", placeholder="e.g. 2, 16").form(
        submit_button_label="check", bordered=False)
    answer
    return (answer,)


@app.cell(hide_code=True)
def _(answer):
    # Judged by tpu_workbench/exercises/scale_out.py from the launch plans of the slice.
    _kind, _text = (("neutral", "_Enter two numbers and press **check**._")
                    if answer.value is None else exercise.judge(answer.value, "v5p-64"))
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
