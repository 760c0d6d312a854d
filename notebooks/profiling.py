import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Profiling: where does the time go?")

with app.setup:
    from pathlib import Path

    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench import profiling

    SMOKE = wb.smoke_mode()


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
    model = mo.ui.dropdown(wb.model_names(), value="mingpt", label="model")
    mode = mo.ui.dropdown(wb.available_modes(), value="compile", label="mode")
    steps = mo.ui.slider(3, 30, value=10, label="steps", show_value=True)
    mo.hstack([model, mode, steps], justify="start", gap=2)
    return mode, model, steps


@app.cell
def _(mode, model, steps):
    _spec = wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny",
                              mode=mode.value, steps=3 if SMOKE else steps.value,
                              capture=("hlo", "profile"))
    with mo.status.spinner(title=f"profiling {wb.label(_spec)}"):
        result = wb.run(_spec)
        profile = profiling.load_profile(result)
    mo.md(f"Captured **{len(profile.events):,}** events over {_spec.steps} steps. "
          f"Files: `{profile.logdir}`")
    return profile, result


@app.cell
def _(profile):
    _steps = profile.steps
    mo.vstack([
        wb.charts.step_breakdown(_steps),
        nb.table((_steps.set_index("step") / 1e3).reset_index(),
                 label="per-step breakdown (ms): the parts add up to the step"),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    Step 0 is almost all **compile**. Later steps split into **execute** (HLO ops running),
    **transfer**, **host** (Python, tracing, dispatch) and **idle** (no profiled thread busy:
    on a shared CPU, often waiting to be scheduled). On a TPU, a large host share in steady
    state means the chip waits for Python: compile the whole step, or overlap input work.
    """)
    return


@app.cell
def _(profile):
    _ops = profile.ops
    mo.vstack([
        wb.charts.top_ops(_ops) if len(_ops) else mo.md("_No HLO ops (plain PyTorch mode)._"),
        nb.table(_ops.head(30), label="HLO ops, steady steps"),
        mo.md("`call.N` ops wrap other ops (XLA:CPU runs some convolutions and dots inside "
              "calls), so shares can add up to more than 100%."),
    ])
    return


@app.cell
def _(profile):
    _steps = sorted(s for s in profile.events["step"].unique() if s >= 0)
    step = mo.ui.slider(_steps[0], _steps[-1], value=_steps[min(1, len(_steps) - 1)],
                        label="step to show", show_value=True)
    step
    return (step,)


@app.cell
def _(profile, step):
    wb.charts.timeline(profile.events, step.value)
    return


@app.cell
def _(profile, result):
    _memory = result.summary["memory"]
    _reports = sorted(p for k, p in result.artifacts.items() if k.endswith("usage-report.txt"))
    _xla = (Path(_reports[0]).read_text().splitlines()[0] if _reports
            else "no HLO captured")
    mo.md(f"""
    ## Memory, labelled by where each figure comes from

    - worker process peak RSS: **{_memory["worker_peak_rss_bytes"] / 2**20:,.0f} MiB**
      (on XLA:CPU, "device" memory is this process's memory);
    - device allocator: {_memory["device_memory_source"]};
    - XLA's memory-usage report of the compiled step: `{_xla}`.

    ## Open the trace in the usual tools

    ```
    {profile.open_hint()}
    ```
    """)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    **What share of a steady step do the three most expensive HLO ops take?** Look at the
    top-ops chart, then enter a percentage.
    """)
    return


@app.cell
def _():
    guess = mo.ui.number(start=0, stop=100, value=50, label="top-3 share of a step (%)")
    guess
    return (guess,)


@app.cell
def _(guess, profile):
    _top3 = 100 * profile.ops["share"].head(3).sum() if len(profile.ops) else 0.0
    _close = abs(guess.value - _top3) <= 5
    mo.callout(mo.md(
        f"Measured: the top 3 ops take **{_top3:.1f}%** of a steady step. "
        + ("Within 5 points: well read." if _close else
           f"You said {guess.value}%; read `share` in the table above (it is a fraction).")),
        kind="success" if _close else "warn")
    return


if __name__ == "__main__":
    app.run()
