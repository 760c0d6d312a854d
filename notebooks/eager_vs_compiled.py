import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Eager vs compiled: what each way of running costs")

with app.setup:
    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb

    SMOKE = wb.smoke_mode()
    SLOW_MODELS = ("resnet", "unet")
    # Sections that have run since the notebook opened (see `nb.may_measure`).
    OPENED: set[str] = set()
    # The exercise's run: the first `.item()` comes at step 2 of a lazy run of the small MLP.
    EXERCISE = wb.ExperimentSpec(model="mlp", preset="tiny", mode="lazy", steps=4,
                                 change="item", change_at=2)
    ANSWER_RANGE = (0, 10)


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
    warm worker serves any graph it compiled before, whatever mode asked for it. Every section
    measures once when the notebook opens, then again only when you press its **run** button;
    runs measured before in this same environment are shown at once, labelled with when and
    where they were measured.
    """)
    return


@app.cell
def _():
    model = mo.ui.dropdown(wb.model_names(), value="mingpt", label="model")
    # TorchTPU's modes appear where TorchTPU finds a chip; inductor is offered, not picked
    modes = mo.ui.multiselect(wb.available_modes(), label="modes",
                              value=wb.comparison_modes())
    steps = mo.ui.slider(5, 60, value=10, step=5, label="steps", show_value=True)
    cold = mo.ui.checkbox(value=True, label="fresh worker per mode (cold compile)")
    run_modes = mo.ui.run_button(label="run")
    mo.vstack([
        mo.hstack([model, modes, steps, cold, run_modes], justify="start", gap=1.5, wrap=True),
        mo.md(f"_The model is used by every section below. {' and '.join(SLOW_MODELS)} take "
              "minutes per mode on a CPU._"),
    ])
    return cold, model, modes, run_modes, steps


@app.cell
def _(cold, model, modes, run_modes, steps):
    _go = nb.may_measure(OPENED, "modes", run_modes.value)
    # Smoke mode (CI): the smallest model, few steps, shared warm workers.
    _n = 3 if SMOKE else steps.value
    _modes = ["eager", "lazy", "compile"] if SMOKE else modes.value
    _model = "mlp" if SMOKE else model.value
    _specs = [wb.ExperimentSpec(model=_model, preset="tiny", mode=_m, steps=_n)
              for _m in _modes]
    mo.stop(not _specs, mo.callout(mo.md("Pick at least one mode above."), kind="info"))
    _reuse = nb.reuse_ok() and not run_modes.value
    _cold = cold.value and not SMOKE
    mo.stop(not _go and not (_reuse and all(wb.reusable(_s, cold=_cold) for _s in _specs)),
            mo.callout(mo.md("Press **run** above to measure these settings."), kind="info"))
    comparison = wb.run_live(_specs, cold=_cold, reuse=_reuse)
    return (comparison,)


@app.cell
def _(comparison):
    # Beside the step times: the chip's duty cycle, TensorCore use and HBM that the worker
    # sampled (libtpu's monitoring SDK), or why there are none (no chip: nothing is made up).
    nb.chip_metrics_view(comparison)
    return


@app.cell
def _(comparison):
    summary = comparison.summary
    _cols = ["mode", "first_step_ms", "steady_median_ms", "compiles_total", "compiles_steady",
             "mfu"]
    _failures = nb.run_failures(comparison, summary)  # a failed run, or no summary at all
    mo.vstack([
        mo.md(nb.provenance(comparison)),
        *_failures,
        nb.table(summary[_cols], label="per-mode summary") if len(summary) else mo.md(""),
    ])
    return (summary,)


@app.cell
def _(summary):
    wb.charts.first_vs_steady(summary) if len(summary) else mo.md("")
    return


@app.cell
def _(summary):
    wb.charts.steady_times(summary) if len(summary) else mo.md("")
    return


@app.cell
def _(summary):
    wb.charts.compiles_per_mode(summary) if len(summary) else mo.md("")
    return


@app.cell(hide_code=True)
def _(summary):
    mo.stop(summary.empty)  # the cell above shows why (a failed-run callout)
    _peak = summary["peak_source"].iloc[0]
    mo.md(f"""
    **How to read it.** `first_step_ms` includes compiling (XLA) or code generation (inductor);
    `steady_*` are the median and spread of every later step, timed after waiting for the
    device. `compiles_steady` should be 0: a compile in steady state is a recompilation, the
    most common performance bug on TPUs. `mfu` is achieved FLOP/s (analytic FLOPs of the step)
    over the peak ({_peak}). On a CPU, XLA is rarely faster than PyTorch; on a TPU, `lazy`
    and `compile` are how you get near the chip's peak, because the whole step is one program.
    """)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## What makes XLA compile again?

    XLA compiles a program per distinct graph: same ops, same shapes, same dtypes, same outputs.
    Change one and the step is a new program: a cache miss. Pick a change (a new batch size, a
    shorter sequence for minGPT, bfloat16 autocast, a `.item()` inside the step, one more tensor
    kept alive) and press **run**; it is applied from step 3 on, in `lazy` mode, with
    torch_xla's own compilation analysis switched on (it slows steps, so it is opt-in). The
    table gives what we changed (`trigger`), torch_xla's cause and our reading of it.
    """)
    return


