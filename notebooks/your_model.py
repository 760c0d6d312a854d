import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="tpu-workbench: your model")

with app.setup:
    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import models, sharding
    from tpu_workbench import notebook as nb

    SMOKE = wb.smoke_mode()
    DEFAULT_MODEL = "hf:llama"
    # Sections that have run since the notebook opened (see `nb.may_measure`).
    OPENED: set[str] = set()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # Your model on a TPU

    The other notebooks study the workbench's own models. This one takes **yours**: a Hugging
    Face Transformers architecture built from its config (Llama, Qwen2, Gemma-2, GPT-2; random
    weights, nothing downloaded), or your own Python file. It asks the questions a TPU user
    has before renting a chip: does it compile once, what does XLA make of it, what runs outside
    XLA, how is it laid out on a v6e-8, and does the real-size model fit on a v6e slice?

    Training runs use the family's `tiny` preset on the synthetic sorting task of minGPT
    (sequences of digits followed by their sorted version), so accuracy means something and a
    step takes milliseconds. The real sizes (Llama-3-8B and friends) are planned on PyTorch's
    `meta` device: shapes only, no memory, no compile.
    """)
    return


@app.cell
def _():
    _hf = [m for m in wb.model_names() if m.startswith("hf:")]
    architecture = mo.ui.dropdown(_hf or ["mingpt"], value=DEFAULT_MODEL if DEFAULT_MODEL in _hf
                                  else (_hf or ["mingpt"])[0], label="architecture")
    own_file = mo.ui.text(label="or your own model", placeholder="path/to/file.py:make",
                          full_width=True).form(submit_button_label="use", bordered=False)
    mo.vstack([
        mo.hstack([architecture], justify="start"),
        own_file,
        mo.md("_Your own model: `file.py:make` (relative to where you started marimo) or "
              "`package.module:make`, where `make()` returns a `ModelFamily` or a factory with "
              "`build()`, `make_batch(batch_size, generator)` and `loss(model, batch)` (see "
              "`tpu_workbench/models/user.py`; `tests/models/tiny_mlp.py:make` is one). Leave "
              "it empty to use the architecture._")
        if _hf else mo.callout(mo.md("**transformers is not installed here**, so only the "
                                     "workbench's own models are offered."), kind="warn"),
    ])
    return architecture, own_file


@app.cell
def _(architecture, own_file):
    # Which model every section below uses, checked here (no worker starts for a bad one).
    model_ref = (own_file.value or "").strip() or architecture.value
    try:
        family = models.get_model(model_ref)
        model_error = None
    except wb.SpecError as exc:
        family, model_error = None, exc
    mo.stop(model_error is not None, nb.failed_run_callout(model_ref, model_error))
    preset = "tiny" if "tiny" in family.presets else next(iter(family.presets))
    _cfg = family.config(preset)
    # The config's widths and depth under its class's own names (others: `options=` in code)
    fields = family.editable_fields(_cfg) if hasattr(family, "editable_fields") else {}
    mo.md(f"Using **{model_ref}**, preset `{preset}` (presets: "
          f"{', '.join(f'`{p}`' for p in family.presets)}).")
    return family, fields, model_ref, preset


@app.cell
def _(fields):
    config_form = mo.ui.dictionary(
        {k: mo.ui.number(value=v, start=1, step=1, label=k) for k, v in fields.items()}
    ).form(submit_button_label="use this config", bordered=False)
    mo.vstack([mo.md("**The tiny config's fields** (change them and press *use this config*; "
                     "every section below then trains the edited model):"), config_form]
              ) if fields else mo.md("")
    return (config_form,)


@app.cell
def _(config_form, family, fields, preset):
    # Options are the fields that differ from the preset; the family checks them before any run.
    options = {k: int(v) for k, v in (config_form.value or {}).items() if fields.get(k) != v}
    try:
        family.config(preset, **options)
        options_error = None
    except wb.SpecError as exc:
        options_error = exc
    mo.stop(options_error is not None, nb.failed_run_callout("config", options_error))
    mo.md(f"Options: `{options}`" if options else "_The preset as published (no options)._")
    return (options,)


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Eager vs compiled: does it compile once?

    Each mode trains the same model from the same random weights on the same batches in a fresh
    worker. `compiles_steady` must be 0: a model that compiles again in steady state has a shape
    or a Python value that changes from step to step (the *eager vs compiled* notebook shows
    why).
    """)
    return


