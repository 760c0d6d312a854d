import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="HLO explorer: what XLA compiled")

with app.setup:
    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import hlo, profiling
    from tpu_workbench import notebook as nb

    SMOKE = wb.smoke_mode()


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
    model = mo.ui.dropdown(wb.model_names(), value="mingpt", label="model")
    _modes = wb.hlo_modes()  # the modes that compile HLO here
    mode = mo.ui.dropdown(_modes, value="compile" if "compile" in _modes else _modes[0],
                          label="mode")
    mo.hstack([model, mode], justify="start", gap=2)
    return mode, model


@app.cell
def _(mode, model):
    _spec = wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny",
                              mode=mode.value, steps=3 if SMOKE else 6,
                              capture=("hlo", "profile"))
    with mo.status.spinner(title=f"compiling and profiling {wb.label(_spec)}"):
        result = wb.run(_spec)
    files = hlo.load_run_hlo(result)
    before = hlo.main_module(files, "before_optimizations")
    after = hlo.main_module(files, "after_optimizations")
    nb.table(files[["module", "stage", "bytes", "file"]],
             label=f"{files['module'].nunique()} module(s) compiled by the step")
    return after, before, files, result


@app.cell
def _(after, before):
    ops_before = hlo.instructions(before)
    ops_after = hlo.instructions(after)
    _s = hlo.summary(after)
    mo.vstack([
        mo.md(f"""
    **Before optimisation**: {len(ops_before):,} instructions. **After**: {len(ops_after):,},
    of which {sum(_s["fusions_by_kind"].values())} fusions.
    FLOPs per step: XLA's cost analysis {nb.xla_flops_text(_s)}; the analytic dot and
    convolution count {_s["dot_flops"] / 1e9:,.3f} GFLOP.
    """),
        mo.hstack([wb.charts.op_mix(ops_before, top=15, title="before optimisation"),
                   wb.charts.op_mix(ops_after, top=15, title="after optimisation")]),
    ])
    return ops_after, ops_before


@app.cell
def _(ops_after):
    nb.table(wb.hlo.fusion_table(ops_after), page_size=10, selection="multi",
             label="fusions XLA created (kernels it will run)")
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
    mo.vstack([
        wb.charts.roofline(_timed if _host else _cost, _peak, _bw,
                           title=f"roofline: {_what}, {_source}"),
        mo.md("Left of the ridge an op is limited by memory bandwidth, right of it by compute. "
              "Elementwise fusions sit far left: on a TPU they are cheap only when fused into "
              "the matmuls around them."),
    ])
    return


@app.cell
def _():
    pattern = mo.ui.text(value="dot", label="search the optimised HLO (regex)")
    pattern
    return (pattern,)


@app.cell
def _(after, pattern):
    nb.table(hlo.search(after, pattern.value), page_size=8, label="matching instructions")
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
def _(model):
    _runs = {}
    for _m in ("lazy", "dynamo"):
        _spec = wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny",
                                  mode=_m, steps=2, capture=("hlo",))
        _runs[_m] = hlo.read_hlo(hlo.load_run_hlo(wb.run(_spec)), "after_optimizations")
    module_diff = hlo.diff_modules(_runs["lazy"], _runs["dynamo"], "lazy", "dynamo")
    mo.vstack([wb.charts.diff_chart(module_diff, label_a="lazy", label_b="dynamo"),
               nb.table(module_diff, page_size=8)])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    **Which opcode appears most often in the optimised step** (leave out `parameter`,
    `constant`, `get-tuple-element` and `tuple`, which only move values around)? Guess from what
    a training step does, then check.
    """)
    return


@app.cell
def _(ops_after):
    answer = mo.ui.dropdown(sorted(set(ops_after["opcode"])), label="most frequent opcode")
    answer
    return (answer,)


@app.cell
def _(answer, ops_after):
    _skip = {"parameter", "constant", "get-tuple-element", "tuple"}
    _counts = ops_after[~ops_after["opcode"].isin(_skip)]["opcode"].value_counts()
    _top = _counts.index[0]
    _ok = answer.value == _top
    mo.callout(mo.md(f"The most frequent is **{_top}** ({_counts.iloc[0]} times). " + (
        "Right." if _ok else f"You chose {answer.value or 'nothing'}: "
        f"{_counts.get(answer.value, 0)} times.")), kind="success" if _ok else "warn")
    return


if __name__ == "__main__":
    app.run()
