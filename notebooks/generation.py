import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="tpu-workbench: generation")

with app.setup:
    import html

    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench.charts import generation as gen_charts
    from tpu_workbench.exercises import generation as exercise
    from tpu_workbench.generation import analysis as generation

    SMOKE = wb.smoke_mode()
    # The page's requests: prompts the sorting task defines (six digits, then none, one or two
    # tokens of their sorted answer), each length twice so a run's steady median is over a
    # dozen decode tokens. 8 + 4 - 1 = 11 positions: all that minGPT tiny is trained on.
    PROMPTS, NEW_TOKENS, BUCKETS = (6, 7, 8, 6, 7, 8), 4, (8, 11)
    TRAIN_STEPS = 30 if SMOKE else None  # None: the library's default
    SECTIONS = nb.Sections()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # Generation on a TPU: decode loops, KV caches, buckets

    A training step has the same shapes every step; a decode loop does not. Feed the whole
    sequence back for each new token (**naive**) and every token is a new input length: XLA
    compiles a new program for every token. A KV cache that grows (**dynamic_cache**, Hugging
    Face's default) keeps the input at one token but the cache grows by one position: again a
    new shape, again a compile. A cache **preallocated** at a fixed length and written at a
    position held in a tensor (**static_cache**) makes every decode step the same program:
    one prefill program per prompt length, and a single decode program for every token of
    every request. Serving stacks on TPU also pad prompts to a few lengths (**bucketed**),
    which bounds the prefill programs too: one per bucket used.

    Each strategy below decodes greedily with the same weights and the same prompts, timed per
    token after waiting for the device, in plain PyTorch (the baseline) and in the XLA modes,
    each mode in a fresh worker so that every compilation is counted. Every time on this page
    is measured on this machine's CPU (plain PyTorch, or XLA:CPU); none is a TPU's.
    """)
    return


@app.cell
def _():
    _models = wb.generation_models()
    model = mo.ui.dropdown(_models, value="mingpt" if "mingpt" in _models else _models[0],
                           label="model")
    weights = mo.ui.dropdown({"trained on its task": "trained", "random": "random"},
                             value="trained on its task", label="weights")
    batch = mo.ui.dropdown(["1", "2", "4"], value="1", label="batch")
    strategies = mo.ui.multiselect(list(generation.STRATEGIES),
                                   value=list(generation.STRATEGIES), label="strategies")
    _modes = wb.generation_modes()
    modes = mo.ui.multiselect(_modes, label="modes", value=[
        _m for _m in _modes if _m in ("torch_eager", "lazy")])
    run_generation = mo.ui.run_button(label="run")
    mo.vstack([mo.hstack([model, weights, batch], justify="start", gap=2),
               mo.hstack([strategies, modes, run_generation], justify="start", gap=2)])
    return batch, model, modes, run_generation, strategies, weights


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## The weights

    A random model says nothing when every strategy gives the same tokens: it emits much the
    same token whatever the prompt, so a cache that attends to the wrong positions gives the
    same tokens too. So the model first learns its task, minGPT's sorting (the Hugging Face
    models share it): six digits, then the same digits sorted. The prompts below are six digits
    and the start of their sorted answer, so every continuation can be checked against the
    task's answer, and a wrong cache shows as a wrong sort.
    """)
    return


@app.cell
def _(model, run_generation, weights):
    # A stored training run of this model is reused; otherwise it trains on open (seconds for
    # minGPT tiny) and later only when **run** is pressed.
    _steps = {"steps": TRAIN_STEPS} if TRAIN_STEPS else {}
    trained = None
    if weights.value == "trained":
        _reuse = SECTIONS.reuse(
            "weights", run_generation.value,
            lambda: wb.stored_weights(model.value, **_steps) is not None,
            waiting=f"Press **run** above to train {model.value} on its task (then decode).")
        if _reuse is not None:
            _stored = wb.stored_weights(model.value, **_steps) if _reuse else None
            with mo.status.spinner(title=f"training {model.value} on its task"):
                trained = _stored or wb.trained_weights(model.value, reuse=False, **_steps)
            mo.output.replace(mo.md(
                f"{nb.provenance(trained)} **{model.value}** trained "
                f"{trained.spec.steps} steps on its task in plain PyTorch: it writes "
                f"**{trained.summary['metric']:.0%}** of the sorted half's tokens right on "
                f"held-out sequences, each from the true prefix (a model that guesses: "
                f"{1 / task_digits(model.value):.0%})."))
    else:
        mo.output.replace(mo.callout(mo.md(
            "**Random weights**: equal tokens in every strategy and mode then show only that "
            "they compute the same function of a random model, not that a cache is right; "
            "a random model's greedy tokens hardly depend on the prompt."), kind="warn"))
    return (trained,)


