import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Profiling: where does the time go?")

with app.setup:
    import re
    from pathlib import Path

    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench import profiling
    from tpu_workbench.environment.paths import results_dir
    from tpu_workbench.exercises import profiling as exercise

    SMOKE = wb.smoke_mode()
    # What the page profiles on open, without a click.
    DEFAULTS = {"model": "mingpt", "mode": "compile", "steps": 10}
    SECTIONS = nb.Sections()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # Profiling: where does the time go?

    torch_xla's profiler records every step: the Python thread tracing your model, the
    compiler, the runtime, and one event per executed HLO op. This notebook captures a few
    steps, turns the trace into tables (events, per-op totals, a per-step breakdown) and charts,
    and tells you how to open the same files in Perfetto or XProf.
    """)
    return


@app.cell
def _():
    model = mo.ui.dropdown(wb.model_names(), value=DEFAULTS["model"], label="model")
    mode = mo.ui.dropdown(wb.available_modes(), value=DEFAULTS["mode"], label="mode")
    steps = mo.ui.slider(3, 30, value=DEFAULTS["steps"], label="steps", show_value=True)
    run_button = mo.ui.run_button(label="run")
    mo.vstack([
        mo.hstack([model, mode, steps, run_button], justify="start", gap=2),
        mo.md("_Profiling starts a worker: mingpt and mlp take seconds, resnet and unet on "
              "XLA:CPU take minutes._"),
    ])
    return mode, model, run_button, steps


@app.cell
def _(mode, model, run_button, steps):
    _spec = wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny",
                              mode=mode.value, steps=3 if SMOKE else steps.value,
                              capture=("hlo", "profile"))
    result = SECTIONS.run("profile", run_button, _spec, title=f"profiling {wb.label(_spec)}",
                          waiting="Press **run** above to profile these settings.")
    profile = None if result is None else profiling.load_profile(result)
    if profile is not None:
        mo.output.replace(mo.md(
            f"{nb.provenance(result)}\n\nCaptured **{len(profile.events):,}** events over "
            f"{_spec.steps} steps of {wb.label(_spec)}."))
    return profile, result


@app.cell
def _(profile):
    wb.charts.step_breakdown(profile.steps) if profile else None
    return


@app.cell
def _(profile):
    mo.stop(profile is None)
    _ms = profile.steps.set_index("step") / 1e3
    _ms.columns = [c.removesuffix("_us") + "_ms" for c in _ms.columns]
    nb.table(_ms.reset_index(), page_size=10,
             label="per-step breakdown (ms): compile + execute + transfer + host + idle = step")
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    Step 0 is almost all **compile**, so it has a panel (and a scale) of its own. Later steps
    split into **execute** (HLO ops running), **transfer**, **host** (Python, tracing,
    dispatch) and **idle** (no profiled thread busy: on a shared CPU, often waiting to be
    scheduled). On a TPU, a large host share in steady state means the chip waits for Python:
    compile the whole step, or overlap input work.

    ## Which HLO ops take the time

    Each op's **self time**: its events' durations less the ops nested inside them. XLA:CPU
    runs some fusions inside a `call.N` op, and the trace records both; counting both would
    count that time twice, so a call is charged only for what it does around its fusion.
    **Click a bar** to open that op: its HLO, what XLA fused into it and the lines of the
    model it came from.
    """)
    return


@app.cell
def _(profile):
    top_chart = (mo.ui.altair_chart(wb.charts.top_ops(profile.ops))
                 if profile is not None and len(profile.ops) else None)
    (top_chart if top_chart is not None or profile is None else
     mo.md("_No HLO ops in this trace (plain-PyTorch modes record host-side ops only)._"))
    return (top_chart,)


