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

    SMOKE = wb.smoke_mode()
    # What the page profiles on open, without a click.
    DEFAULTS = {"model": "mingpt", "mode": "compile", "steps": 10}


@app.function
def top3_verdict(answer: float | None, measured_pct: float) -> tuple[str, str]:
    """(callout kind, markdown) for the exercise: a prompt until an answer is submitted, a
    range message outside 0-100, else the measured share and whether the answer is within a
    point of it (the chart's labels are rounded to 0.1%)."""
    if answer is None:
        return "neutral", "Enter a percentage and press **check**."
    if not 0 <= answer <= 100:
        return "danger", f"{answer:g}% is not a share of a step: enter a number from 0 to 100."
    if abs(answer - measured_pct) <= 1.0:
        return "success", (f"Right: the top 3 ops take **{measured_pct:.1f}%** of a steady "
                           f"step (you said {answer:g}%).")
    return "warn", (f"The top 3 ops take **{measured_pct:.1f}%** of a steady step; you said "
                    f"{answer:g}%. Add the labels of the three longest bars in the top-ops "
                    "chart.")


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
    _pick = {"model": model.value, "mode": mode.value, "steps": steps.value}
    # On open (default settings) this runs by itself; other settings wait for **run**.
    mo.stop(_pick != DEFAULTS and not run_button.value,
            mo.md("_Settings changed: press **run** to profile them._"))
    _spec = wb.ExperimentSpec(model="mlp" if SMOKE else _pick["model"], preset="tiny",
                              mode=_pick["mode"], steps=3 if SMOKE else _pick["steps"],
                              capture=("hlo", "profile"))
    with mo.status.spinner(title=f"profiling {wb.label(_spec)}"):
        # Without a click this shows a stored profile of the same spec; **run** measures again.
        result = wb.run(_spec, reuse=nb.reuse_ok() and not run_button.value)
        profile = profiling.load_profile(result)
    where = nb.provenance(result)
    mo.md(f"{where}\n\nCaptured **{len(profile.events):,}** events over {_spec.steps} steps "
          f"of {wb.label(_spec)}.")
    return profile, result, where


@app.cell
def _(profile, where):
    mo.vstack([mo.md(where), wb.charts.step_breakdown(profile.steps)])
    return


@app.cell
def _(profile):
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
    """)
    return


@app.cell
def _(profile, where):
    _ops = profile.ops
    mo.vstack([mo.md(where), wb.charts.top_ops(_ops)]) if len(_ops) else \
        mo.md("_No HLO ops in this trace (plain-PyTorch modes record host-side ops only)._")
    return


@app.cell
def _(profile):
    _cols = ["hlo_op", "inside", "per_step_us", "share", "count"]
    nb.table(profile.ops[_cols].fillna({"inside": ""}), page_size=10,
             label="HLO ops of the steady steps, by self time (share: of a steady step; "
                   "inside: the call an op runs in)")
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
    mo.md(r"""
    ## Workshop exercise

    **What share of a steady step do the three most expensive HLO ops take?** Read the labels
    of the top-ops chart above, then enter a percentage.
    """)
    return


@app.cell
def _():
    guess = mo.ui.number(start=-1000, stop=1000, step=0.1, value=0,
                         label="top-3 share of a steady step (%)").form(
        submit_button_label="check", bordered=False)
    guess
    return (guess,)


@app.cell
def _(profile):
    # Measured once with the profile above; checking an answer reads it and starts no worker.
    top3_pct = 100 * float(profile.ops["share"].head(3).sum()) if len(profile.ops) else 0.0
    return (top3_pct,)


@app.cell
def _(guess, top3_pct):
    _kind, _text = top3_verdict(guess.value, top3_pct)
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
