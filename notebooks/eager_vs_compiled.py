import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Eager vs compiled: what each way of running costs")

with app.setup:
    import marimo as mo

    import tpu_workbench as wb

    SMOKE = wb.smoke_mode()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # Eager vs compiled: what each way of running costs

    The same training step, run six ways: plain PyTorch (`torch_eager`, `inductor`) and through
    XLA (`eager`: every op compiled and run on its own; `lazy`: ops recorded and cut into one
    graph per step by `torch_xla.sync()`; `compile`: `torch_xla.compile` of the whole step;
    `dynamo`: `torch.compile(backend="openxla")`). You will see what the first step costs
    (compilation), what steady state costs, how many programs XLA compiled, and what makes it
    compile again.

    Each mode runs in a **fresh worker** by default, so its first step pays the full compile: a
    warm worker serves any graph it compiled before, whatever mode asked for it.
    """)
    return


@app.cell
def _():
    model = mo.ui.dropdown(["mingpt", "resnet", "unet", "mlp"], value="mingpt", label="model")
    modes = mo.ui.multiselect(list(wb.MODES), label="modes",
                              value=["torch_eager", "eager", "lazy", "compile", "dynamo"])
    steps = mo.ui.slider(5, 60, value=20, step=5, label="steps", show_value=True)
    cold = mo.ui.checkbox(value=True, label="fresh worker per mode (cold compile)")
    mo.hstack([model, modes, steps, cold], justify="start", gap=1.5, wrap=True)
    return cold, model, modes, steps


@app.cell
def _(cold, model, modes, steps):
    # Smoke mode (CI): the smallest model, few steps, shared warm workers.
    _n = 3 if SMOKE else steps.value
    _modes = ["eager", "lazy", "compile"] if SMOKE else modes.value
    _model = "mlp" if SMOKE else model.value
    _specs = [wb.ExperimentSpec(model=_model, preset="tiny", mode=_m, steps=_n)
              for _m in _modes]
    comparison = wb.run_live(_specs, cold=cold.value and not SMOKE)
    return (comparison,)


@app.cell
def _(comparison):
    summary = comparison.summary
    _cols = ["mode", "first_step_ms", "steady_median_ms", "steady_p10_ms", "steady_p90_ms",
             "compiles_total", "compiles_steady", "executions_per_step", "items_per_s", "mfu",
             "final_loss"]
    _errors = [mo.callout(mo.md(f"**{k}** failed: {v}"), kind="danger")
               for k, v in comparison.errors.items()]
    mo.vstack([
        *_errors,
        mo.ui.table(summary[_cols].round(4), selection=None, label="per-mode summary"),
        mo.hstack([wb.charts.steady_times(summary), wb.charts.first_vs_steady(summary)]),
        wb.charts.compiles_per_mode(summary),
    ]) if len(summary) else mo.vstack(_errors)
    return (summary,)


@app.cell(hide_code=True)
def _(summary):
    _peak = summary["peak_source"].iloc[0] if len(summary) else ""
    mo.md(f"""
    **How to read it.** `first_step_ms` includes compiling (XLA) or code generation (inductor);
    `steady_*` are the median and spread of every later step, timed after waiting for the
    device. `compiles_steady` should be 0: a compile in steady state is a recompilation, the
    most common performance bug on TPUs. `mfu` is achieved FLOP/s (analytic FLOPs of the step)
    over the peak ({_peak}). On a CPU, XLA is rarely faster than PyTorch; on a TPU, `lazy` and
    `compile` are how you get near the chip's peak, because the whole step is one program.
    """)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## What makes XLA compile again?

    XLA compiles a program per distinct graph: same ops, same shapes, same outputs. Change one
    and the step is a new program. Pick a change; it is applied from step 3 on, in `lazy` mode,
    with torch_xla's own compilation analysis switched on (it slows steps, so it is opt-in).
    """)
    return


@app.cell
def _():
    change = mo.ui.dropdown({v: k for k, v in wb.spec.CHANGES.items()},
                            value=wb.spec.CHANGES["batch_size"], label="change at step 3")
    change
    return (change,)


@app.cell
def _(change, model):
    _spec = wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny",
                              mode="lazy", steps=5 if SMOKE else 8, change=change.value,
                              change_at=3)
    recompile_run = wb.run(_spec)
    compiles = wb.compile_events([recompile_run])
    mo.vstack([
        wb.charts.recompile_timeline(compiles, _spec.steps),
        mo.ui.table(compiles[["step", "cause", "explanation", "inputs", "outputs", "frame"]],
                    selection=None, label="every compilation, with torch_xla's cause"),
    ])
    return (recompile_run,)


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    Reading a value in the middle of a step (`loss.item()`, `print(loss)`, an `if` on a tensor)
    forces XLA to run what it has traced so far. **In `lazy` mode, how many new programs does
    XLA compile at the first step where the loss is read with `.item()` before `backward()`?**
    Run the change `item` above, or reason it out, then enter your answer.
    """)
    return


@app.cell
def _():
    answer = mo.ui.number(start=0, stop=10, value=0, label="new compilations at that step")
    answer
    return (answer,)


@app.cell
def _(answer):
    _spec = wb.ExperimentSpec(model="mlp", mode="lazy", steps=4, change="item", change_at=2)
    _measured = int(wb.run(_spec).steps.set_index("step").loc[2, "compiles"])
    _ok = answer.value == _measured
    mo.callout(mo.md(
        f"Measured: **{_measured}** new compilation(s) at the step that first calls `.item()`. "
        + ("Right: the forward pass up to the loss becomes one program (run to produce the "
           "value) and the rest of the step (backward and optimizer) another." if _ok else
           f"You said {answer.value}. Hint: the graph is cut where the value is read; what is "
           "left of the step still has to run.")), kind="success" if _ok else "warn")
    return


if __name__ == "__main__":
    app.run()
