import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="DLRM: embedding tables too big for one chip")

with app.setup:
    import inspect

    import marimo as mo
    import pandas as pd

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench import sharding
    from tpu_workbench.exercises import dlrm as exercise
    from tpu_workbench.models import dlrm, get_model, preset_table

    SMOKE = wb.smoke_mode()
    TINY = get_model("dlrm").config("tiny")
    MESH = (2, 4)  # a v6e-8 host's shape, 8 virtual XLA:CPU devices
    # The strategies the side-by-side section runs (one in smoke runs: each is a compile of
    # the 8-device program, 10-20 s on two busy cores).
    EMBEDDING = list(sharding.EMBEDDING_STRATEGIES)  # every split, in smoke runs (CI) too
    # When each section measures: on open (or a stored run of the same spec), then on its button.
    SECTIONS = nb.Sections()


@app.function
def steps_by_strategy(frame: pd.DataFrame):
    """The side-by-side runs' step times, one line per run: one device, then EMBEDDING."""
    if "run_id" not in frame:
        return wb.charts.step_times(frame)
    return wb.charts.step_times_per_run(frame, ["single", *EMBEDDING])


@app.cell(hide_code=True)
def _():
    mo.md(rf"""
    # DLRM: embedding tables too big for one chip

    A recommendation model scores a (user, item) pair from a few dense numbers and many
    *categorical* ids: the user, the item, the ad, the page... Each id looks up a row of its
    own **embedding table**. DLRM (Naumov et al. 2019) sends the dense features through a
    bottom MLP, looks up and sums a bag of rows per sparse feature, dots every pair of the
    resulting vectors, and a top MLP turns the dots into a click probability.

    Almost all of its parameters sit in the tables, and a step does very little arithmetic
    with them: it reads a few rows per sample and scatters their gradients back. So a step is
    bound by memory (where do 100 GB of tables live?) and by the collectives that move looked-up
    rows between chips, and **how the tables are split** (whole tables per chip, rows, or
    columns) decides whether it fits and what it costs. The `tiny` preset ({len(TINY.table_rows)}
    tables of {TINY.table_rows[0]:,} rows, width {TINY.embedding_dim}) trains in seconds on
    XLA:CPU; `mlperf` is the shape of MLPerf Training's DLRM on Criteo 1TB, built on PyTorch's
    meta device only.
    """)
    return


@app.cell
def _():
    nb.table(preset_table("dlrm")[["preset", "params", "batch_size", "embedding_dim",
                                   "bag_size", "stack_tables", "gflops_per_step"]],
             label="presets: parameters counted on the meta device; gflops_per_step: "
                   "analytic, 3 x the MLPs' and dots' matmuls (a lookup moves bytes, it does "
                   "no FLOPs)")
    return


@app.cell
def _():
    _tables = sharding.table_sizes("dlrm", "mlperf")
    mo.vstack([
        mo.md(f"The five 40M-row tables alone are **{_tables['share'].head(5).sum():.0%}** of "
              f"`mlperf`'s parameters; all {len(_tables)} tables are "
              f"**{_tables['share'].sum():.2%}**: the MLPs are a rounding error."),
        nb.table(_tables.head(10), label=f"mlperf's largest tables (of {len(_tables)}): rows "
                 "from MLPerf's reference (mlcommons/training recommendation_v2), padded to "
                 "multiples of 128; mb in fp32; share of all the model's parameters",
                 page_size=10),
    ])
    return


