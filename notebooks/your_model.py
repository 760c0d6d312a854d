import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="tpu-workbench: your model")

with app.setup:
    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import models, sharding
    from tpu_workbench import notebook as nb
    from tpu_workbench.exercises import your_model as exercise

    SMOKE = wb.smoke_mode()
    DEFAULT_MODEL = "hf:llama"
    # A user's model file with a graph break, to show what one looks like (None outside a
    # checkout of the workbench).
    MOE = nb.example_model("tiny_moe")
    # When each section measures: on open, then on its button (notebook.Sections).
    SECTIONS = nb.Sections()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # Your model on a TPU

    The other notebooks study the workbench's own models. This one takes **yours**: a Hugging
    Face Transformers architecture built from its config (Llama, Qwen2, Gemma-2, GPT-2; random
    weights, nothing downloaded), or your own Python file. It asks the questions a TPU user
    has before renting a chip: does it compile once, what does XLA make of it, what runs outside
    XLA (CPU fallbacks, Dynamo graph breaks), how is it laid out on a v6e-8, and does the
    real-size model fit on a v6e slice?

    Training runs use the family's `tiny` preset on the synthetic sorting task of minGPT
    (sequences of digits followed by their sorted version): a step takes milliseconds, and the
    task has a right answer, so the summary shows each run's accuracy beside its loss. The
    real sizes (Llama-3-8B and friends) are planned on PyTorch's `meta` device: shapes only, no
    memory, no compile.
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
    # Which model every section below uses, checked here (no worker starts for a bad one). A
    # file that does not load shows why, and the sections keep the architecture meanwhile.
    _own = (own_file.value or "").strip()
    try:
        model_ref = _own or architecture.value
        family, _error = models.get_model(model_ref), None
    except wb.SpecError as exc:
        model_ref, _error = architecture.value, exc
        family = models.get_model(model_ref)
    preset = "tiny" if "tiny" in family.presets else next(iter(family.presets))
    # The config's widths and depth under its class's own names (others: `options=` in code)
    fields = (family.editable_fields(family.config(preset))
              if hasattr(family, "editable_fields") else {})
    _using = mo.md(f"Using **{model_ref}**, preset `{preset}` (presets: "
                   f"{', '.join(f'`{p}`' for p in family.presets)}).")
    mo.vstack([nb.failed_run_callout(_own, _error), _using]) if _error else _using
    return family, fields, model_ref, preset


@app.cell
def _(fields, preset):
    config_form = nb.config_form(fields)
    mo.vstack([mo.md(f"**The `{preset}` config's fields** (change them and press *use this "
                     "config*; every section below then trains the edited model):"),
               config_form]) if fields else None
    return (config_form,)


