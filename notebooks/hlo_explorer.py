import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="HLO explorer: what XLA compiled")

with app.setup:
    import marimo as mo
    import pandas as pd

    import tpu_workbench as wb
    from tpu_workbench import hlo, profiling
    from tpu_workbench import notebook as nb
    from tpu_workbench.models import get_model

    SMOKE = wb.smoke_mode()
    HLO_MODES = wb.hlo_modes()  # the modes that compile HLO here
    # What the page measures on open, before any control is submitted.
    DEFAULT_MODEL = "mingpt"
    DEFAULT_MODE = "compile" if "compile" in HLO_MODES else HLO_MODES[0]
    # Opcodes that only move values around, left out of the exercise's count.
    PLUMBING = ("parameter", "constant", "get-tuple-element", "tuple")


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # HLO explorer: what XLA compiled

    Every XLA mode turns your PyTorch step into **HLO**, XLA's program format. XLA then
    optimises it: it fuses elementwise ops into kernels, picks layouts, and (when sharded)
    partitions it over devices, inserting collectives. This notebook captures the HLO of a
    training step before and after optimisation, and shows it as tables and charts: the op mix,
    the fusions, the FLOPs XLA's own cost model counts, a roofline of the measured ops, and a
    diff of two ways of compiling the same step.
    """)
    return


@app.cell
def _():
    model_form = mo.ui.dropdown(wb.model_names(), value=DEFAULT_MODEL, label="model").form(
        submit_button_label="run", label="**Model** (every section)")
    mode_form = mo.ui.dropdown(HLO_MODES, value=DEFAULT_MODE, label="mode").form(
        submit_button_label="run", label="**Mode** (the captured step)")
    # A form sends nothing when submitted unchanged: capturing the same again is this button.
    remeasure = mo.ui.run_button(label="measure again")
    mo.vstack([
        mo.hstack([model_form, mode_form], justify="start", align="start", gap=2),
        mo.md("_The page measured the defaults when it opened. **run** measures a new choice: "
              "a new mode re-captures one step; a new model re-captures it and the lazy and "
              "dynamo runs below. minGPT and the MLP take seconds on XLA:CPU, **ResNet and "
              "UNet minutes**._"),
        mo.hstack([remeasure, mo.md("the captured step with the same choices")],
                  justify="start", align="center", gap=1),
    ])
    return mode_form, model_form, remeasure


@app.cell
def _(model_form):
    # Both measured sections read the model from here; only the next one reads the mode.
    model_name = "mlp" if SMOKE else (model_form.value or DEFAULT_MODEL)
    return (model_name,)


@app.cell
def _(mode_form, model_form, model_name, remeasure):
    _spec = wb.ExperimentSpec(model=model_name, preset="tiny",
                              mode=mode_form.value or DEFAULT_MODE, steps=3 if SMOKE else 6,
                              capture=("hlo", "profile"))
    # An HLO capture always gets a fresh worker (a warm one would dump nothing), so what
    # follows, the exercise included, comes from a step compiled from scratch.
    with mo.status.spinner(title=f"compiling and profiling {wb.label(_spec)}"):
        result = wb.run(_spec, reuse=nb.reuse_ok() and model_form.value is None
                        and mode_form.value is None and not remeasure.value)
    files = hlo.load_run_hlo(result)
    before = hlo.main_module(files, "before_optimizations")
    after = hlo.main_module(files, "after_optimizations")
    mo.vstack([
        mo.md(f"## {wb.label(_spec)}\n\n{nb.provenance(result, button='measure again')}"),
        nb.table(files[["module", "stage"]].assign(kb=files["bytes"] / 1e3)
                 .rename(columns={"kb": "text (KB)"}),
                 label=f"{files['module'].nunique()} module(s) compiled by the step"),
    ])
    return after, before, result


@app.cell
def _(after, before):
    ops_before = hlo.instructions(before)
    ops_after = hlo.instructions(after)
    _s = hlo.summary(after, frame=ops_after)
    mo.md(f"""
    **Before optimisation**: {len(ops_before):,} instructions. **After**: {len(ops_after):,},
    of which {sum(_s["fusions_by_kind"].values())} fusions.
    FLOPs per step: XLA's cost analysis {nb.xla_flops_text(_s)}; the analytic dot and
    convolution count {_s["dot_flops"] / 1e9:,.3f} GFLOP.
    """)
    return ops_after, ops_before


@app.cell
def _(ops_after, ops_before):
    mo.hstack([wb.charts.op_mix(ops_before, top=15, title="before optimisation"),
               wb.charts.op_mix(ops_after, top=15, title="after optimisation")],
              justify="start", gap=1)
    return


@app.cell
def _(ops_after):
    _fusions = wb.hlo.fusion_table(ops_after).sort_values("fused_count", ascending=False,
                                                         ignore_index=True)
    nb.table(_fusions[["name", "fusion_kind", "fused_count", "fused_ops", "shape"]]
             .rename(columns={"fused_count": "ops fused"}), page_size=8,
             label=f"{len(_fusions)} fusions XLA created (kernels it will run), largest first")
    return


@app.cell
def _():
    _targets = wb.roofline_targets()
    target = mo.ui.dropdown(_targets, value=_targets[0], label="roofline against")
    target
    return (target,)


@app.cell
def _(after, result, target):
    _cost = hlo.per_op_cost(after)
    _timed = profiling.op_costs_with_times(_cost, profiling.load_profile(result).ops)
    _peak, _bw, _source = wb.roofline_roof(target.value)
    _host = target.value == wb.roofline_targets()[0]
    # on this host: each op at its measured time; on a chip: where its FLOPs and bytes put it
    _what = "measured time per op" if _host else "where each op could sit"
    wb.charts.roofline(_timed if _host else _cost, _peak, _bw,
                       title=f"roofline: {_what}, {_source}")
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    Left of the ridge an op is limited by memory bandwidth, right of it by compute. Elementwise
    fusions sit far left: on a TPU they are cheap only when fused into the matmuls around them.
    """)
    return


