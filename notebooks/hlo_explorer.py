import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="HLO explorer: what XLA compiled")

with app.setup:
    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import hlo, profiling
    from tpu_workbench import notebook as nb
    from tpu_workbench.exercises import hlo_explorer as exercise
    from tpu_workbench.models import get_model

    SMOKE = wb.smoke_mode()
    HLO_MODES = wb.hlo_modes()  # the modes that compile HLO here
    DEFAULT_MODEL = "mingpt"
    DEFAULT_MODE = "compile" if "compile" in HLO_MODES else HLO_MODES[0]
    SECTIONS = nb.Sections()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # HLO explorer: what XLA compiled

    Every XLA mode turns your PyTorch step into **HLO**, XLA's program format, then optimises
    it: it fuses elementwise ops into kernels, picks layouts and, when sharded, partitions the
    program over devices. This page captures one training step before and after optimisation
    on this machine's XLA:CPU, lets you **click into the kernels** it runs down to the lines
    of the model that made them, and at the end shows the same step as libtpu, the TPU's
    compiler, makes it for a v6e chip.
    """)
    return


@app.cell
def _():
    model = mo.ui.dropdown(wb.model_names(), value=DEFAULT_MODEL, label="model")
    mode = mo.ui.dropdown(HLO_MODES, value=DEFAULT_MODE, label="mode")
    run_capture = mo.ui.run_button(label="run")
    mo.vstack([
        mo.hstack([model, mode, run_capture], justify="start", gap=2),
        mo.md("_minGPT and the MLP take seconds on XLA:CPU, ResNet and UNet minutes._"),
    ])
    return mode, model, run_capture


@app.cell
def _(mode, model, run_capture):
    # Smoke runs (CI) take fewer steps of the same model: its v6e compile below needs a
    # transformer, which the MLP is not.
    _spec = wb.ExperimentSpec(model=model.value, preset="tiny", mode=mode.value,
                              steps=3 if SMOKE else 6, capture=("hlo", "profile"))
    # An HLO capture always gets a fresh worker (a warm one would dump nothing).
    step = nb.captured_step(SECTIONS.run(
        "capture", run_capture, _spec, title=f"compiling and profiling {wb.label(_spec)}",
        waiting="Press **run** above to capture the step with these settings."))
    if step is not None:
        mo.output.replace(mo.md(f"## {wb.label(_spec)}\n\n{nb.provenance(step.result)}"))
    return (step,)


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## How big is the program?

    The optimised text is longer than the traced one, but the program is not: every fused
    kernel is a computation of its own, with its own parameters, and XLA:CPU splits large
    kernels over its threads as *parallel tasks* (a `call` of a `.clone`). What the step runs
    is its **kernels**, the top-level instructions that do work.
    """)
    return


