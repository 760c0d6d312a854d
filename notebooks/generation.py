import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="tpu-workbench: generation")

with app.setup:
    import html

    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import hlo
    from tpu_workbench import notebook as nb
    from tpu_workbench.charts import generation as gen_charts
    from tpu_workbench.generation import analysis as generation

    SMOKE = wb.smoke_mode()
    # The exercise's requests: three prompt lengths, one per bucket.
    EXERCISE_PROMPTS, EXERCISE_BUCKETS = (5, 9, 17), (8, 16, 32)
    # Sections that have run since the notebook opened (see `nb.may_measure`).
    OPENED: set[str] = set()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # Generation on a TPU: decode loops, KV caches, buckets

    A training step has the same shapes every step; a decode loop does not. Feed the whole
    sequence back for each new token (**naive**) and every token is a new input length: XLA
    compiles a new program for every token. A KV cache that grows (**dynamic_cache**, Hugging
    Face's default) keeps the input at one token but the cache grows by one position: again a
    new shape, again a compile. A cache **preallocated** at a fixed length and written at a
    position held in a tensor (**static_cache**) makes every decode step the same program, so
    there are two compilations, the prefill and the decode step, however many tokens you ask
    for. Serving stacks on TPU also pad prompts to a few lengths (**bucketed**), which bounds
    the prefill programs too.

    Each strategy below generates greedily from the same random model and the same prompts,
    timed per token after waiting for the device, in plain PyTorch (the baseline) and in the
    XLA modes, each mode in a fresh worker so that every compilation is counted.
    """)
    return


@app.cell
def _():
    _models = wb.generation_models()
    model = mo.ui.dropdown(_models, value="mingpt" if "mingpt" in _models else _models[0],
                           label="model")
    prompt_len = mo.ui.slider(2, 24, value=5, label="prompt length", show_value=True)
    new_tokens = mo.ui.slider(2, 32, value=12, label="new tokens", show_value=True)
    batch = mo.ui.dropdown(["1", "2", "4", "8"], value="1", label="batch")
    strategies = mo.ui.multiselect(list(generation.STRATEGIES),
                                   value=list(generation.STRATEGIES), label="strategies")
    _modes = wb.generation_modes()
    modes = mo.ui.multiselect(_modes, label="modes", value=[
        _m for _m in _modes if _m in (("torch_eager",) if SMOKE else ("torch_eager", "lazy"))])
    run_generation = mo.ui.run_button(label="run")
    mo.vstack([mo.hstack([model, prompt_len, new_tokens, batch], justify="start", gap=2),
               mo.hstack([strategies, modes, run_generation], justify="start", gap=2)])
    return batch, model, modes, new_tokens, prompt_len, run_generation, strategies


@app.cell
def _(batch, model, modes, new_tokens, prompt_len, run_generation, strategies):
    mo.stop(not modes.value or not strategies.value,
            mo.callout(mo.md("Pick at least one mode and one strategy above."), kind="info"))
    try:
        specs = wb.generation_specs(model.value, "tiny", modes.value, strategies.value,
                                    prompts=(prompt_len.value,),
                                    new_tokens=4 if SMOKE else new_tokens.value,
                                    batch_size=int(batch.value))
        _error = None
    except wb.SpecError as exc:
        specs, _error = [], exc
    mo.stop(_error is not None, nb.failed_run_callout("generation", _error))
    _go = nb.may_measure(OPENED, "generation", run_generation.value)
    _reuse = nb.reuse_ok() and not run_generation.value
    _stored = _reuse and all(wb.stored_generation(_s) for _s in specs)
    mo.stop(not _go and not _stored,
            mo.callout(mo.md("Press **run** above to generate with these settings."),
                       kind="info"))
    with mo.status.progress_bar(total=len(specs), title="generating",
                                remove_on_exit=True) as _bar:
        comparison = wb.generate_many(
            specs, lambda _c, _s: _bar.update(subtitle=f"{_s.mode}/{_s.decode}"),
            reuse=_reuse)
    _options = specs[0].options
    mo.vstack([
        *nb.run_failures(comparison, comparison.summary),
        mo.md(nb.provenance(comparison.results)),
        mo.md(f"Model options for generation: `{_options}` (the position table must cover "
              "the prompt, the new tokens and the largest bucket)." if _options else ""),
    ])
    return (comparison,)


@app.cell
def _(comparison):
    mo.stop(not len(comparison.tokens))
    gen_charts.ms_per_token(comparison.tokens)
    return


@app.cell
def _(comparison):
    mo.stop(not len(comparison.tokens))
    gen_charts.compiles_per_token(comparison.tokens)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    **Time to first token vs steady decode.** The first token comes from the prefill, which
    pays its compilation; steady is the median of the decode tokens after each request's first
    decode step. On XLA:CPU the compiled modes are not faster than plain PyTorch for a model
    this small (the programs are the point: the same ones run on a TPU).
    """)
    return