@app.cell
def _():
    # Smoke runs (CI) skip `compile` here: the HLO and layout sections below compile anyway.
    modes = mo.ui.multiselect(wb.available_modes(), label="modes", value=[
        _m for _m in wb.default_modes() if not (SMOKE and _m == "compile")])
    steps = mo.ui.slider(5, 60, value=10, step=5, label="steps", show_value=True)
    run_training = mo.ui.run_button(label="run")
    mo.hstack([modes, steps, run_training], justify="start", gap=2)
    return modes, run_training, steps


@app.cell
def _(model_ref, modes, options, preset, run_training, steps):
    _go = nb.may_measure(OPENED, "training", run_training.value)
    specs = [wb.ExperimentSpec(model=model_ref, preset=preset, options=options, mode=_m,
                               steps=3 if SMOKE else steps.value) for _m in modes.value]
    mo.stop(not specs, mo.callout(mo.md("Pick at least one mode above."), kind="info"))
    _reuse = nb.reuse_ok() and not run_training.value
    mo.stop(not _go and not (_reuse and all(wb.reusable(_s, cold=not SMOKE) for _s in specs)),
            mo.callout(mo.md("Press **run** above to train with these settings."), kind="info"))
    comparison = wb.run_live(specs, cold=not SMOKE, reuse=_reuse)
    return (comparison,)


@app.cell
def _(comparison):
    summary = wb.summarize(comparison.steps)
    _cols = [c for c in ("mode", "first_step_ms", "steady_median_ms", "compiles_total",
                         "compiles_steady", "final_loss") if c in summary]
    mo.vstack([
        mo.md(nb.provenance(comparison)),
        *nb.run_failures(comparison, summary),
        nb.table(summary[_cols], label="per-mode summary") if len(summary) else mo.md(""),
    ])
    return


@app.cell
def _(comparison):
    wb.charts.loss_curves(comparison.steps) if len(comparison.steps) else mo.md("")
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## What of it runs outside XLA?

    A foreign model is where CPU fallbacks (an op with no XLA lowering: its inputs go to the
    host and back, every step) and Dynamo graph breaks (the graph is cut in two) live. Each run
    counts them: torch_xla's `aten::*` fallback counters per step, and for `dynamo` the breaks
    with their reasons and source lines.
    """)
    return


@app.cell
def _(comparison):
    outside = wb.fallbacks(comparison)
    _real = outside[outside["count"] > 0]
    mo.vstack([
        mo.md("**No CPU fallbacks and no graph breaks** in any measured mode."
              if len(outside) and _real.empty else
              f"**{len(_real)} kind(s) of op ran outside XLA or broke the graph:**"
              if len(_real) else "_No run here measures fallbacks (plain PyTorch only)._"),
        nb.table(outside[[c for c in ("mode", "kind", "op", "count", "per_step", "steps",
                                      "where", "note") if c in outside]],
                 label="ops outside XLA, per mode") if len(outside) else mo.md(""),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## What did XLA compile?

    One `compile` run with XLA's HLO dumps: the op mix of the optimised training step.
    """)
    return


@app.cell
def _():
    run_hlo = mo.ui.run_button(label="run")
    run_hlo
    return (run_hlo,)


@app.cell
def _(model_ref, options, preset, run_hlo):
    mo.stop("compile" not in wb.available_modes(), mo.callout(mo.md(
        "**Skipped: this environment has no torch_xla**, so there is no HLO to show."),
        kind="info"))
    _spec = wb.ExperimentSpec(model=model_ref, preset=preset, options=options, mode="compile",
                              steps=3, capture=("hlo",))
    _reuse = nb.reuse_ok() and not run_hlo.value
    _go = nb.may_measure(OPENED, "hlo", run_hlo.value)
    mo.stop(not _go and not (_reuse and wb.reusable(_spec)),
            mo.callout(mo.md("Press **run** above to capture the HLO."), kind="info"))
    try:
        with mo.status.spinner(title="compiling with HLO dumps"):
            _captured = wb.run(_spec, reuse=_reuse)
        hlo_error = None
    except wb.WorkbenchError as exc:
        _captured, hlo_error = None, exc
    mo.stop(hlo_error is not None, nb.failed_run_callout("HLO capture", hlo_error))
    hlo_ops, _s = nb.step_hlo(_captured)
    mo.md(f"""
    {nb.provenance(_captured)}

    The optimised step has **{len(hlo_ops):,} HLO instructions** in
    {sum(_s["fusions_by_kind"].values())} fusions; FLOPs per step: XLA's cost model
    {nb.xla_flops_text(_s)}.
    """)
    return (hlo_ops,)