@app.cell
def _():
    change = mo.ui.dropdown({v: k for k, v in wb.CHANGES.items()},
                            value=wb.CHANGES["batch_size"], label="change at step 3")
    run_change = mo.ui.run_button(label="run")
    mo.hstack([change, run_change], justify="start", gap=2)
    return change, run_change


@app.cell
def _(change, model, run_change):
    _go = nb.may_measure(OPENED, "recompile", run_change.value)
    _spec = wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny",
                              mode="lazy", steps=5 if SMOKE else 8, change=change.value,
                              change_at=3)
    try:
        _spec.validate()
    except wb.SpecError as _exc:
        mo.stop(True, mo.callout(mo.md(f"This change does not apply here: {_exc}"), kind="warn"))
    _reuse = nb.reuse_ok() and not run_change.value
    mo.stop(not _go and not (_reuse and wb.reusable(_spec)),
            mo.callout(mo.md("Press **run** above to measure this change."), kind="info"))
    with mo.status.spinner(title=f"lazy {_spec.model}, changed at step 3"):
        recompile_run = wb.run(_spec, reuse=_reuse)
    compiles = wb.compile_events([recompile_run])
    mo.vstack([
        mo.md(nb.provenance(recompile_run)),
        wb.charts.recompile_timeline(compiles, _spec.steps),
    ])
    return (compiles,)


@app.cell
def _(compiles):
    nb.table(compiles[["step", "trigger", "cause", "explanation"]],
             label="every compilation, with torch_xla's cause", page_size=5)
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
    first minutes of a TPU session are spent compiling. The study starts a worker of its own
    each time it runs.
    """)
    return


@app.cell
def _():
    run_cache = mo.ui.run_button(label="run")
    run_cache
    return (run_cache,)


@app.cell
def _(model, run_cache):
    _go = nb.may_measure(OPENED, "cache", run_cache.value)
    _spec = wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny", mode="lazy",
                              steps=3 if SMOKE else 6)
    mo.stop(not _go, mo.callout(mo.md(f"Press **run** above to study {_spec.model}'s compile "
                                      "cache."), kind="info"))
    with mo.status.progress_bar(total=3, title="cache study", subtitle="cold worker",
                                remove_on_exit=True) as _bar:
        _next = {"cold": "warm worker", "warm": "new shape", "miss": "done"}
        cache = wb.cache_study(_spec, on_run=lambda s, r: _bar.update(subtitle=_next[s]))
    mo.vstack([
        mo.md(nb.provenance(cache.results)),
        wb.charts.cache_first_steps(cache.runs),
    ])
    return (cache,)


@app.cell
def _(cache):
    nb.table(cache.runs[["label", "first_step_ms", "compiles", "cache_hits", "saved_ms"]],
             label="one row per run, same worker")
    return


@app.cell
def _(cache):
    nb.table(cache.compiles[["scenario", "step", "trigger", "explanation"]],
             label="compilations during the steps, with their cause", page_size=5)
    return


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
def _():
    run_persistent = mo.ui.run_button(label="run")
    run_persistent
    return (run_persistent,)


@app.cell
def _(model, run_persistent):
    _go = nb.may_measure(OPENED, "persistent", run_persistent.value)
    mo.stop(SMOKE, mo.callout(mo.md(
        "Smoke mode (CI) skips this check, which starts two fresh workers; "
        "`tests/test_compile_cache.py` runs it, and so does "
        "`tpu-workbench cache --persistent --out DIR`."), kind="info"))
    mo.stop(not _go, mo.callout(mo.md(f"Press **run** above to check {model.value} across two "
                                      "processes."), kind="info"))
    _spec = wb.ExperimentSpec(model=model.value, preset="tiny", mode="lazy", steps=3)
    with mo.status.spinner(title="two fresh workers with the persistent cache"):
        persistent = wb.persistent_cache_check(_spec)
    mo.vstack([
        mo.callout(mo.md(persistent.verdict), kind="success" if persistent.readable else "warn"),
        nb.table(persistent.runs[["process", "first_step_ms", "compiles", "persistent_hits",
                                  "persistent_misses", "deserialize_failures"]],
                 label="each process's persistent-cache counters"),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## A batch-size sweep, here or on a Ray cluster

    How does the steady step time grow with the batch? One run per batch size, each in a
    workbench worker of its own. The **local** engine runs them one after another on this
    host's worker pool; **ray** makes each run a Ray task (an embedded local Ray here, a
    cluster with `tpu-workbench sweep --engine ray --address HOST:6379`): Ray places the
    worker on a node, streams its records back while it trains, and runs it again elsewhere if
    its node dies. Every run's results folder lands here either way, with the node that ran it.
    """)
    return