@app.cell
def _(comparison):
    mo.stop(not len(comparison.summary))
    gen_charts.ttft_vs_steady(comparison.summary)
    return


@app.cell
def _(comparison):
    mo.stop(not len(comparison.summary))
    nb.table(comparison.summary[["mode", "strategy", "ttft_ms", "steady_ms_per_token",
                                 "tokens_per_s", "compiles_total", "compiles_steady",
                                 "cache_hits", "cache_bytes"]],
             label="per run", page_size=16)
    return


@app.cell
def _(comparison):
    mo.stop(not len(comparison.tokens))
    gen_charts.compiles_by_phase(generation.compiles_by_phase(comparison.tokens))
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    **Why each compilation happened**: torch_xla's cause (its compilation analysis) and the
    workbench's reading of the shapes each step fed the model.
    """)
    return


@app.cell
def _(comparison):
    _c = comparison.compiles
    mo.stop(not len(_c), mo.md("_No compilations: plain PyTorch compiles nothing._"))
    nb.table(_c[["mode", "strategy", "request", "token", "phase", "cause", "explanation"]],
             label="compilations", page_size=10)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    **Same model, same tokens.** Greedy decoding from the same weights must give the same
    tokens whatever the strategy and the mode; `same_as_pytorch` compares each with plain
    PyTorch's.
    """)
    return


@app.cell
def _(comparison):
    mo.stop(not len(comparison.outputs))
    nb.table(comparison.outputs[["mode", "strategy", "prompt", "output", "same_as_pytorch"]],
             label="greedy output", page_size=16)
    return


@app.cell(hide_code=True)
def _():
    mo.md(f"""
    ## The prefill and the decode step, as XLA sees them

    One `lazy` run of **bucketed** on three requests, prompts of
    {", ".join(map(str, EXERCISE_PROMPTS))} tokens with buckets
    {"/".join(map(str, EXERCISE_BUCKETS))}, in a fresh worker, with XLA's HLO captured. The
    prefill takes the whole padded prompt and writes the cache at positions 0..bucket-1; the
    decode step takes one token and writes one position, given as a tensor: the same program
    for every token.
    """)
    return


@app.cell
def _():
    run_hlo = mo.ui.run_button(label="run")
    run_hlo
    return (run_hlo,)


@app.cell
def _(model, run_hlo):
    mo.stop("lazy" not in wb.generation_modes(),
            mo.callout(mo.md("**No torch_xla here**, so no XLA programs to show."),
                       kind="warn"))
    _go = nb.may_measure(OPENED, "exercise", run_hlo.value)
    try:
        (_spec,) = wb.generation_specs(model.value, "tiny", ["lazy"], ["bucketed"],
                                       prompts=EXERCISE_PROMPTS, buckets=EXERCISE_BUCKETS,
                                       new_tokens=2 if SMOKE else 6, capture=("hlo",))
        _error = None
    except wb.SpecError as exc:
        _spec, _error = None, exc
    mo.stop(_error is not None, nb.failed_run_callout("bucketed run", _error))
    _reuse = nb.reuse_ok() and not run_hlo.value
    mo.stop(not _go and not (_reuse and wb.stored_generation(_spec)),
            mo.callout(mo.md("Press **run** above to measure it."), kind="info"))
    bucket_runs = wb.generate_many([_spec], reuse=_reuse)
    mo.vstack([*nb.run_failures(bucket_runs, bucket_runs.summary),
               mo.md(nb.provenance(bucket_runs.results))])
    return (bucket_runs,)