@app.cell
def _(hlo_ops):
    wb.charts.op_mix(hlo_ops, top=12, title="ops after optimisation", width=420)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## How is it laid out on a v6e-8?

    8 virtual XLA:CPU devices stand in for a v6e-8's 2x4 chips (the SPMD partitioner is the
    same). `tp` and `dp_tp` split attention heads and MLP widths over the model axis (Llama's
    q/k/v/gate/up column-parallel, o/down row-parallel); with grouped-query attention the KV
    heads must divide the model axis too. The model is only laid out here (`steps=0`):
    nothing is compiled or trained.
    """)
    return


@app.cell
def _():
    strategy = mo.ui.dropdown(list(sharding.STRATEGIES), value="dp_tp", label="strategy")
    run_layout = mo.ui.run_button(label="run")
    mo.hstack([strategy, run_layout], justify="start", gap=2)
    return run_layout, strategy


@app.cell
def _(model_ref, options, preset, run_layout, strategy):
    mo.stop("compile" not in wb.available_modes(), mo.callout(mo.md(
        "**Skipped: this environment has no torch_xla** (no SPMD partitioner)."), kind="info"))
    _shape = sharding.MESHES["v6e-8"]
    _spec = wb.ExperimentSpec(model=model_ref, preset=preset, options=options, mode="compile",
                              steps=0, mesh=tuple(_shape), strategy=strategy.value)
    _reuse = nb.reuse_ok() and not run_layout.value
    mo.stop(not nb.may_measure(OPENED, "layout", run_layout.value)
            and not (_reuse and wb.reusable(_spec)),
            mo.callout(mo.md(f"Press **run** above to lay it out with `{strategy.value}`."),
                       kind="info"))
    try:
        with mo.status.spinner(title=f"laying {model_ref} out on a 2x4 mesh"):
            _result = wb.run(_spec, reuse=_reuse)
        _error = None
    except wb.WorkbenchError as exc:
        _result, _error = None, exc
    mo.stop(_error is not None, nb.failed_run_callout(f"{strategy.value} layout", _error))
    _layout = sharding.layout_frame(_result)
    _largest = sharding.largest_split_tensor(_layout)
    mo.vstack([
        mo.md(nb.provenance(_result)),
        mo.md(f"**{sharding.STRATEGIES[strategy.value]}.** Its largest split parameter, "
              f"`{_largest}` (same colour = same slice):"),
        wb.charts.layout_grid(_layout, _largest, _shape),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Does the real model fit on a v6e slice?

    Per chip: parameters, gradients and Adam state under each strategy, the activations a step
    keeps for its backward pass (from the block's own shape: grouped-query attention, gated
    MLP; with full recomputation only each block's input) and the loss's logits. Counted on
    the meta device: instant, nothing compiled. The convention, the same in every view:
    """)
    return


@app.cell(hide_code=True)
def _():
    mo.md(f"""
    _{sharding.CONVENTION}_
    """)
    return


@app.cell
def _(family):
    _planned = [p for p in family.presets if p != "tiny"] or list(family.presets)
    plan_preset = mo.ui.dropdown(_planned, value=_planned[0], label="preset")
    seq_len = mo.ui.dropdown(["512", "1024", "2048", "4096", "8192"], value="2048",
                             label="sequence length")
    global_batch = mo.ui.dropdown(["8", "16", "32", "64", "128", "256"], value="32",
                                  label="global batch")
    recompute = mo.ui.checkbox(value=True, label="recompute activations")
    mo.hstack([plan_preset, seq_len, global_batch, recompute], justify="start", gap=2)
    return global_batch, plan_preset, recompute, seq_len


@app.cell
def _(global_batch, model_ref, plan_preset, recompute, seq_len):
    try:
        fit = sharding.model_fit_table(model_ref, plan_preset.value, int(global_batch.value),
                                       int(seq_len.value), recompute=recompute.value)
        _error = None
    except wb.SpecError as exc:
        fit, _error = None, exc
    mo.stop(_error is not None, nb.failed_run_callout("fit plan", _error))
    _n = int(fit["params"].iloc[0])
    mo.vstack([
        mo.md(f"**{model_ref} {plan_preset.value}: {_n / 1e9:,.2f} B parameters** "
              f"({_n:,}). Dashed: the usable HBM of one chip."),
        wb.charts.fit_bars(fit),
    ])
    return (fit,)