@app.cell
def _():
    _source = "\n\n".join(inspect.getsource(f) for f in (dlrm._stacked_lookup, dlrm.build_net))
    mo.accordion({"the model's source": mo.ui.code_editor(_source, language="python",
                                                          disabled=True)})
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## The tiny model learns

    Every row of every table carries a hidden score, the dense features a hidden linear one, and
    two tables a hidden pairwise interaction; clicks are drawn from the sigmoid of their sum,
    ids from a power law as in click logs. The metric is the **AUC** on 4,096 held-out samples:
    the chance that a random click is scored above a random non-click (0.5 for a guess).
    """)
    return


@app.cell
def _():
    steps = mo.ui.slider(20, 300, value=60, step=10, label="training steps", show_value=True)
    modes = mo.ui.multiselect(wb.available_modes(), value=["torch_eager", "compile"]
                              if "compile" in wb.available_modes() else ["torch_eager"],
                              label="modes")
    train_button = mo.ui.run_button(label="train")
    mo.hstack([steps, modes, train_button], justify="start", gap=2)
    return modes, steps, train_button


@app.cell
def _(modes, steps, train_button):
    _specs = [wb.ExperimentSpec(model="dlrm", preset="tiny", mode=m,
                                steps=4 if SMOKE else steps.value)
              for m in modes.value]
    trained = SECTIONS.run_live(
        "train", train_button, _specs,
        waiting="Press **train** above to train with these settings (seconds on XLA:CPU).")
    return (trained,)


@app.cell
def _(trained):
    _view = None
    if trained is not None:
        _auc = pd.DataFrame([{"mode": r.spec.mode, "steps": r.spec.steps,
                              "held-out AUC": r.summary["metric"],
                              "final loss": float(r.steps["loss"].iloc[-1])}
                             for r in trained.results])
        _view = mo.vstack([
            mo.md(nb.provenance(trained, button="train")),
            nb.table(_auc, label="AUC on 4,096 held-out samples after training (a model "
                                 "that guesses: 0.50); the step times above are this CPU's"),
        ])
    _view
    return


@app.cell(hide_code=True)
def _():
    mo.md(rf"""
    ## Three ways to split the tables, side by side

    On the {sharding.mesh_text(MESH)} mesh of a v6e-8 host (8 virtual XLA:CPU devices, the
    same SPMD partitioner a TPU uses), the tables split three ways while the MLPs and the batch
    stay data parallel over all 8 devices:

    - **table**: whole tables per device. Under GSPMD every device runs one program and holds a
      buffer of every parameter, so a table cannot live on one device alone: the tables are
      *stacked* into one `[tables, rows, dim]` tensor whose table dim is split.
    - **row**: each table's rows split over the devices.
    - **column**: each table's width split over the devices.

    Each runs the same three steps as one device; the losses must agree.
    """)
    return


@app.cell
def _():
    split_button = mo.ui.run_button(label="run the three strategies")
    split_button
    return (split_button,)


@app.cell
def _(split_button):
    _steps = 2 if SMOKE else 3
    _specs = [wb.ExperimentSpec(model="dlrm", preset="tiny", mode="compile", steps=_steps)] + [
        wb.ExperimentSpec(model="dlrm", preset="tiny", mode="compile", steps=_steps, mesh=MESH,
                          strategy=s, capture=("hlo",)) for s in EMBEDDING]
    _runs = SECTIONS.run_live(
        "strategies", split_button, _specs, chart=steps_by_strategy,
        waiting="Press **run the three strategies** to measure them.")
    split_runs = None if _runs is None else dict(zip(["single", *EMBEDDING], _runs.results,
                                                     strict=True))
    return (split_runs,)


@app.cell
def _(split_runs):
    _view = None
    if split_runs is not None:
        _agree = sharding.loss_agreement([split_runs[s] for s in EMBEDDING],
                                         split_runs["single"])
        _view = mo.vstack([
            mo.md(nb.provenance(list(split_runs.values()), button="run the three strategies")),
            nb.table(_agree, label="losses per step beside one device's (XLA:CPU); "
                                   "max_rel_diff: reduction order only"),
        ])
    _view
    return


@app.cell
def _(split_runs):
    _view = None
    if split_runs is not None:
        _grids = {s: wb.charts.layout_grid(sharding.layout_frame(split_runs[s]),
                                           "embedding.weight", MESH, cell=90).properties(
            title=f"{s}: embedding.weight [8, {TINY.table_rows[0]}, 16]") for s in EMBEDDING}
        _view = mo.vstack([mo.md("**What each device holds of the stacked tables** "
                                 "(torch_xla's own per-device index ranges; a tab per "
                                 "strategy):"), mo.ui.tabs(_grids)])
    _view
    return


@app.cell
def _(split_runs):
    _view = None
    if split_runs is not None:
        _memory = pd.concat([sharding.memory_per_device(split_runs[s]).assign(strategy=s)
                             for s in EMBEDDING], ignore_index=True)
        _view = wb.charts.memory_bars(_memory)
    _view
    return


@app.cell
def _(split_runs):
    split_collectives = None if split_runs is None else pd.concat(
        [sharding.collectives_frame(split_runs[s], chip="v6e", mesh_shape=MESH)
         .assign(strategy=s) for s in EMBEDDING], ignore_index=True)
    _view = None
    if split_collectives is not None:
        _view = mo.vstack([
            mo.md(r"""
            **The collectives each strategy costs**, read from XLA:CPU's partitioned step
            (estimated ICI time for a v6e-8 in the table's `estimated_us`). Every device
            first all-gathers the whole batch's ids. Under **table** and **row** each device
            looks up the rows it holds for the whole batch (zeros elsewhere) and an all-reduce
            sums the partial rows; the backward all-gathers their gradients so each device can
            scatter-add into its own rows. Under **column** each device looks up its columns
            for the whole batch and an all-to-all trades columns for samples. No strategy moves
            a table or its gradient; only the five small MLP gradients are all-reduced.
            GSPMD chooses per op by size: with tables no larger than one batch's lookups
            (256 rows here) it all-gathers the whole table instead, as dp would.
            """),
            wb.charts.collective_bytes(split_collectives),
        ])
    _view
    return (split_collectives,)


@app.cell
def _(split_collectives):
    _view = None
    if split_collectives is not None:
        _by = pd.concat([sharding.collectives_by_source(
            split_collectives[split_collectives["strategy"] == s]).assign(strategy=s)
            for s in EMBEDDING], ignore_index=True)
        _view = nb.table(_by[["strategy", "kind", "axis", "source", "count", "mb"]],
                         label="per strategy: collectives by kind and the op that made them "
                               "(XLA:CPU's partitioned step; MB per device)")
    _view
    return


@app.cell
def _(split_runs):
    _view = None
    if split_runs is not None:
        _view = nb.table(sharding.lookup_ops(split_runs["row"]),
                         label="row: the gathers and scatters of one device's compiled step "
                               "(shapes per device): the lookup of the whole batch's rows "
                               "from its slice, and the scatter-add of their gradients into it")
    _view
    return


@app.cell
def _(split_runs):
    _view = None
    if split_runs is not None:
        _view = wb.charts.step_time_per_strategy(
            sharding.summary_frame(list(split_runs.values()))).properties(
            title="steady step time on XLA:CPU (8 virtual devices on this CPU's cores: not a "
                  "TPU's time)")
    _view
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## The real shape on a v6e slice

    MLPerf's DLRM has 204 M rows of width 128 over 26 tables. Training it in fp32 with AdamW
    keeps 16 bytes per parameter a chip holds (weights, gradients, two moments). The table below
    reads each strategy's per-chip bytes from the GSPMD plan of the model built on the meta
    device, for a **v6e-8**: an **estimate** from the plan (activations, MBs at this batch, left
    out), not a compile and not a measurement. Each chip's slice is counted as a TPU lays out
    an fp32 array, its last dim in 128 lanes: under **column** a chip's 16 of the 128 columns
    take as much memory as all 128. For **table** the 26 tables are stacked, so each is
    padded to the largest one's 40M rows. libtpu's own compile of the step gives the same
    verdicts (`notes/dlrm.md`).
    """)
    return


