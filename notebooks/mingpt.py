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
    from tpu_workbench.models import get_model, mingpt, preset_table

    SMOKE = wb.smoke_mode()
    # What the page trains on open, without a click.
    DEFAULTS = {"steps": 150, "mode": wb.default_modes()[-1]}
    GPT2 = get_model("mingpt").config("gpt2")


@app.function
def embedding_verdict(answer: float | None) -> tuple[str, str]:
    """(callout kind, markdown) for the exercise: a prompt until an answer is submitted, a range
    message outside 0-124.4 M, else the count worked out and whether the answer is within 0.5 M
    of it."""
    if answer is None:
        return "neutral", "Enter millions of parameters and press **check**."
    if not 0 <= answer <= 124.44:
        return "danger", (f"{answer:g} M cannot be part of a 124.4 M-parameter model: enter a "
                          "number from 0 to 124.4.")
    wte = GPT2.vocab_size * GPT2.n_embd / 1e6
    right = abs(answer - wte) <= 0.5
    return ("success" if right else "warn"), (
        f"{'Right.' if right else f'You said {answer:g} M.'} {GPT2.vocab_size:,} x "
        f"{GPT2.n_embd} = **{wte:.1f} M**, about {wte / 124.44:.0%} of the model. That is why "
        "sharding the vocabulary dimension (vocab-parallel embeddings) matters for "
        "large-vocabulary models.")


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # minGPT: a transformer learns to sort

    A GPT in about a hundred lines (below), trained from random weights on minGPT's own demo
    task: read six digits, then write them sorted. The answer is checkable, so accuracy is real.
    The `tiny` preset trains in seconds on a laptop's XLA:CPU; `gpt2` is GPT-2 small
    (124,439,808 parameters), the size you would train on a v6e.
    """)
    return


@app.cell
def _():
    _source = "\n\n".join(inspect.getsource(c) for c in (
        mingpt.CausalSelfAttention, mingpt.MLP, mingpt.Block, mingpt.GPT))
    mo.vstack([
        nb.table(preset_table("mingpt")[["preset", "params", "n_layer", "n_head", "n_embd",
                                        "vocab_size", "gflops_per_step"]],
                 label="presets (parameters counted on the meta device)"),
        mo.accordion({"the model's source": mo.ui.code_editor(_source, language="python",
                                                              disabled=True)}),
    ])
    return


@app.cell
def _():
    steps = mo.ui.slider(20, 400, value=DEFAULTS["steps"], step=10, label="training steps",
                         show_value=True)
    mode = mo.ui.dropdown(wb.available_modes(), value=DEFAULTS["mode"], label="mode")
    run_button = mo.ui.run_button(label="train")
    mo.hstack([steps, mode, run_button], justify="start", gap=2)
    return mode, run_button, steps


@app.cell
def _(mode, run_button, steps):
    _pick = {"steps": steps.value, "mode": mode.value}
    # On open (default settings) this runs by itself; other settings wait for **train**.
    mo.stop(_pick != DEFAULTS and not run_button.value,
            mo.md("_Settings changed: press **train** to train with them (tiny trains in "
                  "seconds to a minute on XLA:CPU)._"))
    _spec = wb.ExperimentSpec(model="mingpt", preset="tiny", mode=_pick["mode"],
                              steps=4 if SMOKE else _pick["steps"], capture=("checkpoint",))
    # Without a click this shows a stored run of the same spec if there is one.
    result = wb.run_live([_spec], chart=wb.charts.loss_curves,
                         reuse=nb.reuse_ok() and not run_button.value).result()
    _last = int(result.steps["step"].max())
    _chart = wb.charts.loss_curves(result.steps.assign(mode=_spec.mode),
                                   title=f"training loss, mode {_spec.mode}").encode(
        x=alt.X("step:Q", title="step", axis=alt.Axis(tickMinStep=1, format="d"),
                scale=alt.Scale(domain=[0, _last], nice=False)))
    mo.vstack([
        mo.md(nb.provenance(result, button="train")),
        mo.md(f"Token accuracy of the sorted half on held-out sequences: "
              f"**{result.summary['metric']:.0%}** after {_spec.steps} steps "
              f"(a model that guesses: {1 / 3:.0%})."),
        _chart,
    ])
    return (result,)


@app.cell
def _(result):
    _family, _cfg, _model = wb.load_trained(result)
    _examples = pd.DataFrame(_family.sort_examples(_model, _cfg, 8,
                                                   torch.Generator().manual_seed(7)))
    mo.vstack([
        mo.md(f"**The trained model sorts on its own** (greedy decoding, its outputs fed back "
              f"in): {_examples['ok'].mean():.0%} of these sequences come out exactly right."),
        nb.table(_examples.astype(str)),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    GPT-2 ties its output layer to the token embedding, so the 50,257 x 768 matrix is counted
    once. **How many of GPT-2 small's 124.4 M parameters sit in that embedding?** The presets
    table at the top has the sizes; enter millions.
    """)
    return


@app.cell
def _():
    answer = mo.ui.number(start=-1000, stop=1000, step=0.1, value=0, label="millions").form(
        submit_button_label="check", bordered=False)
    answer
    return (answer,)


@app.cell
def _(answer):
    _kind, _text = embedding_verdict(answer.value)
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