@app.cell
def _():
    sweep_form = mo.md("{engine} {mode} {batch_sizes}").batch(
        engine=mo.ui.dropdown(["local", "ray"], value="local", label="engine"),
        mode=mo.ui.dropdown(wb.available_modes(), value="torch_eager", label="mode"),
        batch_sizes=mo.ui.multiselect(["4", "8", "16", "32", "64", "128"],
                                      value=["8", "16", "32"], label="batch sizes"),
    ).form(submit_button_label="sweep", bordered=False)
    sweep_form
    return (sweep_form,)


@app.cell
def _(model, sweep_form):
    # A sweep is several cold workers: it runs only when the form is submitted.
    mo.stop(sweep_form.value is None, mo.callout(mo.md(
        "Pick an engine and the batch sizes, then press **sweep**."), kind="info"))
    _chosen = sweep_form.value
    mo.stop(not _chosen["batch_sizes"], mo.callout(mo.md("Pick at least one batch size."),
                                                    kind="info"))
    _base = wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny",
                              mode=_chosen["mode"], steps=3 if SMOKE else 10)
    _specs = wb.grid(_base, {"batch_size": sorted(int(b) for b in _chosen["batch_sizes"])})
    _live = wb.LiveSteps(_specs, show=lambda f: mo.output.replace(wb.charts.step_times(f)))
    with mo.status.spinner(title=f"sweep of {len(_specs)} runs ({_chosen['engine']})"):
        swept = wb.sweep(_specs, engine=_chosen["engine"], on_record=_live)
    mo.output.replace(wb.charts.step_times(swept.steps) if len(swept.steps) else mo.md(""))
    return (swept,)


@app.cell
def _(swept):
    _summary = swept.summary
    mo.stop(_summary.empty, mo.callout(mo.md("No run of the sweep finished:\n\n" + "\n".join(
        f"- {e}" for e in swept.errors.values())), kind="danger"))
    wb.charts.sweep_times(_summary, "batch_size")
    return


@app.cell
def _(swept):
    nb.table(swept.runs[["batch_size", "state", "host", "node", "attempts", "run_id"]],
             label="one row per run: where it ran")
    return


@app.cell(hide_code=True)
def _():
    mo.md(f"""
    ## Workshop exercise

    Reading a value in the middle of a step (`loss.item()`, `print(loss)`, an `if` on a tensor)
    forces XLA to run what it has traced so far. **In `lazy` mode, how many new programs does
    XLA compile at the first step where the loss is read with `.item()` before `backward()`?**
    Pick the change `.item()` in *What makes XLA compile again?* and press its **run**, or reason
    it out, then enter a number from {ANSWER_RANGE[0]} to {ANSWER_RANGE[1]} and press
    **check**. The answer was measured once, on the small MLP in a fresh worker, so no earlier
    run's cache changes it.
    """)
    return


@app.cell
def _():
    # Measured once, in a fresh worker; checking an answer never starts one.
    measured_answer = exercise_answer(reuse=nb.reuse_ok())
    return (measured_answer,)


@app.cell
def _():
    answer = mo.ui.text(label="new compilations at that step", placeholder="a whole number").form(
        submit_button_label="check", bordered=False)
    answer
    return (answer,)


@app.cell
def _(answer, measured_answer):
    mo.stop(answer.value is None,
            mo.md("_Enter a number and press **check**; nothing is judged before that._"))
    _kind, _verdict = judge_compiles(answer.value, measured_answer)
    mo.callout(mo.md(_verdict), kind=_kind)
    return


@app.function(hide_code=True)
def exercise_answer(reuse: bool = False) -> int:
    """New XLA compilations at the first step that reads the loss with `.item()`, measured in a
    fresh worker (a warm one may hold that graph already and compile nothing). With `reuse`, a
    stored run counts only if it was its worker's first (``cold=True``)."""
    result = wb.run(EXERCISE, reuse=reuse, cold=True)
    return int(result.steps.set_index("step")["compiles"].loc[EXERCISE.change_at])


@app.function(hide_code=True)
def judge_compiles(text: str, measured: int) -> tuple[str, str]:
    """The verdict on the typed answer `text` against the `measured` count:
    ``(callout kind, markdown)``. Pure: it starts no worker."""
    low, high = ANSWER_RANGE
    try:
        said = int(str(text).strip())
    except ValueError:
        return "warn", f"Type a whole number from {low} to {high} (not `{text}`)."
    if not low <= said <= high:
        return "warn", f"{said} is out of range: answer with a number from {low} to {high}."
    if said == measured:
        return "success", (
            f"**Right: {measured}.** The forward pass up to the loss is a new program, compiled "
            "and run to produce the value. At the end of the step torch_xla still holds the "
            "trace of the whole step, which is the graph it compiled at step 0: a cache hit, "
            "though the step now runs two executables.")
    return "warn", (f"You said {said}; not quite. Hint: count the graphs XLA has not seen "
                    "before; pick the `.item()` change above and read the compilations table.")


if __name__ == "__main__":
    app.run()