@app.cell
def _():
    _fit = sharding.embedding_fit_table("dlrm", "mlperf", slices=("v6e-8",))
    nb.table(_fit[["slice", "strategy", "tables_gb", "dense_gb", "params_gb", "state_gb",
                   "usable_gb", "fits"]],
             label=f"v6e-8, estimated per chip: {sharding.EMBEDDING_CONVENTION}")
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    **What the workbench cannot show.** v5p and v6e chips have **SparseCores**, units next to
    the TensorCores made for embedding lookups: a TPU serves DLRM's tables there (JAX's
    `jax_tpu_embedding`). torch_xla 2.9 has no path to them, so every lookup here is an XLA
    gather on the TensorCores, and the collectives are GSPMD's, not SparseCore's. The v6e
    figures above are an estimate from the sharding plan. libtpu compiles the same step for a
    v6e with no chip (`tpu-workbench compile --model dlrm --preset mlperf --slice v6e-16
    --strategy row --batch 2048`): the TPU's own memory per chip and collectives, minutes of
    this CPU per compile, so not on this page; `notes/dlrm.md` has the figures.
    """)
    return


@app.cell(hide_code=True)
def _():
    mo.md(rf"""
    ## Workshop exercise

    On a **{exercise.SLICE}** (16 chips of 32 GB), which strategies let the `mlperf` preset
    train in fp32 with AdamW? Scale the v6e-8 table above, remember how **table** pads the
    stacked tables, pick every strategy that fits, and press **check**.
    """)
    return


@app.cell
def _():
    answer = mo.ui.multiselect(list(exercise.CHOICES), label="strategies that fit").form(
        submit_button_label="check", bordered=False)
    answer
    return (answer,)


@app.cell(hide_code=True)
def _():
    # The plan of each strategy on the asked slice, for the check (not shown).
    fit_facts = exercise.fit_facts()
    return (fit_facts,)


@app.cell(hide_code=True)
def _(answer, fit_facts):
    mo.stop(answer.value is None,
            mo.md("_Pick strategies and press **check**; nothing is judged before that._"))
    _kind, _text = exercise.judge_fit(answer.value, fit_facts)
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