@app.cell
def _(fit):
    nb.table(fit[["slice", "strategy", "mesh", "fits", "per_device_gb", "activation_gb",
                  "logits_gb", "reason"]], label="fit per slice and strategy", page_size=12)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ### Ask the TPU's compiler

    The table above is a formula. libtpu, the TPU's own compiler, gives the real answer for a
    slice with no chip: it compiles the step (one and two blocks at full width, scaled to all
    of them) and assigns every buffer of a chip's HBM. Its figure beside the formula's, and
    the step time predicted from its program:
    """)
    return


@app.cell
def _():
    compiler_slice = mo.ui.dropdown(["v6e-8", "v6e-16", "v6e-32"], value="v6e-8",
                                    label="slice")
    ask_compiler = mo.ui.run_button(label="compile with libtpu (fsdp; about 2 minutes for an "
                                          "8B model on 2 cores, cached afterwards)")
    mo.hstack([compiler_slice, ask_compiler], justify="start", gap=2)
    return ask_compiler, compiler_slice


@app.cell
def _(
    ask_compiler,
    compiler_slice,
    global_batch,
    model_ref,
    plan_preset,
    recompute,
    seq_len,
):
    mo.stop(not ask_compiler.value,
            mo.md("_Press **compile with libtpu**: nothing is compiled before that._"))
    try:
        with mo.status.spinner(title="libtpu compiles the step") as _spin:
            compiled_plan = wb.predict(model_ref, plan_preset.value,
                                       slices=[compiler_slice.value], strategies=["fsdp"],
                                       seq_len=int(seq_len.value),
                                       batch_size=int(global_batch.value),
                                       recompute=recompute.value,
                                       on_progress=lambda _m: _spin.update(subtitle=_m))
        _error = None
    except wb.WorkbenchError as exc:
        compiled_plan, _error = None, exc
    mo.stop(_error is not None, nb.failed_run_callout("compile for the TPU", _error))
    _r = compiled_plan.iloc[0]
    _memory = (f"**{_r['compiler_memory_gb']:.1f} GB per chip** by the compiler; the formula "
               f"said {_r['estimated_memory_gb']:.1f} GB ({_r['estimate_error']:+.0%})"
               if _r["compiler_memory_gb"] == _r["compiler_memory_gb"] else "")
    mo.callout(mo.md(
        f"{_r['slice']} fsdp: {'fits' if _r['fits'] else 'does not fit'}. {_memory}. "
        + (f"Predicted step: {_r['predicted_step_ms']:,.0f} ms, MFU "
           f"{_r['predicted_mfu']:.0%}, {_r['bottleneck']}-bound (compiled for the slice by "
           f"libtpu {_r['libtpu']}, not run)." if _r["predicted_step_ms"] == _r[
               "predicted_step_ms"] else "")
        + (f" Why not: {_r['reason']}" if not _r["fits"] else "")),
        kind="success" if _r["fits"] else "warn")
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Exercise

    For the preset, sequence length and batch above, **what is the smallest v6e slice on which
    `fsdp` fits?** Read it off the chart (or say *none*), then press **check**. Then switch
    recomputation off and try again.
    """)
    return


@app.cell
def _():
    slice_answer = mo.ui.dropdown(["v6e-8", "v6e-16", "v6e-32", "none"], label="smallest slice"
                                  ).form(submit_button_label="check", bordered=False)
    slice_answer
    return (slice_answer,)


@app.cell
def _(fit, slice_answer):
    mo.stop(slice_answer.value is None,
            mo.md("_Pick a slice and press **check**; nothing is judged before that._"))
    _kind, _verdict = judge_smallest_slice(slice_answer.value, fit)
    mo.callout(mo.md(_verdict), kind=_kind)
    return


@app.function(hide_code=True)
def judge_smallest_slice(said: str, fit) -> tuple[str, str]:
    """The verdict on `said` (a slice name or "none") for the fit table `fit`: ``(callout
    kind, markdown)``. Pure: it starts nothing."""
    _rows = fit[(fit["strategy"] == "fsdp") & fit["fits"]]
    order = list(wb.slice_table()["slice"])
    right = min(_rows["slice"], key=order.index) if len(_rows) else "none"
    if said == right:
        return "success", f"**Right**: {right}" + (
            "." if right == "none" else
            f", at {_rows.set_index('slice').loc[right, 'per_device_gb']:.1f} GB per chip.")
    return "warn", (f"You said {said}; not quite. Look at the `fsdp` bars: which is the first "
                    "panel where the bar stays under the dashed line?")


@app.cell(hide_code=True)
def _():
    mo.md(f"""
    ---
    The same names work from the command line:
    `tpu-workbench bench --model {DEFAULT_MODEL} --preset tiny`. In code:
    `wb.ExperimentSpec(model="{DEFAULT_MODEL}", preset="tiny", options={{"num_hidden_layers": 4}})`,
    or `model="path/to/file.py:make"` for your own.
    """)
    return


if __name__ == "__main__":
    app.run()
