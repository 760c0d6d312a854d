import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Custom kernels: Pallas on TPU, checked on CPU")

with app.setup:
    import marimo as mo
    import pandas as pd
    import torch

    import kernels
    import tpu_workbench as wb
    from kernels import bench, check, lowering, tiling
    from tpu_workbench import notebook as nb
    from tpu_workbench.exercises import pallas_kernels as exercise

    SMOKE = wb.smoke_mode()
    TPU = wb.tpu_status()
    HEAD_DIM = 32
    # The shape the pictures and the numerical check start with.
    DEFAULT_BLOCKS = dict(q_len=200, kv_len=200, block_q=64, block_k=128, causal=True,
                          head_dim=HEAD_DIM, dtype="float32")
    # When each section measures: on open, then on its button (notebook.Sections).
    SECTIONS = nb.Sections()


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
               f"{nb.tpu_reason(TPU)}, so the kernels run in interpret mode on this CPU"}.
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

    and writes $\mathrm{acc}/\ell$ after the last key block. Pick a shape and blocks (head_dim
    is 32 on this page; the pictures are computed from the kernel's own block sizes and index
    maps):
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
    _steps = 1 if schedule is None else int(schedule["step"].max()) + 1
    step = mo.ui.slider(start=0, stop=max(_steps - 1, 1), value=min(3, _steps - 1),
                        label="grid step", show_value=True)
    # Refused blocks: the sections below that need a schedule show nothing (no mo.stop, which
    # would put marimo's "Ancestor stopped" box in every one of them).
    mo.callout(mo.md(
        f"**The kernel refuses these blocks** (checked before tracing):\n\n`{block_error}`\n\n"
        "TPU tiles are (8 sublanes x 128 lanes) of 32-bit words: a block's second-to-last dim "
        "must be a multiple of 8 (16 for bf16, two rows per word), and block_k is the lane dim "
        "of the score tile, so a multiple of 128. The pictures, the check and the HLO below "
        "wait for blocks the kernel takes."), kind="danger") if block_error else step
    return blocks, schedule, step


@app.cell
def _(schedule, step):
    mo.md(tiling.step_text(schedule, step.value)) if schedule is not None else None
    return


@app.cell
def _(schedule, step):
    wb.charts.kernel_schedule(schedule, step=step.value) if schedule is not None else None
    return


@app.cell
def _(blocks, schedule, step):
    (wb.charts.score_tiles(tiling.score_tiles(
        blocks["q_len"], blocks["kv_len"], blocks["block_q"], blocks["block_k"],
        blocks["causal"]), step=step.value) if schedule is not None else None)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    A skipped step keeps K/V **block 0** in its index map: the block the next row of Q blocks
    starts with, so the pipeline copies nothing during skipped steps (the trick of jax's own
    TPU flash attention). Rows past the sequence length are padding: keys there get a large
    negative score, query rows there are sliced off.

    **VMEM per grid step** is the same at every step: the buffers below, counted as VMEM
    stores them. A tile's last dim is its **lanes**, and VMEM stores whole rows of 128 lanes:
    a last dim narrower than 128 is padded up to 128 (or a multiple of 128). The pipeline keeps
    **two copies** of each Q, K, V and O tile (one computed on while the next is copied in);
    the scratch buffers are **float32** whatever the inputs' dtype, one copy each, and m and
    $\ell$ are **128 lanes wide** by design (one value per row, repeated across the lanes).
    """)
    return


@app.cell
def _(blocks, schedule):
    _b = [blocks[k] for k in ("block_q", "block_k", "head_dim", "dtype")]
    _t = None if schedule is None else tiling.attention_vmem_table(*_b)
    mo.vstack([
        mo.md(tiling.vmem_text(*_b)),
        nb.table(_t.assign(KiB=_t["bytes"] / 1024, values_KiB=_t["value_bytes"] / 1024)[
            ["buffer", "holds", "block", "dtype", "copies", "lanes", "KiB", "values_KiB"]],
            label="VMEM of one grid step, per buffer (block: rows x width as the kernel "
                  "declares it; KiB: as stored, lanes padded; values_KiB: the values alone)"),
    ]) if _t is not None else None
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## Numerics: the kernels against their references

    Random inputs, relative error $\max|y - y_{ref}| / \max|y_{ref}|$, with shapes that are
    and are not multiples of the blocks, in float32 and bfloat16 (the references compute in
    float32 and round once). Measured on this CPU, the kernels in Pallas' interpret mode. First
    your shape from above, then the cases the tests assert.
    """)
    return


