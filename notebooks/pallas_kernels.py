import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Custom kernels: Pallas on TPU, checked on CPU")

with app.setup:
    import time

    import marimo as mo
    import pandas as pd
    import torch

    import kernels
    import tpu_workbench as wb
    from kernels import bench, check, lowering, tiling, torch_bridge
    from tpu_workbench import notebook as nb

    SMOKE = wb.smoke_mode()
    TPU = wb.tpu_status()
    HEAD_DIM = 32
    # The shape the pictures and the numerical check start with.
    DEFAULT_BLOCKS = dict(q_len=200, kv_len=200, block_q=64, block_k=128, causal=True,
                          head_dim=HEAD_DIM, dtype="float32")


@app.function
@mo.cache
def check_shape(q_len: int, block_q: int, block_k: int, causal: bool, dtype: str,
                heads: int) -> dict:
    """The attention kernel in interpret mode on random q/k/v (1, heads, q_len, HEAD_DIM)
    against the PyTorch reference: relative error and the seconds of the first call (traces
    the simulation), a second call and the reference. Cached per shape: a shape checked once
    is shown again at once."""
    dt = check.DTYPES[dtype]
    gen = torch.Generator().manual_seed(0)
    shape = (1, heads, q_len, HEAD_DIM)
    q, k, v = (torch.randn(shape, generator=gen).to(dt) for _ in range(3))
    seconds = []
    for _ in range(2):
        t0 = time.perf_counter()
        out = torch_bridge.flash_attention(q, k, v, causal=causal, block_q=block_q,
                                           block_k=block_k)
        seconds.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    ref = check.attention_reference(q, k, v, causal)
    reference_s = time.perf_counter() - t0
    return {"shape": shape, "rel_error": kernels.relative_error(out, ref),
            "first_s": seconds[0], "interpret_s": seconds[1], "reference_s": reference_s}


@app.function
def skipped_verdict(answer: float | None, skipped: int, total: int) -> tuple[str, str]:
    """(callout kind, markdown) for the exercise: a prompt until an answer is submitted, a
    range message outside 0-`total`, else the worked answer and whether it matches."""
    if answer is None:
        return "neutral", "Enter a number of grid steps and press **check**."
    if answer != int(answer) or not 0 <= answer <= total:
        return "danger", (f"{answer:g} is not a number of grid steps here: enter a whole "
                          f"number from 0 to {total}.")
    worked = (f"{skipped} of {total} steps are skipped (8 q blocks x 4 kv blocks; q blocks "
              "0-1 skip kv blocks 1-3, 2-3 skip 2-3, 4-5 skip 3).")
    if int(answer) == skipped:
        return "success", f"Right: {worked}"
    return "warn", f"You answered {int(answer)}. {worked}"


