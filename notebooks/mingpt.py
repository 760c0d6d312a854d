import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="minGPT: a transformer learns to sort")

with app.setup:
    import inspect

    import altair as alt
    import marimo as mo
    import pandas as pd
    import torch

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench.exercises import mingpt as exercise
    from tpu_workbench.models import count_params, get_model, mingpt, preset_table

    SMOKE = wb.smoke_mode()
    TINY = get_model("mingpt").config("tiny")
    GPT2 = get_model("mingpt").config(exercise.PRESET)
    # When the training section measures: on open, then on its button (notebook.Sections).
    SECTIONS = nb.Sections()


@app.cell(hide_code=True)
def _():
    mo.md(rf"""
    # minGPT: a transformer learns to sort

    A GPT in about a hundred lines (below), trained from random weights on minGPT's own demo
    task: read {TINY.length} digits from 0 to {TINY.n_digits - 1}, then write them sorted. The
    answer is checkable, so accuracy is real. The `tiny` preset trains in seconds on a laptop's
    XLA:CPU; `gpt2` is GPT-2 small's shape (124,439,808 parameters), the size you would train
    on a v6e.
    """)
    return


@app.cell
def _():
    _source = "\n\n".join(inspect.getsource(c) for c in (
        mingpt.CausalSelfAttention, mingpt.MLP, mingpt.Block, mingpt.GPT))
    mo.vstack([
        nb.table(preset_table("mingpt")[["preset", "params", "n_layer", "n_head", "n_embd",
                                        "vocab_size", "block_size", "batch_size",
                                        "gflops_per_step"]],
                 label="presets: parameters counted on PyTorch's meta device (each tied weight "
                       "once); gflops_per_step: analytic, 3 x the forward pass's matmuls at the "
                       "preset's batch of the sorting task",
                 column_widths={"preset": 80, "params": 110, "n_layer": 70, "n_head": 70,
                                "n_embd": 70, "vocab_size": 90, "block_size": 90,
                                "batch_size": 90, "gflops_per_step": 120}),
        mo.accordion({"the model's source": mo.ui.code_editor(_source, language="python",
                                                              disabled=True)}),
    ])
    return


@app.cell
def _():
    steps = mo.ui.slider(20, 400, value=150, step=10, label="training steps", show_value=True)
    mode = mo.ui.dropdown(wb.available_modes(), value=wb.default_modes()[-1], label="mode")
    run_button = mo.ui.run_button(label="train")
    mo.hstack([steps, mode, run_button], justify="start", gap=2)
    return mode, run_button, steps


@app.cell
def _(mode, run_button, steps):
    _spec = wb.ExperimentSpec(model="mingpt", preset="tiny", mode=mode.value,
                              steps=4 if SMOKE else steps.value, capture=("checkpoint",))
    # On open this trains (or shows a stored run of the same spec); then only on **train**.
    _runs = SECTIONS.run_live(
        "train", run_button, [_spec], chart=wb.charts.loss_curves,
        waiting="Press **train** above to train with these settings (tiny trains in seconds "
                "to a minute on XLA:CPU).")
    result = None if _runs is None else _runs.result()
    (None if result is None else mo.vstack([
        mo.md(nb.provenance(result, button="train")),
        mo.md(f"Token accuracy of the sorted half on held-out sequences, each token predicted "
              f"from the right answer so far (teacher forcing): "
              f"**{result.summary['metric']:.0%}** after {_spec.steps} steps. A model that "
              f"guesses uniformly among the {TINY.n_digits} digits scores "
              f"{1 / TINY.n_digits:.0%}."),
        wb.charts.loss_curves(result.steps.assign(mode=_spec.mode),
                              title=f"training loss, mode {_spec.mode}").encode(
            x=alt.X("step:Q", title="step", axis=alt.Axis(tickMinStep=1, format="d"),
                    scale=alt.Scale(domain=[0, int(result.steps["step"].max())],
                                    nice=False))),
    ]))
    return (result,)


@app.cell
def _(result):
    if result is not None:
        _family, _cfg, _model = wb.load_trained(result)
        _examples = pd.DataFrame(_family.sort_examples(_model, _cfg, 8,
                                                       torch.Generator().manual_seed(7)))
    _view = None if result is None else mo.vstack([
        mo.md(f"**Sorting on its own** (greedy decoding: each output is fed back in, no right "
              f"answer given, a harder test than the token accuracy above): "
              f"**{_examples['ok'].mean():.0%}** of these {len(_examples)} sequences come out "
              f"exactly right after {result.spec.steps} steps."),
        nb.table(_examples.astype(str)),
    ])
    _view
    return


@app.cell(hide_code=True)
def _():
    mo.md(rf"""
    ## Workshop exercise

    GPT-2 small (`{exercise.PRESET}` in the presets table) has
    {count_params("mingpt", exercise.PRESET):,} parameters in {GPT2.n_layer} blocks. **How many
    would it have with
    {exercise.LAYERS} blocks**, the same width, vocabulary and context? Reason from the presets
    table and the model's source above, then enter millions and press **check**.
    """)
    return


@app.cell
def _():
    params_answer = mo.ui.text(placeholder="millions", label="parameters (millions)").form(
        submit_button_label="check", bordered=False)
    params_answer
    return (params_answer,)


@app.cell(hide_code=True)
def _():
    # The question's model counted on the meta device, for the check.
    deeper_facts = exercise.deeper_facts()
    return (deeper_facts,)


@app.cell(hide_code=True)
def _(deeper_facts, params_answer):
    mo.stop(params_answer.value is None,
            mo.md("_Enter your answer and press **check**; nothing is judged before that._"))
    _kind, _text = exercise.judge_deeper(params_answer.value, deeper_facts)
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