@app.cell
def _(profile, result, top_chart):
    mo.stop(top_chart is None)
    _picked = nb.picked(top_chart, "hlo_op")
    _name = _picked[0] if _picked else str(profile.ops["hlo_op"].iloc[0])
    _step = nb.captured_step(result)
    try:
        _d = _step.detail(_name)
    except ValueError:
        _d = None
    mo.vstack([
        mo.md(f"### `{_name}`" + ("" if _picked else " (the top op; click another bar)")
              + (f": kernel `{_d.name}` of the step" if _d and _d.name != _name else "")),
        mo.md("_Not in the step's optimised module (it belongs to another program the run "
              "compiled)._") if _d is None else nb.code_block(_d.text, max_height_px=140),
        nb.table(_d.sources, label="the model lines behind it (HLO metadata)")
        if _d is not None and len(_d.sources) else mo.md(""),
        nb.table(_d.inside, page_size=6, label=f"{len(_d.inside)} instruction(s) fused in it")
        if _d is not None else mo.md(""),
    ])
    return


@app.cell
def _(profile):
    mo.stop(profile is None)
    _cols = ["hlo_op", "inside", "per_step_us", "share", "count"]
    nb.table(profile.ops[_cols].fillna({"inside": ""}), page_size=10,
             label="HLO ops of the steady steps, by self time (share: of a steady step; "
                   "inside: the call an op runs in)")
    return


@app.cell
def _(profile):
    _steps = (sorted(s for s in profile.events["step"].unique() if s >= 0)
              if profile is not None else [0])
    step = mo.ui.slider(_steps[0], _steps[-1], value=_steps[min(1, len(_steps) - 1)],
                        label="step to show", show_value=True)
    step if profile is not None else None
    return (step,)


@app.cell
def _(profile, step):
    mo.stop(profile is None)
    wb.charts.timeline(profile.events, step.value)
    return


@app.cell
def _(profile, result):
    mo.stop(profile is None)
    _memory = result.summary["memory"]
    _device = _memory.get("device_memory")
    if _device:
        _allocator = ", ".join(f"{k}: {v / 2**20:,.0f} MiB" if isinstance(v, int | float)
                               else f"{k}: {v}" for k, v in _device.items())
        _allocator = f"**{_allocator}** (`xm.get_memory_info`)"
    else:
        _allocator = ("not reported: XLA:CPU does not keep allocator statistics "
                      "(`xm.get_memory_info` is not implemented there); on a TPU this line "
                      "shows the HBM in use and its peak")
    _reports = sorted(p for k, p in result.artifacts.items() if k.endswith("usage-report.txt"))
    _first = Path(_reports[0]).read_text().splitlines()[0] if _reports else ""
    _total = re.search(r"Total bytes used: (\d+)", _first)
    _xla = (f"**{int(_total.group(1)) / 2**20:,.1f} MiB** of buffers (XLA's memory-usage "
            "report of the compiled step)" if _total else "no report (no HLO captured)")
    _hint = profile.open_hint(relative_to=results_dir(), markdown=True)
    mo.vstack([mo.md(f"""
    ## Memory, labelled by where each figure comes from

    - worker process peak RSS: **{_memory["worker_peak_rss_bytes"] / 2**20:,.0f} MiB**
      (on XLA:CPU, "device" memory is this process's memory);
    - device allocator: {_allocator};
    - XLA's buffer assignment: {_xla}.

    ## Open the trace in the usual tools

    The files are in the results folder (`TPU_WORKBENCH_RESULTS`, default `./results`); the
    paths below are relative to it.
    """), mo.md(_hint)])
    return


@app.cell(hide_code=True)
def _():
    mo.md(rf"""
    ## Workshop exercise

    Your own training loop feeds batches whose sequence length changes every now and then,
    so the step **compiles again once every {exercise.EVERY} steps**, each compile as costly
    as step 0's above. **What share of a long run's time goes to compiling, in percent?**
    Reason from the per-step breakdown above: what one compile costs, what a steady step
    costs, and what a run repeats.
    """)
    return


@app.cell
def _():
    guess = mo.ui.number(start=0, stop=100, step=0.1, label="% of the run compiling").form(
        submit_button_label="check", bordered=False)
    guess
    return (guess,)


@app.cell(hide_code=True)
def _(guess, profile):
    # Judged by tpu_workbench/exercises/profiling.py from the profile above, once submitted.
    mo.stop(profile is None)
    _kind, _text = (("neutral", "_Enter a number and press **check**._") if guess.value is None
                    else exercise.judge(guess.value, exercise.compile_share(profile.steps)))
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