@app.cell
def _():
    check_button = mo.ui.run_button(label="check this shape")
    mo.hstack([check_button, mo.md(
        "_Runs the kernel in interpret mode on the shape above: seconds at the default "
        "shape, about half a minute at 1024 tokens. The shape above is checked when the "
        "page opens; after that, a shape checked before is shown again at once and a new one "
        "waits for this button._")], justify="start", align="center")
    return (check_button,)


@app.cell
def _(blocks, check_button, schedule):
    _args = (blocks["q_len"], blocks["block_q"], blocks["block_k"], blocks["causal"],
             blocks["dtype"], 2 if SMOKE else 4, HEAD_DIM)
    _reuse = None if schedule is None else SECTIONS.reuse(
        "check", check_button.value, lambda: check.shape_checked(*_args),
        waiting="Press **check this shape** to run the kernel on these blocks (nothing runs "
                "before that).")
    if _reuse is None:
        mine = None
    else:
        with mo.status.spinner(title="running the kernel in interpret mode"):
            mine = check.check_shape(*_args, reuse=_reuse)
    _what = "" if mine is None else (
        f"Your shape, q/k/v {mine['shape']} {blocks['dtype']}, causal={blocks['causal']}: "
        f"relative error {mine['rel_error']:.2e} (tolerance {mine['tolerance']:.0e}; measured "
        "on this CPU in interpret mode)")
    (None if mine is None else
     mo.callout(mo.md(f"{_what}: within tolerance."), kind="success") if mine["ok"] else
     nb.failed_run_callout("flash attention vs reference", f"{_what}: above tolerance"))
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
    nb.table(checks[["kernel", "dtype", "shape", "blocks"]].assign(
        **_sci, exact=checks["rel_error"] == 0), page_size=12,
        label="kernel vs reference (the tests assert rel_error <= tolerance; exact: equal "
              "bit for bit)")
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    A relative error of exactly **0** means the kernel's output equals the reference's bit for
    bit; the chart draws it apart (a diamond left of the axis), because a log axis has no
    place for 0. In bfloat16 that is no accident: both sides compute in float32 and round once,
    and their float32 differences (the order of a sum) are far below bfloat16's step of about
    $4 \times 10^{-3}$, so they round to the same value. In float32 nothing hides them.
    """)
    return


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    ## The custom call in the HLO

    Compiled (`interpret=False`), a `pallas_call` becomes **one** `tpu_custom_call` in the
    program XLA receives; its `backend_config` carries the Mosaic kernel as MLIR bytecode that
    libtpu compiles. Lowering for the TPU platform needs no TPU, so here is the StableHLO of the
    attention wrapper for your shape (lowered here, not compiled or run): padding to block
    multiples, the custom call, slicing. torch_xla's `make_kernel_from_pallas` takes exactly
    this payload and inserts it into PyTorch's lazy graph. (In interpret mode there is no
    custom call: the grid becomes an XLA loop with host callbacks that simulate VMEM and the
    DMAs.)
    """)
    return


