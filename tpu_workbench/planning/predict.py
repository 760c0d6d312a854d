"""Plan a TPU run from a laptop: the step compiled for each slice by the TPU's own compiler
(:func:`tpu_workbench.tpu_compile.tpu_compile`, nothing runs), its memory per chip as the
compiler assigned it, and its step time, MFU and bottleneck predicted from the compiled program
(:mod:`tpu_workbench.planning.steptime`).

A model too large to compile whole here is compiled with one and with two blocks at its real
width (:func:`tpu_workbench.planning.steptime.extrapolate` scales the difference to all its
blocks; memory likewise). The analytic fit check (:func:`tpu_workbench.sharding.fit_table`)
stays as the instant estimate beside the compiler's figure, with its error.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from .. import models, sharding
from ..environment.chips import get_chip, get_slice
from ..errors import SpecError
from ..runs.workers import WorkerPool
from ..sharding.ici import ici_assumptions
from ..tpu_compile import DoesNotFit, TPUCompile, tpu_compile
from ..tpu_compile.compile import (
    MAX_TRACE_DEVICES,
    checked_flags,
    equivalent_slice,
    step_options,
    step_plan,
)
from ..tpu_compile.results import usable_hbm_bytes
from . import steptime

DTYPES = tuple(sharding.STATE_BYTES)  # the dtypes the one memory convention knows

# The fraction of a chip's bf16 peak that the compute-bound ops of a compiled step reach: the
# one constant fitted to a published run. Fitted to MaxText's Llama-3.1-8B on a v6e-8 (FSDP,
# seq 8192, global batch 24, flash attention, remat, no collective matmul; 3.443 s per step:
# AI-Hypercomputer/tpu-recipes, training/trillium/Llama3.1-8B-MaxText/v6e-8/README.md @ac200eb)
# with this workbench's own step of that model (torch_xla's flash kernel, every block
# rematerialised), compiled by libtpu 0.0.51: 0.640. Checked on the recipes' v6e-16, v6e-32,
# v6e-64 and v6e-256 runs, which it was not fitted to (scripts/bench_predict.py; the table is
# in notes/tpu_compiler.md). It stands for what a roofline of the compiled ops leaves out: the
# MXU's real efficiency, pipeline bubbles, MaxText's lighter remat policy.
MXU_EFFICIENCY = 0.64
MXU_EFFICIENCY_SOURCE = ("fitted to MaxText Llama-3.1-8B, v6e-8, FSDP, seq 8192, batch 24: "
                         "3.443 s/step (tpu-recipes v6e-8 README @ac200eb)")

MEMORY_PARTS = ("arguments", "outputs", "aliased", "temp")
# The blocks a large model is compiled with; the difference is one block. Two and three, not
# one and two: the compiler packs a one-block program's temporaries differently (checked: a
# v6e-32 Llama-3-8B step, 16.3 GB of temporaries with one block, 22.6 GB with two and three).
BLOCKS = (2, 3)
COMPILED_COLUMNS = ["compiler_memory_gb", "estimate_error", "collectives", "libtpu", "compiled_for",
                    "compiled_as", "compile_s", "predict_s"]


def _program_totals(program: TPUCompile, chip: str,
                    widen_to: tuple[Any, tuple[int, ...]] | None = None) -> dict[str, float]:
    """:func:`steptime.totals` of a compiled step, and its memory parts (bytes, ``mem:*``).
    FLOPs the compiler counts that no HLO op shows (Pallas kernels: flash attention, a custom
    call to XLA) are one more compute-bound op. `widen_to`: the larger slice and its mesh the
    program is the per-chip equivalent of (its collectives over every chip or along the data
    axis re-timed there)."""
    ops = program.ops
    collectives = program.collectives
    if widen_to is not None:
        wide, wide_mesh = widen_to
        collectives = steptime.widen_collectives(collectives, chip, program.mesh, wide_mesh,
                                                 wide.topology)
    # The compiler's total counts each loop body once, as XLA's cost analysis does: compare it
    # with the ops counted that way too.
    counted_once = (ops["flops"] / ops["trips"]).sum()
    kernels = max(0.0, float(program.compiled["cost"].get("flops", 0.0)) - counted_once)
    if kernels:
        ops = pd.concat([ops, pd.DataFrame([{"name": "pallas kernels", "opcode": "custom-call",
                                             "shape": "", "flops": kernels, "bytes": 0.0}])],
                        ignore_index=True)
    total = steptime.totals(steptime.op_times(ops, chip, dtype="bfloat16"), collectives)
    total["kernel_flops"] = kernels
    total.update({f"mem:{k}": float(program.memory[k]) for k in MEMORY_PARTS})
    return total


def predict(model: str, preset: str, slices: Sequence[str] = ("v6e-16",),
            strategies: Sequence[str] = ("fsdp",), seq_len: int = 2048, batch_size: int = 32,
            dtype: str | None = None, recompute: bool = False, attention: str | None = None,
            whole: bool | None = None, options: dict[str, Any] | None = None,
            libtpu_flags: Sequence[str] = (), pool: WorkerPool | None = None,
            timeout: float = 1800.0, on_progress: Callable[[str], None] | None = None,
            model_axis: int | None = None, optimizer: str = "adamw") -> pd.DataFrame:
    """Predicted step time of `model`/`preset` training on each slice with each strategy, at
    global `batch_size` and `seq_len` tokens, from its step compiled by libtpu for that slice:
    one row per (slice, strategy), columns :data:`steptime.PREDICTION_COLUMNS` plus ``fits``
    and ``reason`` (the compiler's verdict), ``compiler_memory_gb`` (per chip),
    ``estimated_memory_gb`` (the analytic convention) and ``estimate_error``, ``layers``,
    ``method`` (``whole``, or ``blocks``: :data:`BLOCKS` compiled, extrapolated), ``collectives``
    (the kinds the compiler scheduled, in the largest program compiled), ``libtpu``,
    ``predict_s`` and ``executions`` (0: nothing ran). ``frame.attrs["assumptions"]`` lists what
    the numbers assume.

    `dtype`: ``bfloat16`` (hf:* default: mixed precision) or ``float32``. `recompute`:
    activation checkpointing per block (the hf:* ``remat`` option). `attention`: ``"flash"``
    for torch_xla's Pallas flash attention (hf:*). `whole`: compile the whole model (default:
    only when it has at most 3 blocks). `libtpu_flags`: compiler flags (``LIBTPU_INIT_ARGS``).
    `model_axis`: chips on the model axis of the 2-D strategies (tp, dp_tp, fsdp_tp, ep;
    default the slice's last physical axis). `optimizer`: ``adamw`` or ``adafactor`` (its
    factored state in the step and in the fit check). Above :data:`MAX_TRACE_DEVICES` chips a 2-D
    strategy, or flash attention, is compiled as its per-chip equivalent on that many chips
    (:func:`equivalent_slice`; the ``compiled_as`` column says how). Raises SpecError before
    anything compiles for an unknown slice, strategy or model axis, a batch the data axis does
    not divide, or when no plan can hold even the model's weights and optimizer state.
    """
    family = models.get_model(model)
    checked_flags(libtpu_flags)
    options = dict(options or {})
    if family.batch_shapes(family.config(preset, **options), 1) is not None:
        return _predict_whole(family, preset, slices, strategies, batch_size, options,
                              libtpu_flags, pool, timeout, on_progress)
    if recompute:
        options["remat"] = True
    if attention is not None:
        options["attn_implementation"] = attention
    dtype = dtype or family.planning_dtype
    base = step_options(family, preset, seq_len, dtype, options)
    cfg = family.config(preset, **base)
    shape = family.block_shape(cfg)
    layers = shape.layers
    whole = layers <= BLOCKS[-1] if whole is None else bool(whole)
    plans = []
    for name in slices:
        sl = get_slice(name)
        for strategy in strategies:
            strategy = sharding.strategy_name(strategy)
            mesh = sharding.slice_mesh(sl, strategy, model_axis)
            ways = sharding.batch_ways(strategy, mesh)
            if not isinstance(batch_size, int) or batch_size <= 0 or batch_size % ways:
                raise SpecError(f"batch_size={batch_size!r} does not split over {ways} data "
                                f"shards ({strategy} on {sl.name}, mesh "
                                f"{'x'.join(map(str, mesh))}): use a multiple of {ways}")
            axis = mesh[1] if len(mesh) == 2 else None
            where, batch = sl.name, batch_size
            if sl.chips > MAX_TRACE_DEVICES and (axis or attention == "flash"):
                # Too large to trace as it is: the per-chip equivalent on fewer chips, with
                # the same model axis.
                where, batch = equivalent_slice(sl.name, batch_size)
                if axis and MAX_TRACE_DEVICES % axis:
                    raise SpecError(f"model_axis={axis} on {sl.name}: the per-chip equivalent "
                                    f"on {MAX_TRACE_DEVICES} chips needs a model axis that "
                                    f"divides {MAX_TRACE_DEVICES}")
            for n in ([None] if whole else BLOCKS):  # every compile checked before any runs
                step_plan(model, preset, where, strategy, seq_len, batch, dtype, n,
                          _compile_options(base), libtpu_flags, axis, optimizer)
            plans.append((sl, strategy, mesh, where, batch))
    fit = _fit(family, preset, base, [s.name for s, *_ in plans], strategies, batch_size,
               seq_len, dtype, recompute, attention == "flash",
               model_axis, optimizer).set_index(["slice", "strategy"])
    state = fit["params_gb"] + fit["grads_gb"] + fit["optimizer_gb"]
    if (state > fit["usable_gb"]).all():
        raise SpecError(f"no plan fits, nothing to predict: the weights, gradients and "
                        f"{optimizer} state alone exceed a chip's usable HBM: " + "; ".join(
                            f"{s} {t}: {g:.1f} GB > {u:.1f} GB" for (s, t), g, u in
                            zip(fit.index, state, fit["usable_gb"], strict=True)))
    per_block = {(sl.name, strategy): _block_activation_bytes(
        shape, sl, strategy, mesh, batch_size, seq_len, dtype, recompute, attention == "flash")
        for sl, strategy, mesh, *_ in plans}
    common = {"block_activation_bytes": per_block,
              "model": model, "preset": preset, "batch_size": batch_size, "seq_len": seq_len,
              "dtype": dtype, "recompute": recompute, "attention": attention or "eager",
              "layers": layers, "method": "whole" if whole else "blocks",
              "model_flops": family.flops_per_step(cfg, batch_size),
              "libtpu_flags": " ".join(libtpu_flags), "optimizer": optimizer}
    rows = [_predict_plan(plan, fit, state, whole, layers, base, pool, timeout, on_progress,
                          common) for plan in plans]
    return _frame(rows, plans[0][0].chip)


def _predict_plan(plan: tuple, fit: pd.DataFrame, state: pd.Series, whole: bool, layers: int,
                  options: dict[str, Any], pool: WorkerPool | None, timeout: float,
                  on_progress: Callable[[str], None] | None,
                  common: dict[str, Any]) -> dict[str, Any]:
    """One row of :func:`predict`: the compiler's memory and verdict, and the prediction."""
    sl, strategy, mesh, where, batch = plan
    key = (sl.name, strategy)
    widen_to = (sl, mesh) if where != sl.name else None
    axis = mesh[1] if len(mesh) == 2 else None
    row = {"slice": sl.name, "chip": sl.chip, "chips": sl.chips, "strategy": strategy,
           "mesh": "x".join(map(str, mesh)), "topology": "x".join(map(str, sl.topology)),
           **{k: v for k, v in common.items() if k != "block_activation_bytes"},
           "estimated_memory_gb": float(fit.loc[key, "per_device_gb"]),
           "executions": 0}
    if state[key] > fit.loc[key, "usable_gb"]:
        return {**row, "fits": False, "reason": "weights, gradients and optimizer state alone: "
                f"{state[key]:.1f} GB > {fit.loc[key, 'usable_gb']:.1f} GB usable"}
    started = time.perf_counter()

    def compiled(global_batch: int) -> list[TPUCompile]:
        return [tpu_compile(common["model"], common["preset"], where, strategy,
                            common["seq_len"], global_batch, common["dtype"], layers=n,
                            options=_compile_options(options),
                            libtpu_flags=tuple(common["libtpu_flags"].split()), pool=pool,
                            timeout=timeout, on_progress=on_progress, model_axis=axis,
                            optimizer=common["optimizer"])
                for n in ([None] if whole else BLOCKS)]

    def by_blocks(programs: list[TPUCompile]) -> tuple[dict[str, float], list[dict]]:
        totals = [_program_totals(p, sl.chip, widen_to) for p in programs]
        return (totals[0] if whole else steptime.extrapolate(
            totals[0], totals[1], layers, first=BLOCKS[0])), totals

    ways = sharding.batch_ways(strategy, sharding.slice_mesh(get_slice(where), strategy, axis))
    refused = ""
    try:
        found = compiled(batch)
        total, totals = by_blocks(found)
    except DoesNotFit as exc:
        # The compiler cannot place the batch in HBM (published runs offload activations to
        # the host, which is not modelled). The time still follows the batch: every
        # sequence of a data shard adds the same compute, the weights' collectives do not
        # grow. Compiled at 1 and 2 sequences per data shard, extrapolated to the batch.
        if batch // ways <= 2:
            return {**row, "fits": False, "reason": str(exc),
                    "predict_s": time.perf_counter() - started}
        refused = (f"{exc}; the step time is extrapolated from 1 and 2 sequences per data "
                   "shard")
        try:
            one, _ = by_blocks(compiled(ways))
            found = compiled(2 * ways)
            two, totals = by_blocks(found)
        except DoesNotFit as again:
            return {**row, "fits": False, "reason": str(again),
                    "predict_s": time.perf_counter() - started}
        total = steptime.extrapolate(one, two, batch // ways, first=1)
    # The weights, moments and batch grow by the same bytes with every block (extrapolated
    # exactly); the temporaries do not: the compiler packs and prefetches them differently
    # for two and three blocks (v6e-8: 17.4 then 16.3 GB). Theirs for the larger compile
    # counts, plus what each further block keeps for the backward pass by the convention.
    memory = total["mem:arguments"] + total["mem:outputs"] - total["mem:aliased"]
    if whole:
        memory += total["mem:temp"]
    else:
        memory += max(t["mem:temp"] for t in totals) \
            + (layers - BLOCKS[-1]) * common["block_activation_bytes"][(sl.name, strategy)]
    if refused:  # the compiler's verdict stands; no figure of ours replaces it
        memory = math.nan
    compiled_as = ""
    if widen_to is not None:
        # Where the weights and Adam moments are split over the data axis too (fsdp,
        # fsdp_tp, ep), the slice's shards are smaller than the equivalent's by the ratio of
        # their splits (the analytic state of the fit check, which the compiler's arguments
        # match).
        small_mesh = found[0].mesh
        ratio = (sharding.parameter_shards(strategy, mesh)
                 / sharding.parameter_shards(strategy, small_mesh))
        shards = (fit.loc[key, "params_gb"] + fit.loc[key, "optimizer_gb"]) * 1e9
        memory -= shards * (ratio - 1)
        per_chip = batch // sharding.batch_ways(strategy, small_mesh)
        compiled_as = (f"{where} on mesh {'x'.join(map(str, small_mesh))} at batch {batch} "
                       f"(the same {per_chip} sequences per data shard), collectives over "
                       f"every chip or the data axis re-timed on {sl.name}'s "
                       f"{sl.topology_text} torus"
                       + (", weight and Adam shards rescaled" if ratio != 1 else ""))
    hbm = usable_hbm_bytes(sl.chip)
    row.update(steptime.predict_step(total, sl.chip, sl.chips, common["model_flops"],
                                     MXU_EFFICIENCY))
    how = "" if whole else f"extrapolated from {BLOCKS[0]} and {BLOCKS[1]} blocks, "
    if refused:
        how += "from 1 and 2 sequences per data shard, "
    fits = memory <= hbm and not refused
    row.update(compiler_memory_gb=memory / 1e9, fits=fits,
               reason=refused if refused else "" if fits else f"the compiler's buffers ({how}"
               f"{memory / 1e9:.1f} GB) exceed the {hbm / 1e9:.1f} GB of HBM a program may use "
               f"on a {sl.chip} chip",
               estimate_error=row["estimated_memory_gb"] / (memory / 1e9) - 1,
               collectives=_kinds(found[-1].collectives),
               libtpu=found[0].compiled["libtpu"], compiled_for=found[0].compiled["topology"],
               compiled_as=compiled_as,
               compile_s=sum(p.compiled["compile_s"] for p in found),
               predict_s=time.perf_counter() - started)
    return row


def _predict_whole(family: Any, preset: str, slices: Sequence[str], strategies: Sequence[str],
                   batch_size: int, options: dict[str, Any], libtpu_flags: Sequence[str],
                   pool: WorkerPool | None, timeout: float,
                   on_progress: Callable[[str], None] | None) -> pd.DataFrame:
    """:func:`predict` for a model that is no transformer (dlrm: embedding lookups, their
    collectives, MLPs): the whole step compiled per slice and strategy, timed the same way
    (memory: the compiler's; no analytic estimate beside it)."""
    plans = [(get_slice(s), sharding.strategy_name(t)) for s in slices for t in strategies]
    for sl, strategy in plans:  # every compile checked before any runs
        step_plan(family.name, preset, sl.name, strategy, 0, batch_size, None, None, options,
                  libtpu_flags)
    cfg = family.config(preset, **options)
    rows = []
    for sl, strategy in plans:
        started = time.perf_counter()
        row = {"slice": sl.name, "chip": sl.chip, "chips": sl.chips, "strategy": strategy,
               "mesh": "x".join(map(str, sharding.slice_mesh(sl, strategy))),
               "topology": sl.topology_text, "model": family.name, "preset": preset,
               "batch_size": batch_size, "method": "whole", "executions": 0}
        try:
            program = tpu_compile(family.name, preset, sl.name, strategy,
                                  batch_size=batch_size, options=options,
                                  libtpu_flags=tuple(libtpu_flags), pool=pool,
                                  timeout=timeout, on_progress=on_progress)
        except DoesNotFit as exc:
            rows.append({**row, "fits": False, "reason": str(exc),
                         "predict_s": time.perf_counter() - started})
            continue
        total = _program_totals(program, sl.chip)
        row.update(steptime.predict_step(total, sl.chip, sl.chips,
                                         family.flops_per_step(cfg, batch_size),
                                         MXU_EFFICIENCY))
        memory = sum(total[f"mem:{k}"] for k in ("arguments", "outputs", "temp")) \
            - total["mem:aliased"]
        rows.append({**row, "compiler_memory_gb": memory / 1e9, "fits": True, "reason": "",
                     "collectives": _kinds(program.collectives),
                     "libtpu": program.compiled["libtpu"],
                     "compiled_for": program.compiled["topology"], "compiled_as": "",
                     "compile_s": program.compiled["compile_s"],
                     "predict_s": time.perf_counter() - started})
    return _frame(rows, plans[0][0].chip)


def _frame(rows: list[dict[str, Any]], chip: str) -> pd.DataFrame:
    """The rows of a prediction with every documented column, and its assumptions."""
    frame = pd.DataFrame(rows)
    for col in [*steptime.PREDICTION_COLUMNS, *COMPILED_COLUMNS]:
        if col not in frame:
            frame[col] = math.nan
    frame.attrs["assumptions"] = assumptions(chip)
    return frame


def _compile_options(options: dict[str, Any]) -> dict[str, Any]:
    """The model options of a plan without the step's own (length and dtype: tpu_compile sets
    them from seq_len and dtype)."""
    return {k: v for k, v in options.items() if k not in ("length", "dtype")}


def _block_activation_bytes(shape: Any, sl: Any, strategy: str, mesh: tuple[int, ...],
                            batch_size: int, seq_len: int, dtype: str, recompute: bool,
                            flash: bool) -> float:
    """What one more block keeps for the backward pass on one chip, by the convention
    (:func:`tpu_workbench.sharding.activation_bytes`)."""
    tp = sharding.parameter_shards("tp", mesh) if strategy in sharding.TP_STRATEGIES else 1
    local = batch_size // sharding.batch_ways(strategy, mesh)
    one, two = (sharding.activation_bytes(dataclasses.replace(shape, layers=n), local, seq_len,
                                          tp, dtype, recompute, flash) for n in (1, 2))
    return two - one


def _kinds(collectives: pd.DataFrame) -> str:
    """``"12 all-gather (12 async), 2 reduce-scatter"``: what the compiler scheduled."""
    if not len(collectives):
        return "none"
    parts = []
    for kind, group in collectives.groupby("kind", sort=False):
        hidden = int(group["is_async"].sum())
        parts.append(f"{len(group)} {kind}" + (f" ({hidden} async)" if hidden else ""))
    return ", ".join(parts)


def assumptions(chip: str) -> list[str]:
    """What every prediction assumes, one sentence each (listed under every chart)."""
    c = get_chip(chip)
    return [
        "Predicted, not measured: the step compiled for the slice by libtpu (the TPU's own "
        "compiler: its fusions, layouts, collectives and buffer assignment), never run.",
        f"Per op: max(FLOPs / ({MXU_EFFICIENCY:g} x {c.bf16_tflops:g} TFLOP/s), bytes / "
        f"{c.hbm_gbps:g} GB/s), FLOPs and bytes from XLA's cost analysis of each "
        f"compiled op. {MXU_EFFICIENCY:g}: {MXU_EFFICIENCY_SOURCE}.",
        "Collectives as compiled, timed on the slice's torus: " + ici_assumptions(c.name),
        "Step = compute + HBM + the collectives the program waits on + what of its "
        "asynchronous collectives the compute cannot hide; the range is perfect overlap to "
        "none. MFU: the model's FLOPs per step over the bf16 peak of every chip of the slice.",
        f"Large models: {BLOCKS[0]} and {BLOCKS[1]} blocks compiled at full width for the slice, "
        "the difference "
        "(time and memory) scaled to the model's blocks (embeddings and head once).",
        f"Above {MAX_TRACE_DEVICES} chips, flash attention or a 2-D strategy: the per-chip "
        f"equivalent is compiled, {MAX_TRACE_DEVICES} chips with the same model axis and "
        "the same batch per data shard (the same program on each chip); collectives over "
        "every chip or along the data axis are re-timed on the whole slice, and weight and "
        "optimizer shards split over the data axis rescaled to it (the optimizer update is still "
        "timed on the larger shard: a few ms).",
        "A batch the compiler cannot place in HBM (published runs offload activations to "
        "the host, which is not modelled): compiled at 1 and 2 sequences per data shard "
        "and the time extrapolated linearly to the batch (the collectives as scheduled for "
        "the small batch); the row says it does not fit.",
        "Memory per chip: the compiler's arguments + outputs - aliased + temporaries "
        "(mixed precision: fp32 weights and optimizer state, bf16 compute; the optimizer is "
        "each row's: AdamW's two moments per weight, or Adafactor's factored second moment, a "
        "row and a column per matrix); by blocks, the "
        "temporaries of the larger compile plus, per further block, the activations it keeps "
        "by the convention (the compiler packs a few blocks' temporaries unlike many).",
    ]


def _fit(family: Any, preset: str, options: dict[str, Any], slices: Sequence[str],
         strategies: Sequence[str], batch_size: int, seq_len: int, dtype: str,
         recompute: bool, flash: bool = False, model_axis: int | None = None,
         optimizer: str = "adamw") -> pd.DataFrame:
    """The fit check in the one memory convention (:data:`tpu_workbench.sharding.CONVENTION`),
    for the model as configured for the plan (`options`: its sequence length, dtype)."""
    n_params = models.count_params(family.name, preset, options)
    return sharding.fit_table(family.block_shape(family.config(preset, **options)), n_params,
                              batch_size, seq_len, slices=list(dict.fromkeys(slices)),
                              strategies=[sharding.strategy_name(s) for s in strategies],
                              dtype=dtype, recompute=recompute, flash=flash,
                              model_axis=model_axis, optimizer=optimizer).assign(params=n_params)


def fit_check(model: str, preset: str, slices: Sequence[str] = ("v6e-16",),
              strategies: Sequence[str] = ("fsdp",), seq_len: int = 2048, batch_size: int = 32,
              dtype: str | None = None, recompute: bool = False,
              options: dict[str, Any] | None = None, optimizer: str = "adamw",
              attention: str | None = None) -> pd.DataFrame:
    """The analytic fit check :func:`predict` shows beside the compiler's memory
    (:func:`tpu_workbench.sharding.fit_table` in the plan's dtype, for its `optimizer` and
    `attention`: ``"flash"`` keeps no S x S scores), on its own: instant, nothing compiles."""
    family = models.get_model(model)
    dtype = dtype or family.planning_dtype
    base = step_options(family, preset, seq_len, dtype, options or {})
    for name in slices:
        get_slice(name)
    return _fit(family, preset, base, slices, strategies, batch_size, seq_len, dtype, recompute,
                flash=attention == "flash", optimizer=optimizer)
