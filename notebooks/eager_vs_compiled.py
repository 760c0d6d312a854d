import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Eager vs compiled: what each way of running costs")

with app.setup:
    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb

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
    model = mo.ui.dropdown(wb.model_names(), value="mingpt", label="model")
    # TorchTPU's modes appear where TorchTPU finds a chip; inductor is offered, not picked
    modes = mo.ui.multiselect(wb.available_modes(), label="modes",
                              value=wb.comparison_modes())
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
    mo.stop(not _specs, mo.callout(mo.md("Pick at least one mode above."), kind="info"))
    comparison = wb.run_live(_specs, cold=cold.value and not SMOKE)
    return (comparison,)


@app.cell
def _(comparison):
    summary = comparison.summary
    _cols = ["mode", "first_step_ms", "steady_median_ms", "steady_p10_ms", "steady_p90_ms",
             "compiles_total", "compiles_steady", "executions_per_step", "items_per_s", "mfu",
             "final_loss"]
    _failures = nb.run_failures(comparison, summary)  # a failed run, or no summary at all
    mo.vstack([
        *_failures,
        nb.table(summary[_cols], label="per-mode summary"),
        mo.hstack([wb.charts.steady_times(summary), wb.charts.first_vs_steady(summary)]),
        wb.charts.compiles_per_mode(summary),
    ]) if len(summary) else mo.vstack(_failures)
    return (summary,)


@app.cell(hide_code=True)
def _(summary):
    mo.stop(summary.empty)  # the cell above shows why (a failed-run callout)
    _peak = summary["peak_source"].iloc[0]
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

    XLA compiles a program per distinct graph: same ops, same shapes, same dtypes, same outputs.
    Change one and the step is a new program: a cache miss. Pick a change (a new batch size, a
    shorter sequence for minGPT, bfloat16 autocast, a `.item()` inside the step, one more tensor
    kept alive); it is applied from step 3 on, in `lazy` mode, with torch_xla's own compilation
    analysis switched on (it slows steps, so it is opt-in). The table gives what we changed
    (`trigger`), torch_xla's cause and our reading of it.
    """)
    return


@app.cell
def _():
    change = mo.ui.dropdown({v: k for k, v in wb.CHANGES.items()},
                            value=wb.CHANGES["batch_size"], label="change at step 3")
    change
    return (change,)


@app.cell
def _(change, model):
    _spec = wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny",
                              mode="lazy", steps=5 if SMOKE else 8, change=change.value,
                              change_at=3)
    try:
        _spec.validate()
    except wb.SpecError as _exc:
        mo.stop(True, mo.callout(mo.md(f"This change does not apply here: {_exc}"), kind="warn"))
    recompile_run = wb.run(_spec)
    compiles = wb.compile_events([recompile_run])
    mo.vstack([
        wb.charts.recompile_timeline(compiles, _spec.steps),
        nb.table(compiles[["step", "trigger", "cause", "explanation", "inputs", "outputs",
                           "frame"]], label="every compilation, with torch_xla's cause"),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## The compilation cache: cold, warm, and a miss

    Every executable XLA compiles stays in the worker's in-process cache, keyed by the graph's
    hash. Below, the same experiment runs three times in **one** worker: first cold (it compiles
    everything), then again (every graph is a cache hit: `CachedCompile` goes up,
    `UncachedCompile` does not), then with the batch doubled (a new shape: a miss, compiled once
    more). This is why the workbench keeps workers warm between notebook runs, and why the
    first minutes of a TPU session are spent compiling.
    """)
    return


@app.cell
def _(model):
    _spec = wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny", mode="lazy",
                              steps=3 if SMOKE else 6)
    with mo.status.progress_bar(total=3, title="cache study", subtitle="cold worker",
                                remove_on_exit=True) as _bar:
        _next = {"cold": "warm worker", "warm": "new shape", "miss": "done"}
        cache = wb.cache_study(_spec, on_run=lambda s, r: _bar.update(subtitle=_next[s]))
    _runs = cache.runs[["label", "batch_size", "first_step_ms", "steady_median_ms", "compiles",
                        "cache_hits", "cached_graphs", "compile_ms", "saved_ms"]]
    mo.vstack([
        wb.charts.cache_first_steps(cache.runs),
        nb.table(_runs, label="one row per run, same worker"),
        nb.table(cache.compiles[["scenario", "step", "trigger", "cause", "explanation"]],
                 label="compilations during the steps, with their cause"),
    ])
    return (cache,)


@app.cell(hide_code=True)
def _(cache):
    _cold, _warm, _miss = (cache.runs.iloc[i] for i in range(3))
    mo.md(f"""
    The warm re-run compiled **{_warm.compiles:g}** graphs and took **{_warm.cache_hits:g}**
    from the cache: its first step took {_warm.first_step_ms:,.0f} ms instead of
    {_cold.first_step_ms:,.0f} ms ({_warm.saved_ms:,.0f} ms saved). The new batch size missed
    and compiled **{_miss.compiles:g}** graph(s); the worker now holds
    {_miss.cached_graphs:g} executables.

    ### Across processes: the persistent cache

    The in-process cache dies with the worker. `torch_xla.runtime.initialize_cache(folder)`
    (the runner's `persistent_cache=True`, one folder per runtime configuration) also writes
    every executable to disk for the next process. Two fresh workers below share one folder.
    """)
    return


@app.cell
def _(model):
    mo.stop(SMOKE, mo.callout(mo.md(
        "Smoke mode (CI) skips this check, which starts two fresh workers; "
        "`tests/test_compile_cache.py` runs it, and so does "
        "`tpu-workbench cache --persistent --out DIR`."), kind="info"))
    _spec = wb.ExperimentSpec(model=model.value, preset="tiny", mode="lazy", steps=3)
    with mo.status.spinner(title="two fresh workers with the persistent cache"):
        persistent = wb.persistent_cache_check(_spec)
    mo.vstack([
        mo.callout(mo.md(persistent.verdict), kind="success" if persistent.readable else "warn"),
        nb.table(persistent.runs[["process", "first_step_ms", "compiles", "persistent_misses",
                                  "persistent_hits", "deserialize_failures", "files"]],
                 label="each process's persistent-cache counters"),
    ])
    return


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
        + ("Right: the forward pass up to the loss is a new program, run to produce the value. "
           "At the end of the step torch_xla still holds the trace of the whole step, which is "
           "the graph it compiled at step 0: a cache hit (see `cached` in the steps), though "
           "the step now runs two executables." if _ok else
           f"You said {answer.value}. Hint: count the graphs XLA has not seen before; compare "
           "the `compiles` and `cached` columns of that step.")), kind="success" if _ok else "warn")
    return


if __name__ == "__main__":
    app.run()