@app.cell
def _(blocks, schedule):
    if schedule is not None:
        _kw = dict(dtype=blocks["dtype"], block_q=blocks["block_q"],
                   block_k=blocks["block_k"], causal=blocks["causal"])
        _hlo = lowering.attention_stablehlo(2, blocks["q_len"], blocks["kv_len"], HEAD_DIM,
                                            **_kw)
        calls = lowering.custom_calls(_hlo)
        _mosaic = lowering.attention_mosaic(2, blocks["q_len"], blocks["kv_len"], HEAD_DIM,
                                            **_kw)
        _view = mo.vstack([
            nb.table(calls[["target", "kernel_name", "operands", "payload_bytes"]],
                     label="custom calls in the lowered program (their types: in the program "
                           "below)"),
            nb.code_block(lowering.shorten(_hlo), max_height_px=900),
            mo.md("Inside the payload (Pallas prints it with `debug=True`): the block shapes "
                  "are `window_bounds`, the index maps are the `transform_*` functions, the "
                  "grid is `iteration_bounds`, and the kv axis is `arbitrary` (sequential: the "
                  "scratch carries state across it) while the others are `parallel`."),
            mo.accordion({"Mosaic MLIR of the attention kernel": nb.code_block(
                _mosaic[_mosaic.find("The Mosaic module"):])}),
        ])
    else:
        calls, _view = None, None
    _view
    return


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
            mo.md("Measured on this TPU: bf16, causal, B x H x T x D shapes of GPT-2 small; "
                  "median of 20 runs after 3 warm-up runs, the device synced before each "
                  "clock read:"),
            nb.table(_times),
        ])
    else:
        _took = ("" if mine is None else
                 f"on this CPU your shape took {nb.format_us(mine['interpret_s'] * 1e6)} per "
                 f"call (plus {nb.format_us(max(mine['first_s'] - mine['interpret_s'], 0) * 1e6)}"
                 f" to trace and compile the simulation once), PyTorch's reference "
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
    _out = [mo.md(f"minGPT `tiny`, batch 2, plain PyTorch on this CPU (the kernel in "
                  f"interpret mode): logits with `attention='pallas'` vs `'xla'`: relative "
                  f"error **{mingpt_err:.1e}**.")]
    if TPU.available and not SMOKE:  # train both on the chip through the runner
        _rows = []
        for _impl in ("xla", "pallas"):
            _r = wb.run(wb.ExperimentSpec(model="mingpt", preset="gpt-mini", mode="compile",
                                          steps=20, options={"attention": _impl}),
                        reuse=nb.reuse_ok())
            _st = _r.steps[_r.steps["kind"] == "step"]
            _rows.append({"attention": _impl, "final loss": _st["loss"].iloc[-1],
                          "median step ms (steps 5+)": _st["wall_ms"].iloc[5:].median()})
        _out.append(nb.table(pd.DataFrame(_rows),
                             label="gpt-mini measured on this TPU, 20 steps each"))
    mo.vstack(_out)
    return


@app.cell(hide_code=True)
def _():
    _q = exercise.QUESTION
    mo.md(rf"""
    ## Workshop exercise

    Gemma 2's attention heads are 256 wide. **How much VMEM does one grid step of this kernel
    need for head_dim {_q["head_dim"]} in {_q["dtype"]}, with block_q = {_q["block_q"]} and
    block_k = {_q["block_k"]}?** The controls above keep head_dim at 32, so no figure on this
    page is the answer: work it out buffer by buffer from the rules above the VMEM table (what
    is padded, what is double-buffered, what is float32 and how wide each buffer is), then
    enter KiB and press **check**.
    """)
    return


@app.cell
def _():
    vmem_answer = mo.ui.text(placeholder="KiB", label="VMEM per grid step (KiB)").form(
        submit_button_label="check", bordered=False)
    vmem_answer
    return (vmem_answer,)


@app.cell(hide_code=True)
def _():
    # The kernel's own accounting of the question's blocks (kernels.tiling), for the check.
    vmem_facts = exercise.vmem_facts()
    return (vmem_facts,)


@app.cell(hide_code=True)
def _(vmem_answer, vmem_facts):
    mo.stop(vmem_answer.value is None,
            mo.md("_Enter your answer and press **check**; nothing is judged before that._"))
    _kind, _text = exercise.judge_vmem(vmem_answer.value, vmem_facts)
    mo.callout(mo.md(_text), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