@app.function
def task_digits(model: str) -> int:
    """The digits of `model`'s sorting task (tiny preset): what a guess is one of."""
    from tpu_workbench.models import get_model

    return get_model(model).config("tiny").n_digits


@app.cell
def _(batch, model, modes, strategies, trained, weights):
    # What to run (validated here: a bad setting is named before any worker starts); None
    # while the section waits, saying for what.
    gen_specs = None
    if not modes.value or not strategies.value:
        mo.output.replace(mo.callout(mo.md("Pick at least one mode and one strategy above."),
                                     kind="info"))
    elif weights.value == "trained" and trained is None:
        mo.output.replace(mo.callout(mo.md(
            "Decoding waits for the trained weights above: press **run**."), kind="info"))
    else:
        try:
            gen_specs = wb.generation_specs(
                model.value, "tiny", modes.value, strategies.value, prompts=PROMPTS,
                new_tokens=NEW_TOKENS, buckets=BUCKETS, batch_size=int(batch.value),
                weights=str(trained.out_dir) if trained is not None else None)
        except wb.SpecError as exc:
            mo.output.replace(nb.failed_run_callout("generation", exc))
    return (gen_specs,)


@app.cell
def _(gen_specs, run_generation):
    comparison = None
    if gen_specs is not None:
        _reuse = SECTIONS.reuse(
            "generation", run_generation.value,
            lambda: all(wb.stored_generation(_s) for _s in gen_specs),
            waiting="Press **run** above to generate with these settings.")
        if _reuse is not None:
            with mo.status.progress_bar(total=len(gen_specs), title="generating",
                                        remove_on_exit=True) as _bar:
                comparison = wb.generate_many(
                    gen_specs, lambda _c, _s: _bar.update(subtitle=f"{_s.mode}/{_s.decode}"),
                    reuse=_reuse)
            mo.output.replace(mo.vstack([*nb.run_failures(comparison, comparison.summary),
                                         mo.md(nb.provenance(comparison.results))]))
    return (comparison,)


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## What each strategy wrote

    A row per request: the prompt (six digits and the start of their sorted answer), what the
    task says follows, and each run's greedy tokens, ✓ where they are the task's answer. A cache
    that attends to a wrong position, or a bucket's padding that leaks into the real tokens,
    writes a different continuation here.
    """)
    return


@app.cell
def _(comparison):
    _out = comparison.outputs if comparison is not None else None
    (mo.vstack([mo.md(generation.outputs_note(_out)),
                nb.table(generation.continuations(_out), label="greedy tokens", page_size=12)])
     if _out is not None and len(_out) else
     mo.md("_The continuations appear once the runs above have finished._"))
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Time per token

    Measured on this machine (a shared CPU: plain PyTorch, or XLA:CPU; not a TPU). The first
    token of each request comes from the prefill and pays its compilation; steady is the
    median over the decode tokens after each request's first decode step, with its 10th and
    90th percentiles: a wide spread means another process held a core meanwhile.

    Plain PyTorch decodes on **one intra-op thread**. A one-token step of this model is a few
    dozen ops too small to split, and on two threads each op waits for the slower one: on a
    shared 2-core machine, whenever another process held a core, the step waited for the
    scheduler. Measured while writing this page (minGPT tiny, 32 tokens, three runs of each
    strategy): one thread gave medians of 0.26-0.28 ms per token, idle or beside a busy loop;
    two threads gave 0.32-0.40 ms idle but 60-180 ms when the host was busy, whichever
    strategy happened to run then. That, not the strategies, was once a 20x gap between two
    runs of the same decode code. XLA:CPU's lazy mode also traces each step in Python.
    """)
    return


