import marimo

__generated_with = "0.25.2"
app = marimo.App(
    width="medium",
    app_title="Eager vs compiled: what each way of running costs",
)

with app.setup:
    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench.exercises import eager_vs_compiled as exercise

    SMOKE = wb.smoke_mode()
    SLOW_MODELS = ("resnet", "unet")
    SECTIONS = nb.Sections()


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
    # Smoke mode (CI): the smallest model and few steps; the same modes, each in a fresh worker.
    _modes = wb.comparison_modes() if SMOKE else modes.value
    _specs = [wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny",
                                mode=_m, steps=3 if SMOKE else steps.value) for _m in _modes]
    comparison = (SECTIONS.run_live("modes", run_modes, _specs, cold=cold.value,
                                    waiting="Press **run** above to measure these settings.")
                  if _specs else None)
    if not _specs:
        mo.output.replace(mo.callout(mo.md("Pick at least one mode above."), kind="info"))
    return (comparison,)


@app.cell
def _(comparison):
    # Beside the step times: the chip's duty cycle, TensorCore use and HBM that the worker
    # sampled, or why there are none (no chip: nothing is made up).
    nb.chip_metrics_view(comparison) if comparison is not None else None
    return


@app.cell
def _(comparison):
    summary = comparison.summary if comparison is not None else None
    (mo.vstack([
        mo.md(nb.provenance(comparison)),
        *nb.run_failures(comparison, summary),  # a failed run, or no summary at all
        nb.table(summary[["mode", "first_step_ms", "steady_median_ms", "compiles_total",
                          "compiles_steady", "mfu"]].rename(
            columns={"mfu": "share of this CPU's peak"}),
            label="per mode, measured on this machine") if len(summary) else mo.md(""),
    ]) if comparison is not None else None)
    return (summary,)


@app.cell
def _(summary):
    mo.stop(summary is None or not len(summary))
    mo.vstack([wb.charts.first_vs_steady(summary), wb.charts.steady_times(summary),
               wb.charts.compiles_per_mode(summary)])
    return


