import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="minGPT: a transformer learns to sort")

with app.setup:
    import inspect

    import marimo as mo
    import pandas as pd
    import torch

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench.models import get_model, mingpt, preset_table

    SMOKE = wb.smoke_mode()


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
    steps = mo.ui.slider(20, 400, value=150, step=10, label="training steps", show_value=True)
    mode = mo.ui.dropdown(wb.available_modes(), value=wb.default_modes()[-1], label="mode")
    mo.hstack([steps, mode], justify="start", gap=2)
    return mode, steps


@app.cell
def _(mode, steps):
    _spec = wb.ExperimentSpec(model="mingpt", preset="tiny", mode=mode.value,
                              steps=4 if SMOKE else steps.value, capture=("checkpoint",))
    result = wb.run_live([_spec], chart=wb.charts.loss_curves).result()
    mo.vstack([
        mo.md(f"Token accuracy of the sorted half on held-out sequences: "
              f"**{result.summary['metric']:.0%}** after {_spec.steps} steps "
              f"(a model that guesses: {1 / 3:.0%})."),
        wb.charts.loss_curves(result.steps.assign(mode=_spec.mode)),
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
    once. **How many of GPT-2 small's 124.4 M parameters sit in that embedding?** Enter
    millions.
    """)
    return


@app.cell
def _():
    answer = mo.ui.number(start=0.0, stop=124.0, step=0.1, value=10.0, label="millions")
    answer
    return (answer,)


@app.cell
def _(answer):
    _cfg = get_model("mingpt").config("gpt2")
    _wte = _cfg.vocab_size * _cfg.n_embd / 1e6
    _ok = abs(answer.value - _wte) <= 0.5
    mo.callout(mo.md(
        f"{_cfg.vocab_size:,} x {_cfg.n_embd} = **{_wte:.1f} M**, about "
        f"{_wte / 124.44:.0%} of the model. " + ("Right." if _ok else
        f"You said {answer.value} M.") + " That is why sharding the vocabulary dimension "
        "(vocab-parallel embeddings) matters for large-vocabulary models."),
        kind="success" if _ok else "warn")
    return


if __name__ == "__main__":
    app.run()