@app.cell
def _(bucket_runs):
    mo.stop(not bucket_runs.results)
    hlo_texts = wb.generation_phase_hlo(bucket_runs.results[0])
    mo.stop(set(hlo_texts) != {"prefill", "decode"},
            nb.failed_run_callout("HLO", f"expected a prefill and a decode program, found "
                                  f"{sorted(hlo_texts)}"))
    nb.table(hlo.diff(hlo_texts["prefill"], hlo_texts["decode"], "prefill", "decode")
             .query("kind != 'collective'").head(14)
             .rename(columns={"a": "prefill", "b": "decode"}),
             label="HLO ops: prefill vs decode", page_size=14)
    return (hlo_texts,)


@app.cell
def _(hlo_texts):
    def _column(name: str) -> str:
        _text = html.escape(generation.entry_computation(hlo_texts[name]))
        return (f"<div style='min-width:0'><b>{name}</b>: the ENTRY computation, before "
                "optimisation<pre style='font-size:11px;max-height:420px;overflow:auto;"
                f"margin:4px 0'>{_text}</pre></div>")

    mo.Html("<div style='display:grid;grid-template-columns:1fr 1fr;gap:12px'>"
            f"{_column('prefill')}{_column('decode')}</div>")
    return


@app.cell(hide_code=True)
def _():
    mo.md(f"""
    ## Exercise

    The run above served three requests with prompts of
    **{", ".join(map(str, EXERCISE_PROMPTS))}** tokens, bucketed to
    **{"/".join(map(str, EXERCISE_BUCKETS))}**, in a fresh worker. **How many times did XLA
    compile?** Work it out from the strategy (which programs differ in shape?), then press
    **check**: the answer is the count the run measured.
    """)
    return


@app.cell
def _():
    compiles_answer = mo.ui.text(label="compilations").form(submit_button_label="check",
                                                             bordered=False)
    compiles_answer
    return (compiles_answer,)


@app.cell
def _(bucket_runs, compiles_answer):
    mo.stop(compiles_answer.value is None,
            mo.md("_Type a number and press **check**; nothing is judged before that._"))
    _kind, _verdict = judge_bucket_compiles(compiles_answer.value, bucket_runs.summary)
    mo.callout(mo.md(_verdict), kind=_kind)
    return


@app.function(hide_code=True)
def judge_bucket_compiles(said: str, summary) -> tuple[str, str]:
    """The verdict on `said` for the bucketed run's `summary` (one row): ``(callout kind,
    markdown)``. Pure: it starts nothing."""
    if not len(summary):
        return "warn", "The bucketed run has no result to check against; run it first."
    measured = int(summary["compiles_total"].iloc[0])
    try:
        n = int(str(said).strip())
    except ValueError:
        return "warn", f"{said!r} is not a whole number of compilations."
    if n == measured:
        return "success", (f"**Right**: {measured}. One prefill per bucket used (8, 16 and 32: "
                           "each prompt lands in its own) and one decode step, shared by every "
                           "request because the cache has one length, the largest bucket plus "
                           "the new tokens.")
    return "warn", (f"You said {n}; not quite. Which buckets do 5, 9 and 17 land in, and does "
                    "the decode step's shape depend on the prompt at all?")


@app.cell(hide_code=True)
def _():
    mo.md("""
    ---
    From the command line: `tpu-workbench generate --model mingpt --preset tiny --strategies
    naive,dynamic_cache,static_cache,bucketed --modes torch_eager,lazy,compile --tokens 16
    --out gen`. In code: `wb.generate(wb.GenerationSpec(model="hf:llama", mode="lazy",
    decode="static_cache", new_tokens=16))`.
    """)
    return


if __name__ == "__main__":
    app.run()