@app.cell(hide_code=True)
def _(comparison, summary):
    mo.stop(summary is None or summary.empty)  # the cell above shows why
    _later = wb.steady_compiles(comparison.steps)
    _where = "; ".join(f"`{_m}` compiled " + ", ".join(f"{_n} at step {_s}"
                                                        for _s, _n in _at.items())
                       for _m, _at in _later.items())
    _settle = (f" Here {_where}. A compile at step 1 and never again is the mode settling: "
               "`dynamo` compiles its forward and backward graphs at step 0, and at step 1 "
               "the optimizer update it leaves to lazy tensors, cut where a value is read "
               "(torch_xla's compile analysis names both causes). One that comes back every "
               "step is the bug." if _later else "")
    mo.md(f"""
    **How to read it.** `first_step_ms` includes compiling (XLA) or generating code
    (inductor); `steady_*` are the median and spread of every later step, timed after waiting
    for the device. `compiles_steady` counts compiles after step 0: a recompilation in steady
    state is the most common performance bug on TPUs.{_settle}
    The last column is achieved FLOP/s over **this CPU's** peak
    ({summary["peak_source"].iloc[0]}), not a TPU's MFU. {nb.xla_against_pytorch(summary)}
    On a TPU, `lazy` and `compile` are how a step gets near the chip's peak, because the whole
    step is one program.
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
    _spec = wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny",
                              mode="lazy", steps=5 if SMOKE else 8, change=change.value,
                              change_at=3)
    compiles = None
    try:
        _spec.validate()
        _run = SECTIONS.run("recompile", run_change, _spec,
                            title=f"lazy {_spec.model}, changed at step 3",
                            waiting="Press **run** above to measure this change.")
    except wb.SpecError as _exc:
        _run = None
        mo.output.replace(mo.callout(mo.md(f"This change does not apply here: {_exc}"),
                                     kind="warn"))
    if _run is not None:
        compiles = wb.compile_events([_run])
        mo.output.replace(mo.vstack([mo.md(nb.provenance(_run)),
                                     wb.charts.recompile_timeline(compiles, _spec.steps)]))
    return (compiles,)


@app.cell
def _(compiles):
    mo.stop(compiles is None)
    nb.table(compiles[["step", "trigger", "cause", "explanation"]],
             label="every compilation, with torch_xla's cause and our reading of it",
             page_size=5)
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
    _spec = wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny", mode="lazy",
                              steps=3 if SMOKE else 6)
    # a study is three fresh runs in a worker of its own: nothing stored stands in for it
    cache = None
    if SECTIONS.reuse("cache", run_cache.value, waiting=f"Press **run** above to study "
                      f"{_spec.model}'s compile cache.") is not None:
        with mo.status.progress_bar(total=3, title="cache study", subtitle="cold worker",
                                    remove_on_exit=True) as _bar:
            _next = {"cold": "warm worker", "warm": "new shape", "miss": "done"}
            cache = wb.cache_study(_spec, on_run=lambda s, r: _bar.update(subtitle=_next[s]))
        mo.output.replace(mo.vstack([mo.md(nb.provenance(cache.results)),
                                     wb.charts.cache_first_steps(cache.runs)]))
    return (cache,)


@app.cell
def _(cache):
    mo.stop(cache is None)
    mo.vstack([
        nb.table(cache.runs[["label", "first_step_ms", "compiles", "cache_hits", "saved_ms"]],
                 label="one row per run, same worker (saved_ms: only where nothing compiled)"),
        nb.table(cache.compiles[["scenario", "step", "trigger", "explanation"]],
                 label="compilations during the steps, with their cause", page_size=5),
    ])
    return


@app.cell(hide_code=True)
def _(cache):
    mo.stop(cache is None)
    _cold, _warm, _miss = (cache.runs.iloc[i] for i in range(3))
    mo.md(f"""
    The warm re-run compiled **{_warm.compiles:g}** programs and took **{_warm.cache_hits:g}**
    from the cache: its first step took {_warm.first_step_ms:,.0f} ms instead of
    {_cold.first_step_ms:,.0f} ms. The new batch size missed and compiled
    **{_miss.compiles:g}** program(s), paying a compile again (so it saved nothing). The
    worker's cache now holds {_miss.cached_graphs:g} executables: the step's for each batch
    size, and the program the set-up compiled before step 0 to place the weights and the
    optimizer's state.
    """)
    return


@app.cell(hide_code=True)
def _(backend_is_tpu):
    _here = "" if backend_is_tpu else (
        "**On XLA:CPU it cannot work**: the CPU writes the files but cannot read a compiled "
        "program back, so the second process compiles again. The check below shows that; on "
        "a TPU VM it shows the saving.")
    mo.md(f"""
    ### Across processes: the persistent cache

    The in-process cache dies with the worker. `torch_xla.runtime.initialize_cache(folder)`
    (the runner's `persistent_cache=True`) also writes every executable to disk, for the next
    process to load instead of compiling. {_here}
    """)
    return


@app.cell
def _():
    backend_is_tpu = wb.describe()["tpu"]["available"]
    run_persistent = mo.ui.run_button(label="run the two-process check again")
    run_persistent
    return backend_is_tpu, run_persistent


@app.cell
def _(model, run_persistent):
    # Two fresh workers sharing one persistent cache folder: on open, then on the button.
    _spec = wb.ExperimentSpec(model="mlp" if SMOKE else model.value, preset="tiny",
                              mode="lazy", steps=3)
    if SECTIONS.reuse("persistent", run_persistent.value,
                      waiting=f"Press **run the two-process check again** to check "
                              f"{_spec.model}'s step.") is not None:
        with mo.status.spinner(title="two fresh workers with the persistent cache"):
            _check = wb.persistent_cache_check(_spec)
        mo.output.replace(mo.vstack([
            mo.callout(mo.md(_check.verdict), kind="success" if _check.readable else "warn"),
            nb.table(_check.runs[["process", "first_step_ms", "compiles", "persistent_hits",
                                  "persistent_misses", "deserialize_failures"]],
                     label="each process's persistent-cache counters"),
        ]))
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    Many runs at once (a batch-size sweep on this host's pool or on Ray): `marimo edit
    notebooks/scale_out.py`.

    ## Workshop exercise

    A training loop in `compile` mode runs **3 epochs** over a data set that gives 1,000
    batches of 32 and then, since nothing drops the remainder, **one last batch of 8** each
    epoch. **How many times does XLA compile the training step in all?** Reason from what you
    saw above: what makes XLA compile, and what its cache keeps.
    """)
    return


@app.cell
def _():
    answer = mo.ui.text(label="compilations of the train step",
                        placeholder="a whole number").form(submit_button_label="check",
                                                           bordered=False)
    answer
    return (answer,)


@app.cell(hide_code=True)
def _(answer):
    # Judged by tpu_workbench/exercises/eager_vs_compiled.py; checking starts no worker.
    _kind, _text = (("neutral", "_Enter a number and press **check**; nothing is judged "
                     "before that._") if answer.value is None else exercise.judge(answer.value))
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