@app.cell
def _():
    pattern = mo.ui.text(value="dot", label="search the optimised HLO (regex)")
    pattern
    return (pattern,)


@app.cell
def _(after, pattern):
    nb.table(hlo.search(after, pattern.value)[["computation", "name", "opcode", "text"]],
             page_size=8, label="matching instructions")
    return


@app.cell
def _(after):
    mo.accordion({"optimised HLO text (the whole step)": mo.plain_text(after[:200_000])})
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Lazy vs dynamo: one program or several?

    `lazy` traces the whole step into one graph; `dynamo` (`torch.compile(backend="openxla")`)
    compiles the forward and backward graphs Dynamo captures, and the optimizer runs lazily
    after them. Same model, same math, different programs:
    """)
    return


@app.cell
def _():
    again = mo.ui.run_button(label="run lazy and dynamo again")
    again
    return (again,)


@app.cell
def _(again, model_form, model_name):
    _reuse = nb.reuse_ok() and model_form.value is None and not again.value
    _runs, _texts = [], {}
    for _m in ("lazy", "dynamo"):
        _spec = wb.ExperimentSpec(model=model_name, preset="tiny", mode=_m, steps=2,
                                  capture=("hlo",))
        _runs.append(wb.run(_spec, reuse=_reuse))
        _texts[_m] = hlo.read_hlo(hlo.load_run_hlo(_runs[-1]), "after_optimizations")
    module_diff = hlo.diff_modules(_texts["lazy"], _texts["dynamo"], "lazy", "dynamo")
    mo.vstack([mo.md(nb.provenance(_runs, button="run lazy and dynamo again")),
               wb.charts.diff_chart(module_diff, label_a="lazy", label_b="dynamo")])
    return (module_diff,)


@app.cell
def _(module_diff):
    nb.table(module_diff[module_diff["delta"] != 0][["kind", "item", "a", "b", "delta"]]
             .rename(columns={"a": "lazy", "b": "dynamo", "delta": "dynamo - lazy"}),
             page_size=8, label="what differs (counts)")
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## The same step, as a TPU v6e compiles it

    Everything above is XLA:CPU's optimised program: its fusions, its layouts, its bytes. The
    TPU's compiler, libtpu, makes a different program of the same step, and it runs here too
    with no chip: the workbench traces the step (weights, Adam state and batch as inputs of
    the program, nothing run) and libtpu compiles it for one v6e chip. Side by side: what each
    compiler made of one training step of the model above.
    """)
    return