@app.cell
def _(config_form, family, fields, preset):
    # Options are the fields that differ from the preset; the family checks them before any
    # run. A bad edit shows why, and the sections keep the preset meanwhile.
    try:
        options = {k: type(fields[k])(v) for k, v in (config_form.value or {}).items()
                   if v != fields[k]}
        family.config(preset, **options)
        _error = None
    except (wb.SpecError, TypeError, ValueError) as exc:
        options, _error = {}, exc
    _said = mo.md(f"Options: `{options}`" if options else
                  "_The preset as published (no options)._")
    mo.vstack([nb.failed_run_callout("config", _error), _said]) if _error else _said
    return (options,)


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Eager vs compiled: does it compile once?

    Each mode trains the same model from the same random weights on the same batches in a fresh
    worker. `compiles_steady` counts the compilations from step 1 on. For `lazy` and `compile`
    it must be 0: a model that compiles again in steady state has a shape or a Python value
    that changes from step to step (the *eager vs compiled* notebook shows why). `dynamo` is
    among the modes because it is the one that counts graph breaks (next section); it warms
    up over two steps, not one: torch_xla's openxla bridge compiles 4 programs at step 0 and 2
    more at step 1, then none (measured here on every model tried), so its `compiles_steady`
    of 2 is that second warm-up step, not a recompile per step. What matters is that nothing
    compiles after it: the step-time chart flattens from step 2.
    """)
    return


@app.cell
def _():
    # Smoke runs (CI) skip `compile` and `dynamo` here: the HLO and layout sections below
    # compile anyway, and the graph-break example runs dynamo on a small model.
    modes = mo.ui.multiselect(wb.available_modes(), label="modes", value=[
        _m for _m in [*wb.default_modes(), "dynamo"] if _m in wb.available_modes()
        and not (SMOKE and _m in ("compile", "dynamo"))])
    steps = mo.ui.slider(5, 60, value=10, step=5, label="steps", show_value=True)
    run_training = mo.ui.run_button(label="run")
    mo.hstack([modes, steps, run_training], justify="start", gap=2)
    return modes, run_training, steps


@app.cell
def _(model_ref, modes, options, preset, run_training, steps):
    specs = [wb.ExperimentSpec(model=model_ref, preset=preset, options=options, mode=_m,
                               steps=3 if SMOKE else steps.value) for _m in modes.value]
    if specs:
        comparison = SECTIONS.run_live("training", run_training, specs, cold=True,
                                       waiting="Press **run** above to train with these "
                                               "settings.")
    else:
        mo.output.replace(mo.callout(mo.md(
            "Pick at least one mode above: nothing trains without one."), kind="info"))
        comparison = None
    return (comparison,)


@app.cell
def _(comparison, family, preset):
    summary = None if comparison is None else wb.summarize_results(comparison.results)
    _cols = [c for c in ("mode", "final_loss", "metric", "compiles_steady", "compiles_total",
                         "steady_median_ms", "first_step_ms")
             if summary is not None and c in summary]
    _metric = (str(summary["metric_name"].iloc[0])
               if summary is not None and len(summary) else "metric")
    _shown = (summary[_cols].rename(columns={"metric": _metric})
              if summary is not None and len(summary) else None)
    _digits = getattr(family.config(preset), "n_digits", None)
    (None if comparison is None else mo.vstack([
        mo.md(nb.provenance(comparison)),
        *nb.run_failures(comparison, summary),
        nb.table(_shown, label="per-mode summary (ms: measured on this machine)",
                 column_widths={c: 115 for c in _shown.columns})
        if _shown is not None else None,
        mo.md(f"`{_metric}`: the model's own evaluation after the last step, on a held-out "
              "batch"
              + (f": the sorted half's tokens, each predicted from the right answer so far. "
                 f"A uniform guess over the {_digits} digits scores {1 / _digits:.0%}; after a "
                 "few steps nobody expects sorting, but the modes start from the same weights "
                 "and see the same batches, so they should agree." if _digits else ".")),
    ]))
    return


@app.cell
def _(comparison):
    (wb.charts.loss_curves(comparison.steps)
     if comparison is not None and len(comparison.steps) else None)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## What of it runs outside XLA?

    A foreign model is where CPU fallbacks (an op with no XLA lowering: its inputs go to the
    host and back, every step) and Dynamo graph breaks (the graph is cut in two) live. Each run
    counts what its mode can see: torch_xla's `aten::*` fallback counters per step in every
    torch_xla mode, and in `dynamo` the graph breaks with their reasons and source lines.
    """)
    return


@app.cell
def _(comparison):
    outside = None if comparison is None else wb.fallbacks(comparison)
    mo.md(nb.outside_xla_text(outside)) if outside is not None else None
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ### What a graph break looks like

    Not your model: `tests/models/tiny_moe.py`, a top-1 mixture of experts written the way
    many are, with `if mask.any():` (a Python branch on a tensor's value) inside its loop over
    the experts. Trained in `dynamo` for 3 steps on this machine:
    """)
    return


@app.cell
def _():
    run_break = mo.ui.run_button(label="run")
    run_break
    return (run_break,)


@app.cell
def _(run_break):
    _spec = (wb.ExperimentSpec(model=MOE, preset="default", mode="dynamo", steps=3)
             if MOE and "dynamo" in wb.available_modes() else None)
    try:
        _moe = None if _spec is None else SECTIONS.run(
            "graph break", run_break, _spec, title="training tiny_moe in dynamo",
            waiting="Press **run** above to train the example in `dynamo`.")
        _error = None
    except wb.WorkbenchError as exc:
        _moe, _error = None, exc
    _rows = None if _moe is None else wb.fallbacks(_moe)
    (mo.callout(mo.md("**Skipped:** " + ("this environment has no torch_xla, so no `dynamo`."
                                         if MOE else "the example model is not in this "
                                         "installation (it lives in the workbench's tests/).")),
                kind="info") if _spec is None else
     nb.failed_run_callout("graph-break example", _error) if _error else
     None if _rows is None else mo.md(
         f"{nb.provenance(_moe)}\n\n{nb.outside_xla_text(_rows)}"))
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## What did XLA compile?

    One `compile` run with XLA's HLO dumps: the op mix of the optimised training step, as
    XLA:CPU compiled it here.
    """)
    return