@app.cell(hide_code=True)
def _():
    mo.md(rf"""
    # Custom kernels: Pallas on TPU, checked on CPU

    XLA fuses most of a model well, but some computations want a hand-written kernel:
    attention whose $T \times T$ score matrix should never reach HBM, or a normalisation that
    should read its input once. TorchTPU and torch_xla both take TPU kernels written in
    **Pallas** (JAX's kernel language). The workbench's own live in `kernels/`:

    - `kernels.rmsnorm`: RMSNorm fused into one pass (mean of squares, rsqrt, scale, weight),
      one block of rows per grid step; reference `rmsnorm_reference` in PyTorch.
    - `kernels.flash_attention`: $QK^T$, an online softmax over key blocks and $PV$ in one
      kernel, causal blocks skipped; reference `attention_reference`
      (`F.scaled_dot_product_attention`).

    Each kernel takes its block sizes as parameters and checks them against the TPU's tiling
    rules in plain Python, before anything is traced. Here they run in **Pallas' TPU interpret
    mode** on the CPU (the grid, VMEM buffers and DMAs are simulated); on a TPU the same
    `pallas_call` is compiled by Mosaic and called from PyTorch through torch_xla's Pallas
    integration. minGPT switches to the attention kernel with one option,
    `options={{"attention": "pallas"}}`.

    **Here:** {"a TPU, so the kernels run compiled" if TPU.available else
               f"no TPU, so the kernels run in interpret mode. Why: {TPU.reason}"}.
    """)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Tiling: what sits in VMEM at each grid step

    A TPU core computes on data in its on-chip vector memory (VMEM, tens of MiB); the inputs
    live in HBM. A Pallas kernel declares a **grid** and, per operand, a **block shape** and an
    **index map** (grid step → block index); the pipeline copies the next step's blocks from
    HBM while the current step computes. The attention kernel's grid is
    `(batch*heads, q blocks, kv blocks)`, kv innermost: at step $(i, j)$ it holds Q rows
    $[i\,b_q, (i+1)\,b_q)$, K and V rows $[j\,b_k, (j+1)\,b_k)$, the output block $i$ and three
    float32 scratch buffers (running max $m$, running sum $\ell$, unnormalised output). For each
    key block it updates them with the **online softmax**:

    $$m' = \max(m, \max_j s_j),\quad \ell' = e^{m - m'}\ell + \sum_j e^{s_j - m'},\quad
    \mathrm{acc}' = e^{m - m'}\,\mathrm{acc} + e^{s - m'} V_j$$

    and writes $\mathrm{acc}/\ell$ after the last key block. Pick a shape and blocks (the
    pictures are computed from the kernel's own block sizes and index maps):
    """)
    return


@app.cell
def _():
    _d = DEFAULT_BLOCKS
    seq_len = mo.ui.slider(start=8, stop=1024, step=8, value=_d["q_len"],
                           label="sequence length", show_value=True)
    block_q = mo.ui.dropdown(["8", "12", "16", "32", "64", "128"], value=str(_d["block_q"]),
                             label="block_q")
    block_k = mo.ui.dropdown(["64", "128", "256"], value=str(_d["block_k"]), label="block_k")
    causal = mo.ui.checkbox(value=_d["causal"], label="causal")
    dtype = mo.ui.dropdown(["float32", "bfloat16"], value=_d["dtype"], label="dtype")
    mo.hstack([seq_len, block_q, block_k, causal, dtype], justify="start", gap=1.5)
    return block_k, block_q, causal, dtype, seq_len


@app.cell
def _(block_k, block_q, causal, dtype, seq_len):
    blocks = dict(q_len=seq_len.value, kv_len=seq_len.value, block_q=int(block_q.value),
                  block_k=int(block_k.value), causal=causal.value, head_dim=HEAD_DIM,
                  dtype=dtype.value)
    try:
        schedule = tiling.attention_schedule(**blocks)
        block_error = None
    except ValueError as e:  # raised in plain Python, before anything is traced
        schedule, block_error = None, str(e)
    mo.stop(block_error is not None, mo.callout(mo.md(
        f"**The kernel refuses these blocks** (checked before tracing):\n\n`{block_error}`\n\n"
        "TPU tiles are (8 sublanes x 128 lanes) of 32-bit words: a block's second-to-last dim "
        "must be a multiple of 8 (16 for bf16, two rows per word), and block_k is the lane dim "
        "of the score tile, so a multiple of 128."), kind="danger"))
    n_steps = int(schedule["step"].max()) + 1
    step = mo.ui.slider(start=0, stop=max(n_steps - 1, 1), value=min(3, n_steps - 1),
                        label="grid step", show_value=True)
    step
    return blocks, schedule, step


@app.cell
def _(blocks, schedule, step):
    _here = schedule[schedule["step"] == step.value].set_index("operand")
    _q, _k = _here.loc["Q"], _here.loc["K"]
    _vmem = tiling.attention_vmem_bytes(blocks["block_q"], blocks["block_k"], blocks["head_dim"],
                                        blocks["dtype"])
    _copies = ", ".join(op for op in "QKV" if _here.loc[op, "fetched"]) or "nothing"
    _skipped = int((~schedule[schedule["operand"] == "Q"]["computes"]).sum())
    mo.md(f"""
    Step **{step.value}** = grid point (q block {_q.q_block}, kv block {_q.kv_block}):
    Q rows {_q.row_start}-{_q.row_end - 1}, K/V rows {_k.row_start}-{_k.row_end - 1}
    ({"computes" if _q.computes else "**skipped**: every key is after every query"}).
    Copied from HBM for this step: {_copies}. Of {len(schedule) // 4} steps per head,
    {_skipped} are skipped. VMEM per step: {_vmem["total"] / 1024:,.0f} KiB
    (Q, K, V, O double-buffered, plus {(_vmem["m"] + _vmem["l"] + _vmem["acc"]) / 1024:,.0f}
    KiB of float32 scratch).
    """)
    return


@app.cell
def _(schedule, step):
    wb.charts.kernel_schedule(schedule, step=step.value)
    return


@app.cell
def _(blocks, step):
    wb.charts.score_tiles(tiling.score_tiles(
        blocks["q_len"], blocks["kv_len"], blocks["block_q"], blocks["block_k"],
        blocks["causal"]), step=step.value)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    A skipped step keeps K/V **block 0** in its index map: the block the next row of Q blocks
    starts with, so the pipeline copies nothing during skipped steps (the trick of jax's own
    TPU flash attention). Rows past the sequence length are padding: keys there get a large
    negative score, query rows there are sliced off.
    """)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Numerics: the kernels against their references

    Random inputs, relative error $\max|y - y_{ref}| / \max|y_{ref}|$, with shapes that are
    and are not multiples of the blocks, in float32 and bfloat16 (the references compute in
    float32 and round once). First your shape from above, then the cases the tests assert:
    """)
    return


@app.cell
def _():
    check_button = mo.ui.run_button(label="check this shape")
    mo.hstack([check_button, mo.md(
        "_Runs the kernel in interpret mode on the shape above: seconds at the default "
        "shape, about half a minute at 1024 tokens. The default shape is checked on open._")],
        justify="start", align="center")
    return (check_button,)


@app.cell
def _(blocks, check_button):
    _asked = check_button.value or blocks == DEFAULT_BLOCKS
    if _asked:
        with mo.status.spinner(title="running the kernel in interpret mode"):
            mine = check_shape(blocks["q_len"], blocks["block_q"], blocks["block_k"],
                               blocks["causal"], blocks["dtype"], 2 if SMOKE else 4)
        _tol = check.TOLERANCE[blocks["dtype"]]
        _what = (f"Your shape, q/k/v {mine['shape']} {blocks['dtype']}, "
                 f"causal={blocks['causal']}: relative error {mine['rel_error']:.2e} "
                 f"(tolerance {_tol:.0e})")
        _out = (mo.callout(mo.md(f"{_what}: within tolerance."), kind="success")
                if mine["rel_error"] <= _tol else
                nb.failed_run_callout("flash attention vs reference",
                                      f"{_what}: above tolerance"))
    else:
        mine = None
        _out = mo.md("_Press **check this shape** to compare the kernel with the reference on "
                     "the shape picked above._")
    _out
    return (mine,)


@app.cell
def _():
    _att = check.ATTENTION_CASES[1:2] if SMOKE else check.ATTENTION_CASES
    _rms = check.RMSNORM_CASES[1:2] if SMOKE else check.RMSNORM_CASES
    with mo.status.spinner(title="running the kernels in interpret mode"):
        checks = pd.concat([check.check_rmsnorm(_rms), check.check_attention(_att)],
                           ignore_index=True)
    wb.charts.kernel_errors(checks)
    return (checks,)


@app.cell
def _(checks):
    _sci = {c: checks[c].map("{:.1e}".format) for c in ("rel_error", "tolerance")}
    nb.table(checks[["kernel", "dtype", "shape", "blocks"]].assign(**_sci), page_size=12,
             label="kernel vs reference (the tests assert rel_error <= tolerance)")
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## The custom call in the HLO

    Compiled (`interpret=False`), a `pallas_call` becomes **one** `tpu_custom_call` in the
    program XLA receives; its `backend_config` carries the Mosaic kernel as MLIR bytecode that
    libtpu compiles. Lowering for the TPU platform needs no TPU, so here is the StableHLO of the
    attention wrapper for your shape: padding to block multiples, the custom call, slicing.
    torch_xla's `make_kernel_from_pallas` takes exactly this payload and inserts it into
    PyTorch's lazy graph. (In interpret mode there is no custom call: the grid becomes an XLA
    loop with host callbacks that simulate VMEM and the DMAs.)
    """)
    return


@app.cell
def _(blocks):
    _hlo = lowering.attention_stablehlo(2, blocks["q_len"], blocks["kv_len"], HEAD_DIM,
                                        dtype=blocks["dtype"], block_q=blocks["block_q"],
                                        block_k=blocks["block_k"], causal=blocks["causal"])
    calls = lowering.custom_calls(_hlo)
    _mosaic = lowering.attention_mosaic(2, blocks["q_len"], blocks["kv_len"], HEAD_DIM,
                                        dtype=blocks["dtype"], block_q=blocks["block_q"],
                                        block_k=blocks["block_k"], causal=blocks["causal"])
    _mosaic = _mosaic[_mosaic.find("The Mosaic module"):]
    mo.vstack([
        nb.table(calls[["target", "kernel_name", "signature", "payload_bytes"]],
                 label="custom calls in the lowered program"),
        mo.plain_text(lowering.shorten(_hlo)),
        mo.md("Inside the payload (Pallas prints it with `debug=True`): the block shapes are "
              "`window_bounds`, the index maps are the `transform_*` functions, the grid is "
              "`iteration_bounds`, and the kv axis is `arbitrary` (sequential: the scratch "
              "carries state across it) while the others are `parallel`."),
        mo.accordion({"Mosaic MLIR of the attention kernel": mo.plain_text(_mosaic)}),
    ])
    return (calls,)


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Timing: the kernel against XLA's own attention
    """)
    return


@app.cell
def _(mine):
    if TPU.available and not SMOKE:
        with mo.status.spinner(title="timing on the TPU (a subprocess holds the chip)"):
            _times = bench.run_tpu_benchmark()
        _out = mo.vstack([
            mo.md("bf16, causal, B x H x T x D shapes of GPT-2 small; median of 20 runs after "
                  "3 warm-up runs, the device synced before each clock read:"),
            nb.table(_times),
        ])
    else:
        _took = ("" if mine is None else
                 f"your shape took {nb.format_us(mine['interpret_s'] * 1e6)} per call (plus "
                 f"{nb.format_us(max(mine['first_s'] - mine['interpret_s'], 0) * 1e6)} to "
                 f"trace and compile the simulation once), PyTorch's reference "
                 f"{nb.format_us(mine['reference_s'] * 1e6)}. ")
        _out = mo.callout(mo.md(
            f"**No TPU here, so no timing means anything.** Interpret mode simulates every "
            f"grid step on the CPU with host callbacks: {_took}These numbers say nothing "
            f"about a TPU. On a TPU this cell runs `kernels.bench` in a subprocess and times "
            f"the compiled kernel against `F.scaled_dot_product_attention` compiled by XLA, on "
            f"GPT-2 small's attention shapes."), kind="warn")
    _out
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## minGPT with the kernel

    One option routes minGPT's attention through the kernel:
    `wb.ExperimentSpec(model="mingpt", ..., options={"attention": "pallas"})`. On a TPU the
    forward runs the compiled kernel (the backward recomputes the reference math). On
    XLA:CPU it is a clear error (a Mosaic kernel runs only on a TPU); on plain-PyTorch CPU
    (mode `torch_eager`) it runs in interpret mode: slow, but it shows the numbers agree.
    Same weights, same batch, both attentions:
    """)
    return