@app.cell
def _(step):
    (nb.table(hlo.program_counts(step.before, step.after), label="one training step, counted "
              "three ways") if step else None)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## What runs: the kernels

    Left, the ops the model traced; right, the kernels of the optimised step by kind. **Click a
    bar** on the right to list those kernels, then pick one in the table to open it: its HLO,
    the ops fused into it, and the lines of the model they come from (HLO metadata).
    """)
    return


@app.cell
def _(step):
    kernel_chart = (mo.ui.altair_chart(wb.charts.kernel_mix(step.kernels, title="kernels "
                                       "after optimisation (click a bar)")) if step else None)
    (mo.hstack([wb.charts.op_mix(step.before, top=15, title="ops traced (before)"),
                kernel_chart], justify="start", gap=1) if step else None)
    return (kernel_chart,)


@app.cell
def _(kernel_chart, step):
    _kinds = nb.picked(kernel_chart, "opcode") or ["fusion"]
    kernel_rows = (step.kernels[step.kernels["opcode"].isin(_kinds)].sort_values(
        ["ops_inside", "bytes"], ascending=False, ignore_index=True) if step else None)
    kernel_table = (nb.table(
        kernel_rows[["name", "kernel", "opcode", "shape", "ops_inside", "inside", "source"]],
        selection="single", page_size=6,
        label=f"{len(kernel_rows)} kernel(s) of kind {', '.join(_kinds)}: pick one to open it")
        if step else None)
    kernel_table
    return kernel_rows, kernel_table


@app.cell
def _(kernel_rows, kernel_table, step):
    mo.stop(step is None)
    _chosen = kernel_table.value
    _d = step.detail((_chosen if len(_chosen) else kernel_rows)["name"].iloc[0])
    mo.vstack([
        mo.md(f"### `{_d.name}`" + (f" runs `{_d.kernel}`" if _d.kernel != _d.name else "")
              + ("" if len(_chosen) else " (the table's first; pick another there)")),
        nb.code_block(_d.text, max_height_px=140),
        nb.table(_d.sources, label="the model lines behind it (HLO metadata: op, file, line)")
        if len(_d.sources) else mo.md("_No source lines: XLA made this op itself (a copy, a "
                                      "layout change) or the capture had no metadata._"),
        nb.table(_d.inside, page_size=8, label=f"{len(_d.inside)} instruction(s) inside"),
    ])
    return


@app.cell(hide_code=True)
def _(step):
    mo.stop(step is None)
    mo.md(f"""
    FLOPs per step: XLA's cost analysis {nb.xla_flops_text(step.summary)}; the analytic count
    of its dots and convolutions, {step.summary["dot_flops"] / 1e9:,.3f} GFLOP, is most of it.
    """)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## A roofline of the measured kernels

    Each kernel at its FLOPs per byte (x) and the FLOP/s it reached in the profiled steps (y).
    Left of the ridge a kernel is limited by memory bandwidth, right of it by compute. This
    host's roof is measured so that no kernel can pass it: the flat part is the best fp32
    matmul rate of its cores, timed by each core's own CPU time (other work on the machine
    cannot stretch it), and the slanted part the rate a core reads its L1 cache, where a small
    kernel's bytes can come from. The dashed line under it is main memory (a buffer larger than
    every cache): a kernel above it had its data in the caches. Against a chip's roof, each
    kernel sits where its FLOPs and bytes would put it at best (no chip ran it).
    """)
    return


@app.cell
def _():
    _targets = wb.roofline_targets()
    target = mo.ui.dropdown(_targets, value=_targets[0], label="roofline against")
    target
    return (target,)


@app.cell
def _(step, target):
    mo.stop(step is None)
    _cost = hlo.with_kinds(hlo.per_op_cost(step.after_text), step.kernels)
    _peak, _bw, _source = wb.roofline_roof(target.value)
    _host = target.value == wb.roofline_targets()[0]
    _timed = profiling.op_costs_with_times(_cost, nb.profile_ops(step.result))
    wb.charts.roofline(_timed if _host else _cost, _peak, _bw,
                       slopes=wb.roofline_slopes(target.value),
                       title=f"roofline: {'measured' if _host else 'best possible'} FLOP/s "
                             f"per kernel, {_source}")
    return


@app.cell
def _():
    pattern = mo.ui.text(value="dot", label="search the optimised HLO (regex)")
    pattern
    return (pattern,)


@app.cell
def _(pattern, step):
    mo.stop(step is None)
    nb.table(hlo.search(step.after_text, pattern.value)[["computation", "name", "opcode",
                                                         "text"]],
             page_size=8, label="matching instructions")
    return


@app.cell
def _(step):
    mo.stop(step is None)
    mo.accordion({"the whole optimised HLO text": nb.code_block(step.after_text[:200_000],
                                                                max_height_px=600)})
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
    run_diff = mo.ui.run_button(label="run lazy and dynamo")
    run_diff
    return (run_diff,)