@app.cell
def _():
    run_hlo = mo.ui.run_button(label="run")
    run_hlo
    return (run_hlo,)


@app.cell
def _(model_ref, options, preset, run_hlo):
    _spec = (wb.ExperimentSpec(model=model_ref, preset=preset, options=options,
                               mode="compile", steps=3, capture=("hlo",))
             if "compile" in wb.available_modes() else None)
    try:
        _captured = None if _spec is None else SECTIONS.run(
            "hlo", run_hlo, _spec, title="compiling with HLO dumps",
            waiting="Press **run** above to capture the HLO of these settings.")
        _error = None
    except wb.WorkbenchError as exc:
        _captured, _error = None, exc
    hlo_ops, _s = (None, None) if _captured is None else nb.step_hlo(_captured)
    (mo.callout(mo.md("**Skipped: this environment has no torch_xla**, so there is no HLO to "
                      "show."), kind="info") if _spec is None else
     nb.failed_run_callout("HLO capture", _error) if _error else
     None if _captured is None else mo.md(f"""
    {nb.provenance(_captured)}

    The optimised step has **{len(hlo_ops):,} HLO instructions** in
    {sum(_s["fusions_by_kind"].values())} fusions; FLOPs per step: XLA's cost model
    {nb.xla_flops_text(_s)}.
    """))
    return (hlo_ops,)


@app.cell
def _(hlo_ops):
    (wb.charts.op_mix(hlo_ops, top=12, title="ops after optimisation (XLA:CPU)", width=420)
     if hlo_ops is not None else None)
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
    _shape = sharding.MESHES["v6e-8"]
    _spec = (wb.ExperimentSpec(model=model_ref, preset=preset, options=options,
                               mode="compile", steps=0, mesh=tuple(_shape),
                               strategy=strategy.value)
             if "compile" in wb.available_modes() else None)
    try:
        _result = None if _spec is None else SECTIONS.run(
            "layout", run_layout, _spec, title=f"laying {model_ref} out on a 2x4 mesh",
            waiting=f"Press **run** above to lay it out with `{strategy.value}`.")
        _error = None
    except wb.WorkbenchError as exc:
        _result, _error = None, exc
    _layout = None if _result is None else sharding.layout_frame(_result)
    _largest = None if _layout is None else sharding.largest_split_tensor(_layout)
    (mo.callout(mo.md("**Skipped: this environment has no torch_xla** (no SPMD "
                      "partitioner)."), kind="info") if _spec is None else
     nb.failed_run_callout(f"{strategy.value} layout", _error) if _error else
     None if _layout is None else mo.vstack([
         mo.md(nb.provenance(_result)),
         mo.md(f"**{sharding.STRATEGIES[strategy.value]}.** Its largest split parameter, "
               f"`{_largest}` (same colour = same slice):"),
         wb.charts.layout_grid(_layout, _largest, _shape),
     ]))
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
    _n = None if fit is None else int(fit["params"].iloc[0])
    (nb.failed_run_callout("fit plan", _error) if _error else mo.vstack([
        mo.md(f"**{model_ref} {plan_preset.value}: {_n / 1e9:,.2f} B parameters** "
              f"({_n:,}). Estimated by the convention above, not compiled; dashed: the usable "
              "HBM of one chip."),
        wb.charts.fit_bars(fit),
    ]))
    return (fit,)


