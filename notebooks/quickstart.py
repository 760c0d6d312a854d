import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="tpu-workbench quickstart")

with app.setup:
    import marimo as mo

    import tpu_workbench as wb

    SMOKE = wb.smoke_mode()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # tpu-workbench: quickstart

    PyTorch reaches a TPU through **XLA**: your model is traced into an XLA program (HLO), compiled
    once, then run step after step. This notebook shows what that costs and buys you, for real,
    on whatever machine you are on. With no TPU attached it runs on **XLA:CPU**, which compiles the
    very same HLO with the same SPMD partitioner, so what you learn here carries over to a v6e.

    Every experiment runs in a separate **worker process** (torch_xla reads its settings once, at
    import, and a crash there must never take this notebook down); records stream back while it
    trains, which is what draws the live charts below.
    """)
    return


@app.cell
def _():
    backend = wb.describe()
    runtime = wb.probe()
    return backend, runtime


@app.cell(hide_code=True)
def _(backend, runtime):
    _peak = backend["host_peak"]["peak_flops"] / 1e9
    _tpu = backend["tpu"]
    _where = (
        f"**TPU** ({runtime['device_count']} x {runtime['device_kind']})" if _tpu["available"]
        else f"**XLA:{runtime['device_kind']}** with {runtime['device_count']} virtual devices"
    )
    _v6e = wb.get_chip("v6e")
    mo.vstack([
        mo.md(f"""
    ## Where am I running?

    You are on {_where}. {"" if _tpu["available"] else "No TPU here: " + _tpu["reason"] + "."}
    This host's CPU peaks at **{_peak:,.0f} GFLOP/s** (fp32 matmul, measured just now and cached).
    One v6e chip peaks at **{_v6e.bf16_tflops:,.0f} TFLOP/s** in bf16 with {_v6e.hbm_gb:.0f} GB
    of HBM at {_v6e.hbm_gbps:,.0f} GB/s: about {_v6e.peak_flops / (_peak * 1e9):,.0f}x this CPU.
    On a TPU the programs below are the same; only the times change.
    """),
        mo.ui.table(wb.chip_table(), selection=None, label="TPU chips (published peak figures)"),
    ])
    return


@app.cell
def _():
    _models = wb.model_names()
    model = mo.ui.dropdown(_models, value="mingpt" if "mingpt" in _models else _models[0],
                           label="model")
    modes = mo.ui.multiselect(list(wb.MODES), value=["torch_eager", "lazy", "compile"],
                              label="modes")
    steps = mo.ui.slider(5, 100, value=30, step=5, label="steps", show_value=True)
    mo.hstack([model, modes, steps], justify="start", gap=2)
    return model, modes, steps


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Eager vs compiled, live

    Each mode trains the same model from the same random weights on the same generated batches.
    Step 0 includes compiling the step (XLA) or building it (inductor), so it stands apart from the
    steady state that follows. Times are taken after waiting for the device.
    """)
    return


@app.cell
def _(model, modes, steps):
    _n_steps = 5 if SMOKE else steps.value
    specs = [wb.ExperimentSpec(model=model.value, preset="tiny", mode=_m, steps=_n_steps)
             for _m in modes.value]
    _shown = [0]

    with mo.status.progress_bar(total=max(len(specs) * _n_steps, 1), title="training",
                                remove_on_exit=True) as _bar:

        def _update(frame, spec, done):
            _bar.update(increment=done - _shown[0], subtitle=wb.label(spec))
            _shown[0] = done
            mo.output.replace(wb.charts.step_times(frame))

        comparison = wb.run_many(specs, on_update=_update, every_s=0.4)
    mo.output.replace(wb.charts.step_times(comparison.steps))
    return (comparison,)


@app.cell
def _(comparison):
    summary = wb.summarize(comparison.steps)
    _errors = [mo.callout(mo.md(f"**{name}** failed: {err}"), kind="danger")
               for name, err in comparison.errors.items()]
    mo.vstack([
        *_errors,
        mo.ui.table(summary.round(2), selection=None, label="per-mode summary"),
        wb.charts.loss_curves(comparison.steps) if len(comparison.steps) else mo.md(""),
    ])
    return (summary,)


@app.cell(hide_code=True)
def _(summary):
    _fast = summary.sort_values("steady_median_ms").iloc[0] if len(summary) else None
    mo.md(f"""
    **Reading the numbers.** The fastest steady state here is
    **{_fast["mode"] if _fast is not None else "?"}** at
    {_fast["steady_median_ms"] if _fast is not None else float("nan"):.1f} ms per step.
    XLA is not a speed-up on a CPU; its value here is that `lazy` and `compile` produce the very
    programs a TPU runs, compiled once (see `compiles_total`) and never again in steady state
    (`compiles_steady`).
    """)
    return


if __name__ == "__main__":
    app.run()
