import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Serve a model on a v6e")

with app.setup:
    import marimo as mo
    import pandas as pd

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench.charts import serving as charts
    from tpu_workbench.exercises import serve_a_model as exercise
    from tpu_workbench.serving import plan as plan_rules
    from tpu_workbench.serving.serve import hbm_parts

    SMOKE = wb.smoke_mode()
    # The plan on open: Qwen3-8B on a v6e-4 as the published runs served it (a two-layer
    # Llama on one chip in smoke runs, CI: the same sections, seconds of compiling).
    DEFAULT = ({"model": "hf:llama", "preset": "tiny-llama", "slices": ["v6e-1"],
                "input_len": 128, "output_len": 128, "concurrency": "1,8",
                "max_num_seqs": 8, "max_num_batched_tokens": 64, "max_model_len": 256}
               if SMOKE else
               {"model": "hf:qwen3", "preset": "qwen3-8b", "slices": ["v6e-4"],
                "input_len": 1024, "output_len": 1024, "concurrency": "8,64,256",
                "max_num_seqs": 256, "max_num_batched_tokens": 2048, "max_model_len": 9216})


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # Serve a model on a v6e

    Serving is most of what teams run on a v6e, and decode is a different regime from
    training: every step reads all the weights and every running sequence's KV pages from HBM
    to produce one token per sequence. This page asks **vLLM-TPU's own engine** (the
    `tpu-inference` package: its JAX Llama and Qwen3, its ragged paged attention Pallas
    kernel) for the programs it would compile at start-up, has **libtpu compile them for the
    slice** (no chip: nothing runs), and predicts from the compiled programs the inter-token
    latency (ITL), the time to first token (TTFT) and the tokens per second at each
    concurrency. Beside each prediction: the rule of thumb (weights + KV bytes over HBM
    bandwidth) and, where one exists, a published run.

    ### The record: predictions against published runs

    Each published v6e run (SGLang-JAX's and vLLM's own benchmark tables, with their source
    file and commit) planned the same way by `scripts/bench_serve.py --record`. Two constants
    (an engine overhead per step and the prefill's MXU efficiency) were fitted on one run and
    judged on the others.
    """)
    return


@app.cell
def _():
    record = wb.serving_record()
    published = wb.serving_runs()
    if record is None:
        _view = mo.callout(mo.md("No recorded predictions yet: `python scripts/bench_serve.py "
                                 "--record` writes them. The published runs:"), kind="warn")
        mo.output.replace(mo.vstack([_view, nb.table(published[[
            "run", "preset", "engine", "slice", "concurrency", "itl_ms", "ttft_ms"]])]))
    else:
        _judged = record[record.run != plan_rules.FIT_ROW]
        _worst = _judged.loc[(_judged.itl_ratio - 1).abs().idxmax()]
        _rule = _judged.loc[(_judged.rule_ratio - 1).abs().idxmax()]
        mo.output.replace(mo.vstack([
            mo.md(f"Judged rows: **{len(_judged)}**, fitted on **{plan_rules.FIT_ROW}**. ITL "
                  f"predicted / published: median {_judged.itl_ratio.median():.2f}, worst "
                  f"{_worst.run} at {_worst.itl_ratio:.2f}; the rule of thumb: median "
                  f"{_judged.rule_ratio.median():.2f}, worst {_rule.run} at "
                  f"{_rule.rule_ratio:.2f}. TTFT: median {_judged.ttft_ratio.median():.2f}. "
                  "_Predicted: compiled by libtpu, not run; published: as the source "
                  "tabulates it._"),
            nb.table(record.assign(version=record.engine_version.str[:12])[[
                "run", "engine", "version", "concurrency", "itl_ms", "itl_pred", "itl_ratio",
                "rule_ratio", "ttft_ms", "ttft_pred", "ttft_ratio"]].round(2),
                label="published runs (source, date and flags: serving_runs.csv) and their "
                      "predictions", page_size=len(record))]))
    return (published,)


@app.cell
def _():
    form = mo.md("""
    {model} {preset} {slices} {concurrency}

    {input_len} {output_len} {max_num_seqs} {max_num_batched_tokens} {max_model_len}
    """).batch(
        model=mo.ui.dropdown(["hf:llama", "hf:qwen3"], value=DEFAULT["model"], label="model"),
        preset=mo.ui.text(value=DEFAULT["preset"], label="preset"),
        slices=mo.ui.multiselect(["v6e-1", "v6e-4", "v6e-8", "v6e-16"],
                                 value=DEFAULT["slices"], label="slices"),
        concurrency=mo.ui.text(value=DEFAULT["concurrency"], label="concurrency"),
        input_len=mo.ui.number(start=1, stop=131072, value=DEFAULT["input_len"],
                               label="input tokens"),
        output_len=mo.ui.number(start=1, stop=131072, value=DEFAULT["output_len"],
                                label="output tokens"),
        max_num_seqs=mo.ui.number(start=1, stop=4096, value=DEFAULT["max_num_seqs"],
                                  label="--max-num-seqs"),
        max_num_batched_tokens=mo.ui.number(start=16, stop=65536,
                                            value=DEFAULT["max_num_batched_tokens"],
                                            label="--max-num-batched-tokens"),
        max_model_len=mo.ui.number(start=2, stop=131072, value=DEFAULT["max_model_len"],
                                   label="--max-model-len"),
    ).form(submit_button_label="plan (libtpu compiles the engine's programs per slice: "
                               "minutes for an 8B model on 2 cores, then cached)")
    form
    return (form,)


@app.cell
def _(form):
    _v = form.value or DEFAULT
    plans, errors = {}, []
    with mo.status.spinner(title="libtpu compiles vLLM-TPU's programs") as _spin:
        for _slice in _v["slices"]:
            try:
                plans[_slice] = wb.serve_plan(
                    _v["model"], _v["preset"].strip(), _slice, int(_v["input_len"]),
                    int(_v["output_len"]),
                    tuple(int(c) for c in str(_v["concurrency"]).split(",") if c.strip()),
                    max_num_batched_tokens=int(_v["max_num_batched_tokens"]),
                    max_num_seqs=int(_v["max_num_seqs"]),
                    max_model_len=int(_v["max_model_len"]),
                    on_progress=lambda _m: _spin.update(subtitle=_m))
            except (wb.WorkbenchError, ValueError) as _exc:
                errors.append(f"**{_slice}**: {_exc}")
    mo.output.replace(mo.callout(mo.md("**Not planned.**\n\n" + "\n\n".join(errors)),
                                 kind="danger") if errors else mo.md(
        "\n\n".join(f"_{p.label}_" for p in plans.values())))
    return (plans,)


@app.cell
def _(plans, published):
    curve = pd.concat([p.frame.assign(slice=s) for s, p in plans.items()]) if plans else None
    if curve is None:
        mo.output.replace(mo.callout(mo.md("No plan to draw: its error is above."),
                                     kind="warn"))
    else:
        _preset = next(iter(plans.values())).request.preset.name
        _pub = published[published.preset == _preset]
        _pub = _pub.assign(output_tokens_per_s_per_chip=_pub.output_tokens_per_s / _pub.tp)
        _knee = curve.loc[curve.output_tokens_per_s_per_chip.idxmax()]
        mo.output.replace(mo.vstack([
            mo.md(f"### Latency against throughput\n\nThe most tokens per chip predicted "
                  f"here: **{_knee.output_tokens_per_s_per_chip:,.0f}/s** on {_knee.slice} at "
                  f"concurrency {_knee.concurrency} (ITL {_knee.itl_mean_ms:.1f} ms, bound by "
                  f"{_knee.bottleneck}). {len(_pub)} published run(s) of {_preset} on the "
                  "chart."),
            charts.latency_throughput(curve, _pub),
        ]))
    return (curve,)


@app.cell
def _(curve):
    (nb.table(curve[["slice", "concurrency", "itl_mean_ms", "rule_of_thumb_itl_ms", "ttft_ms",
                     "output_tokens_per_s_per_chip", "kv_sequences_fit", "bottleneck",
                     "compiler_said"]].round(2),
              label="serve.csv per slice (predicted from the compiled programs, not run; "
                    "every column: `tpu-workbench serve-plan`)")
     if curve is not None else mo.md(""))
    return


@app.cell
def _(plans):
    mo.stop(not plans)
    _parts = pd.concat([hbm_parts(p) for p in plans.values()])
    _kv = _parts[_parts.part == "KV cache"].set_index("plan").gb
    _total = _parts.groupby("plan").gb.sum()
    mo.vstack([
        mo.md("### What fills a chip's HBM\n\nThe KV cache vLLM allocates (90% of HBM less "
              "the weights) as the compiler placed it: " + "; ".join(
                  f"{k}: {v:.1f} GB of {_total[k]:.1f} GB ({v / _total[k]:.0%})"
                  for k, v in _kv.items()) + "."),
        charts.hbm_share(_parts)])
    return


@app.cell
def _(plans):
    mo.stop(not plans)
    _p = next(iter(plans.values()))
    _steps = len(plan_rules.token_buckets(_p.request.max_num_batched_tokens))
    mo.vstack([
        mo.md(f"### The programs vLLM compiles at start-up\n\n{_p.notes[0]}: the runner "
              f"compiles its model step once per token bucket (**{_steps} "
              "step programs**), so a step of any size pads up to the next bucket and never "
              "compiles again while serving (as the generation notebook's `bucketed` strategy "
              "does). Those this plan needed, compiled by libtpu:"),
        nb.table(_p.programs[["program", "num_tokens", "num_reqs", "attention_kernels",
                              "all_reduces", "total_gb", "compile_s", "cached"]].round(2),
                 label=f"compiled programs: {_p.label}"),
        mo.md(f"Command: `{_p.command}`"),
    ])
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    Llama-3.3-70B on one v6e-8 (tensor parallel 8), with prompts of 1000 tokens and
    answers of 1000 tokens. Each decode step reads the weights on a chip once, and the KV
    pages of every running sequence. **At how many concurrent sequences do the KV pages read
    per step weigh as much as the weights** (where decode stops being weight-bound)? Work it
    out from the model's shape: bf16 weights (70.6 B parameters), 80 layers, 8 KV heads of
    128, every matrix and KV head split over the 8 chips; a sequence holds, on average, its
    prompt and half its answer.
    """)
    return


@app.cell
def _():
    answer = mo.ui.number(start=0, stop=1e6, step=1, label="sequences").form(
        submit_button_label="check", bordered=False)
    answer
    return (answer,)


@app.cell(hide_code=True)
def _(answer):
    # Judged by tpu_workbench/exercises/serve_a_model.py from the model's shape.
    _kind, _text = (("neutral", "_Enter a number and press **check**._")
                    if answer.value is None else exercise.judge(answer.value))
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