@app.cell
def _():
    from tpu_workbench.models import get_model

    _family = get_model("mingpt")
    torch.manual_seed(0)
    _xla = _family.build(_family.config("tiny"))
    _pallas = _family.build(_family.config("tiny", attention="pallas"))
    _pallas.load_state_dict(_xla.state_dict())
    _batch = _family.make_batch(_family.config("tiny"), 2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        _a, _b = _xla(_batch["x"]), _pallas(_batch["x"])
    mingpt_err = kernels.relative_error(_b, _a)
    _out = [mo.md(f"minGPT `tiny`, batch 2, plain PyTorch on CPU: logits with "
                  f"`attention='pallas'` vs `'xla'`: relative error **{mingpt_err:.1e}**.")]
    if TPU.available and not SMOKE:  # train both on the chip through the runner
        _rows = []
        for _impl in ("xla", "pallas"):
            _r = wb.run(wb.ExperimentSpec(model="mingpt", preset="gpt-mini", mode="compile",
                                          steps=20, options={"attention": _impl}),
                        reuse=nb.reuse_ok())
            _st = _r.steps[_r.steps["kind"] == "step"]
            _rows.append({"attention": _impl, "final loss": _st["loss"].iloc[-1],
                          "median step ms (steps 5+)": _st["wall_ms"].iloc[5:].median()})
        _out.append(nb.table(pd.DataFrame(_rows), label="gpt-mini on the TPU, 20 steps each"))
    mo.vstack(_out)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Workshop exercise

    Causal attention over **512** tokens with `block_q=64`, `block_k=128`: how many of one
    head's grid steps are **skipped** (their key block lies wholly after their query block)?
    Work it out from the picture's rule, then check.
    """)
    return


@app.cell
def _():
    answer = mo.ui.number(start=-1000, stop=1000, step=1, value=0,
                          label="skipped steps").form(submit_button_label="check",
                                                      bordered=False)
    answer
    return (answer,)


@app.cell
def _():
    _q = tiling.attention_schedule(512, 512, 64, 128, causal=True).query("operand == 'Q'")
    exercise_skipped, exercise_steps = int((~_q["computes"]).sum()), len(_q)
    return exercise_skipped, exercise_steps


@app.cell
def _(answer, exercise_skipped, exercise_steps):
    _kind, _text = skipped_verdict(answer.value, exercise_skipped, exercise_steps)
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