@app.cell
def _():
    tpu_button = mo.ui.run_button(label="compile for a v6e-1 with libtpu (seconds for the "
                                        "small models, cached afterwards)")
    tpu_button
    return (tpu_button,)


@app.cell
def _(model_name, ops_after, tpu_button):
    mo.stop(not tpu_button.value,
            mo.md("_Press the button: nothing is compiled for the TPU before that._"))
    _family = get_model(model_name)
    _cfg = _family.config("tiny")
    try:  # the transformer families: their step's sequence is 2 x the task's length
        with mo.status.spinner(title="libtpu compiles the step for a v6e-1"):
            tpu = wb.tpu_compile(model_name, "tiny", "v6e-1", "dp",
                                 seq_len=2 * getattr(_cfg, "length", 1),
                                 batch_size=_family.default_batch_size(_cfg))
        tpu_error = None
    except wb.WorkbenchError as _exc:
        tpu, tpu_error = None, _exc
    mo.stop(tpu_error is not None,
            mo.callout(mo.md(f"**Not compiled for the TPU.** {tpu_error}"), kind="warn"))
    _tpu_ops = hlo.instructions(tpu.hlo_text)
    _rows = [
        ("instructions", len(ops_after), len(_tpu_ops)),
        ("fusions", int((ops_after["opcode"] == "fusion").sum()),
         int((_tpu_ops["opcode"] == "fusion").sum())),
        ("top-level ops (the kernels it runs)", int(ops_after["is_entry"].sum()),
         len(tpu.ops)),
    ]
    mo.vstack([
        mo.md(f"**{tpu.label}.** FLOPs per step by libtpu's count: "
              f"{tpu.ops['flops'].sum() / 1e9:,.3f} GFLOP; bytes its ops read and write: "
              f"{tpu.ops['bytes'].sum() / 1e6:,.1f} MB; HBM per chip: "
              f"{tpu.memory['total_bytes'] / 1e6:,.1f} MB of "
              f"{tpu.memory['hbm_bytes'] / 1e9:.0f} GB."),
        nb.table(pd.DataFrame(_rows, columns=["", "XLA:CPU", "v6e (libtpu)"]),
                 label="one training step, two compilers"),
        mo.hstack([wb.charts.op_mix(ops_after, top=12, scope="entry", title="XLA:CPU"),
                   wb.charts.op_mix(_tpu_ops, top=12, scope="entry",
                                    title="TPU v6e (libtpu)")], justify="start", gap=1),
    ])
    return (tpu,)


@app.cell
def _(tpu):
    nb.table(tpu.ops.sort_values("bytes", ascending=False)[
        ["name", "opcode", "fusion_kind", "shape", "flops", "bytes", "vmem_bytes"]],
        page_size=8, label="the TPU program's ops, most bytes first (per chip)")
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    **Which opcode appears most often in the optimised step** captured above (leave out
    `parameter`, `constant`, `get-tuple-element` and `tuple`, which only move values around)?
    Guess from what a training step does, then check against the op mix.
    """)
    return


@app.cell
def _(ops_after):
    answer = mo.ui.dropdown(sorted(set(ops_after["opcode"]) - set(PLUMBING)),
                            label="most frequent opcode").form(submit_button_label="check")
    answer
    return (answer,)


@app.cell
def _(answer, ops_after):
    mo.stop(answer.value is None, mo.md("_Pick an opcode, then press **check**._"))
    mo.stop(not answer.value, mo.callout(mo.md("Pick an opcode first."), kind="warn"))
    _counts = ops_after[~ops_after["opcode"].isin(PLUMBING)]["opcode"].value_counts()
    _top = _counts.index[0]
    _ok = answer.value == _top
    mo.callout(mo.md(f"The most frequent is **{_top}** ({_counts.iloc[0]} times). " + (
        "Right." if _ok else f"You chose {answer.value}: "
        f"{_counts.get(answer.value, 0)} times.")), kind="success" if _ok else "warn")
    return


if __name__ == "__main__":
    app.run()