@app.cell
def _(comparison):
    _t = comparison.tokens if comparison is not None else None
    gen_charts.ms_per_token(_t) if _t is not None and len(_t) else None
    return


@app.cell
def _(comparison):
    _s = comparison.summary if comparison is not None else None
    gen_charts.ttft_vs_steady(_s) if _s is not None and len(_s) else None
    return


@app.cell
def _(comparison):
    _s = comparison.summary if comparison is not None else None
    (nb.table(generation.timing_table(_s), page_size=16,
              label=f"per run, measured on this machine ({generation.measured_where(_s)}), "
                    "3 significant digits")
     if _s is not None and len(_s) else None)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Where the compilations go

    Every compilation of the XLA runs, and which shape made it new: the workbench compares the
    shapes each step fed the model with the steps before. torch_xla's own cause is not shown:
    it reads "user torch_xla.sync" for every one of them, because the per-token
    `torch_xla.sync()` is what cuts each graph; it names the trigger, not what changed.
    """)
    return


@app.cell
def _(comparison):
    # plain PyTorch compiles nothing: its panels would be all zeros
    compiled_tokens = (generation.compiling(comparison.tokens)
                       if comparison is not None else None)
    gen_charts.compiles_per_token(compiled_tokens) if compiled_tokens is not None and len(
        compiled_tokens) else None
    return (compiled_tokens,)


@app.cell
def _(compiled_tokens):
    _by_phase = (generation.compiles_by_phase(compiled_tokens)
                 if compiled_tokens is not None and len(compiled_tokens) else None)
    (mo.vstack([gen_charts.compiles_by_phase(_by_phase),
                mo.md(nb.compiles_by_phase_text(_by_phase))])
     if _by_phase is not None else None)
    return


@app.cell
def _(comparison):
    _c = comparison.compiles if comparison is not None else None
    if _c is None:
        _view = None
    elif not len(_c):
        _view = mo.md("_No compilations: plain PyTorch compiles nothing; add an XLA mode "
                      "above to see them._")
    else:
        _view = nb.table(_c[["mode", "strategy", "request", "token", "phase", "explanation"]],
                         label="compilations", page_size=10, wrapped_columns=["explanation"])
    _view
    return


@app.cell(hide_code=True)
def _():
    mo.md(f"""
    ## The prefill and the decode step, as XLA sees them

    One `lazy` run of **bucketed** on three requests (prompts of
    {", ".join(map(str, PROMPTS[:3]))} tokens, buckets {"/".join(map(str, BUCKETS))}) in a
    fresh worker, with XLA's HLO captured. The prefill takes the whole padded prompt and
    writes the cache at positions 0..bucket-1; the decode step takes one token and writes one
    position, given as a tensor: the same program for every token.
    """)
    return


@app.cell
def _():
    run_hlo = mo.ui.run_button(label="run")
    run_hlo
    return (run_hlo,)


@app.cell
def _(model, run_hlo):
    hlo_texts = None
    if "lazy" not in wb.generation_modes():
        mo.output.replace(mo.callout(mo.md("**No torch_xla here**, so no XLA programs to "
                                           "show."), kind="warn"))
    else:
        try:
            (_spec,) = wb.generation_specs(model.value, "tiny", ["lazy"], ["bucketed"],
                                           prompts=PROMPTS[:3], buckets=BUCKETS,
                                           new_tokens=2, capture=("hlo",))
        except wb.SpecError as exc:
            _spec = None
            mo.output.replace(nb.failed_run_callout("bucketed run", exc))
        if _spec is not None:
            _reuse = SECTIONS.reuse("hlo", run_hlo.value,
                                    lambda: wb.stored_generation(_spec) is not None,
                                    waiting="Press **run** above to measure it.")
            if _reuse is not None:
                with mo.status.spinner(title="bucketed run with its HLO captured"):
                    _runs = wb.generate_many([_spec], reuse=_reuse)
                _problems = nb.run_failures(_runs, _runs.summary)
                if _runs.results:
                    hlo_texts = wb.generation_phase_hlo(_runs.results[0])
                    if set(hlo_texts) != {"prefill", "decode"}:
                        _problems.append(nb.failed_run_callout(
                            "HLO", f"expected a prefill and a decode program, found "
                            f"{sorted(hlo_texts)}"))
                        hlo_texts = None
                mo.output.replace(mo.vstack([*_problems, mo.md(nb.provenance(_runs.results))]))
    return (hlo_texts,)


@app.cell
def _(hlo_texts):
    if hlo_texts is None:
        _view = None
    else:
        _inputs = generation.compare_inputs({"prefill": hlo_texts["prefill"],
                                             "decode": hlo_texts["decode"]})
        _same = _inputs[_inputs["same"]]
        _view = mo.vstack([
            mo.md("**What the two programs are fed** (their ENTRY parameters, before "
                  "optimisation). They differ only in these inputs, the token ids and the "
                  "positions (and the prefill's index of its last real token):"),
            nb.table(_inputs[~_inputs["same"]].drop(columns="same"), label="inputs that differ"),
            mo.md("Shapes both programs take (the weights; the KV caches, a key and a value "
                  "tensor per layer at the cache's one length; one-element indices): " + ", ".join(
                      f"`{_r['input shape']}` x{_r['prefill']}" for _, _r in _same.iterrows())
                  + "."),
        ])
    _view
    return


@app.cell
def _(hlo_texts):
    def _text(name: str):
        _entry = html.escape(generation.entry_computation(hlo_texts[name]))
        return mo.Html(f"<pre style='font-size:11px;white-space:pre-wrap;"
                       f"overflow-wrap:anywhere;margin:0'>{_entry}</pre>")

    (mo.accordion({f"the {_n} program's ENTRY computation, before optimisation (whole)":
                   _text(_n) for _n in ("prefill", "decode")})
     if hlo_texts is not None else None)
    return


@app.cell(hide_code=True)
def _():
    mo.md(f"""
    ## Exercise

    A server on a fresh worker gets requests with prompts of
    **{", ".join(map(str, exercise.PROMPTS))}** tokens, in that order, and generates
    **{exercise.NEW_TOKENS}** tokens for each; `bucketed` pads prompts to
    **{"/".join(map(str, exercise.BUCKETS))}**. **How many programs does XLA compile under
    each strategy?** Work it out from the shapes each step feeds the model (the compilation
    table above shows the rule at work on this page's requests), then press **check**.
    """)
    return


@app.cell
def _():
    programs_answer = mo.md("  \n".join(
        f"`{_s}`: {{{_s}}} programs" for _s in exercise.ASKED)).batch(**{
            _s: mo.ui.number(start=0, stop=10_000, step=1) for _s in exercise.ASKED}).form(
        submit_button_label="check", bordered=False)
    programs_answer
    return (programs_answer,)


@app.cell(hide_code=True)
def _(comparison, programs_answer):
    # Judged by tpu_workbench/exercises/generation.py; the page's own XLA runs are quoted as
    # evidence once the answer is right.
    if programs_answer.value is None:
        _view = mo.md("_Enter a number for each strategy and press **check**._")
    else:
        _measured = None
        if comparison is not None:
            _measured = {
                _r.spec.decode: (int(generation.token_frame(_r.records)["compiles"].sum()),
                                 generation.programs(_r.spec.decode, _r.spec.prompts,
                                                     _r.spec.new_tokens, _r.spec.buckets))
                for _r in comparison.results
                if _r.spec.mode == "lazy" and _r.spec.decode in exercise.ASKED} or None
        _kind, _text = exercise.judge(programs_answer.value, _measured)
        _view = mo.callout(mo.md(_text), kind=_kind)
    _view
    return


@app.cell(hide_code=True)
def _():
    mo.md("""
    ---
    From the command line: `tpu-workbench generate --model mingpt --preset tiny --train-steps
    200 --prompts 6,7,8,6,7,8 --tokens 4 --buckets 8,11 --strategies
    naive,dynamic_cache,static_cache,bucketed --modes torch_eager,lazy,compile --out gen`. In
    code: `wb.generate(wb.GenerationSpec(model="mingpt", mode="lazy", decode="static_cache",
    prompts=(6, 7, 8), new_tokens=4, weights=str(wb.trained_weights("mingpt").out_dir)))`.
    """)
    return


if __name__ == "__main__":
    app.run()