@app.cell
def _(fit):
    (nb.table(fit[["slice", "strategy", "mesh", "fits", "per_device_gb", "activation_gb",
                   "logits_gb", "reason"]],
              label="fit per slice and strategy (GB per chip, estimated)", page_size=12,
              wrapped_columns=["reason"],
              column_widths={"slice": 70, "strategy": 75, "mesh": 55, "fits": 55,
                             "per_device_gb": 110, "activation_gb": 110, "logits_gb": 90,
                             "reason": 330},
              show_column_summaries=False)
     if fit is not None else None)
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
    ask_compiler = mo.ui.run_button(label="compile with libtpu again (fsdp; about 2 minutes "
                                          "for an 8B model on 2 cores, cached afterwards)")
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
    # Compiled when the page opens (and read from libtpu's cache when it opens again), then on
    # the button. Smoke runs (CI) compile the same path for the tiny preset at a short length.
    _preset, _seq, _batch = (("tiny", 64, 8) if SMOKE else
                             (plan_preset.value, int(seq_len.value), int(global_batch.value)))
    compiled_plan, _error = None, None
    if SECTIONS.reuse("libtpu", ask_compiler.value,
                      waiting="Press **compile with libtpu again** to compile these settings "
                              "for the TPU.") is not None:
        try:
            with mo.status.spinner(title="libtpu compiles the step") as _spin:
                compiled_plan = wb.predict(model_ref, _preset, slices=[compiler_slice.value],
                                           strategies=["fsdp"], seq_len=_seq,
                                           batch_size=_batch, recompute=recompute.value,
                                           on_progress=lambda _m: _spin.update(subtitle=_m))
        except wb.WorkbenchError as exc:
            _error = exc
    if _error is not None:
        mo.output.replace(nb.failed_run_callout("compile for the TPU", _error))
    if compiled_plan is not None:
        _r = compiled_plan.iloc[0]
        _memory = (f"**{_r['compiler_memory_gb']:.3g} GB per chip** by the compiler; the "
                   f"formula said {_r['estimated_memory_gb']:.3g} GB "
                   f"({_r['estimate_error']:+.0%})"
                   if _r["compiler_memory_gb"] == _r["compiler_memory_gb"] else "")
        mo.output.replace(mo.callout(mo.md(
            f"{_r['slice']} fsdp: {'fits' if _r['fits'] else 'does not fit'}. {_memory}. "
            + (f"Predicted step on a v6e: {_r['predicted_step_ms']:,.3g} ms, MFU "
               f"{_r['predicted_mfu']:.0%}, {_r['bottleneck']}-bound (an estimate: the "
               f"workbench's roofline of the program libtpu {_r['libtpu']} compiled for the "
               "slice; nothing ran)." if _r["predicted_step_ms"] == _r["predicted_step_ms"]
               else "")
            + (f" Why not: {_r['reason']}" if not _r["fits"] else "")),
            kind="success" if _r["fits"] else "warn"))
    return


@app.cell(hide_code=True)
def _():
    _hbm, _usable = exercise.one_chip_hbm()
    mo.md(rf"""
    ## Exercise

    The table plans slices of 8, 16 and 32 chips. Now think of **one** v6e chip
    (`{exercise.SLICE}`: {_hbm:g} GB of HBM, of which the convention lets a step use
    {_usable:.1f} GB). **What is the largest global batch of the preset above, at its sequence
    length and recomputation setting, that trains on one chip?** Work it out from the
    convention and the table's rows: what of a chip's figure stays the same when the batch
    changes, and what grows with each sequence a chip holds? Enter 0 if not even one sequence
    fits, then press **check**.
    """)
    return


@app.cell
def _():
    batch_answer = mo.ui.text(placeholder="a whole number", label="largest global batch").form(
        submit_button_label="check", bordered=False)
    batch_answer
    return (batch_answer,)


@app.cell(hide_code=True)
def _(model_ref, plan_preset, recompute, seq_len):
    # The convention's answer for the question's chip (sharding.fit), for the check.
    try:
        one_chip = exercise.one_chip_facts(model_ref, plan_preset.value, int(seq_len.value),
                                           recompute.value)
    except wb.SpecError:
        one_chip = None  # no fit plan for this model: the check says so
    return (one_chip,)


@app.cell(hide_code=True)
def _(batch_answer, one_chip):
    mo.stop(batch_answer.value is None,
            mo.md("_Enter your answer and press **check**; nothing is judged before that._"))
    _kind, _verdict = exercise.judge_batch(batch_answer.value, one_chip)
    mo.callout(mo.md(_verdict), kind=_kind)
    return


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