@app.cell
def _(model, run_diff):
    _specs = [wb.ExperimentSpec(model=model.value, preset="tiny", mode=_m, steps=2,
                                capture=("hlo",)) for _m in ("lazy", "dynamo")]
    _reuse = SECTIONS.reuse("diff", run_diff.value,
                            lambda: all(wb.reusable(_s) for _s in _specs),
                            waiting="Press **run lazy and dynamo** to compare their programs.")
    module_diff = None
    if _reuse is not None:
        with mo.status.spinner(title="compiling the step in lazy and dynamo"):
            _runs = [wb.run(_s, reuse=_reuse) for _s in _specs]
        _texts = [hlo.read_hlo(hlo.load_run_hlo(_r), "after_optimizations") for _r in _runs]
        module_diff = hlo.diff_modules(*_texts, "lazy", "dynamo")
        mo.output.replace(mo.vstack([
            mo.md(nb.provenance(_runs, button="run lazy and dynamo")),
            wb.charts.diff_chart(module_diff, label_a="lazy", label_b="dynamo")]))
    return (module_diff,)


@app.cell
def _(module_diff):
    mo.stop(module_diff is None)
    nb.table(module_diff[module_diff["delta"] != 0][["kind", "item", "a", "b", "delta"]]
             .rename(columns={"a": "lazy", "b": "dynamo", "delta": "dynamo - lazy"}),
             page_size=8, label="what differs (counts of instructions in the texts)")
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## The same step, as a TPU v6e compiles it

    Everything above is XLA:CPU's program. The TPU's compiler, libtpu, makes a different one of
    the same step, and it runs here too with no chip: the workbench traces the step (weights,
    Adam state and batch as inputs of the program, nothing run) and libtpu compiles it for one
    v6e chip. Its numbers are **compiled for a v6e by libtpu, not run**.
    """)
    return


@app.cell
def _():
    tpu_button = mo.ui.run_button(label="compile for a v6e-1 with libtpu again")
    mo.hstack([tpu_button, mo.md("_compiled when the page opens (seconds to a minute for the "
                                 "small models, then cached); the button asks again_")],
              justify="start", gap=1)
    return (tpu_button,)


@app.cell
def _(model, step, tpu_button):
    tpu = None
    if step is not None and SECTIONS.reuse(
            "tpu", tpu_button.value,
            waiting="Press **compile for a v6e-1 with libtpu again** to compile this model's "
                    "step for the TPU.") is not None:
        try:
            with mo.status.spinner(title="libtpu compiles the step for a v6e-1"):
                tpu = nb.v6e_compile_of_tiny(model.value)
            mo.output.replace(nb.two_compilers(step, tpu))
        except wb.SpecError as _exc:  # a model libtpu's path does not take here
            mo.output.replace(mo.callout(mo.md(
                f"**{model.value} is not compiled for the TPU here.** {_exc}"), kind="info"))
        except wb.WorkbenchError as _exc:
            mo.output.replace(nb.failed_run_callout(f"libtpu's compile of {model.value}",
                                                    _exc))
    return (tpu,)


@app.cell
def _(tpu):
    mo.stop(tpu is None)
    nb.table(tpu.ops.sort_values("bytes", ascending=False)[
        ["name", "opcode", "fusion_kind", "shape", "flops", "bytes", "vmem_bytes"]],
        page_size=8, label="the TPU program's ops, most bytes first (per chip)")
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    In minGPT `tiny` (batch 32, sequences of 11 positions, width 128), each block's MLP
    begins with `c_fc`, a Linear from width 128 to 512 applied at every position of every
    sequence. XLA runs it as one `dot` kernel. **How many MFLOP does that dot compute in the
    forward pass of one step?** Work it out from the shapes first; then find the dot among
    the kernels above (its output shape gives it away) and see whether its shapes agree.
    """)
    return


@app.cell
def _():
    answer = mo.ui.number(start=0, stop=1e6, step=0.1, label="MFLOP").form(
        submit_button_label="check", bordered=False)
    answer
    return (answer,)


@app.cell(hide_code=True)
def _(answer):
    # Judged by the library (tpu_workbench/exercises/hlo_explorer.py), only once submitted.
    _cfg = get_model("mingpt").config("tiny")
    _flops = exercise.mlp_matmul_flops(_cfg.batch_size, 2 * _cfg.length - 1, _cfg.n_embd,
                                       4 * _cfg.n_embd)
    _kind, _text = (("neutral", "_Enter a number and press **check**._")
                    if answer.value is None else exercise.judge(answer.value, _flops))
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
