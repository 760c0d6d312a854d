"""Does a training step fit a slice's HBM? The one memory model of a plan, stated once
(:data:`CONVENTION`): every fit table, ``predict``'s fit check and the notebooks ask it.

Per chip: the training state (weights, gradients, Adam's state: :data:`STATE_BYTES` per
parameter, or Adafactor's, :data:`ADAFACTOR_STATE_BYTES`; split as the strategy splits
parameters), the activations the blocks keep for the backward pass (:func:`activation_bytes`,
from the block's own shape: grouped-query attention, gated MLPs) and the loss's logits
(:func:`logits_bytes`: 128k-256k vocabularies take GBs).
An estimate, instant and analytic: what a compiler allocates differs (temporaries, fusion).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..environment.chips import get_chip, get_slice
from ..errors import SpecError
from .mesh import (
    EMBEDDING_STRATEGIES,
    TP_STRATEGIES,
    batch_ways,
    mesh_text,
    parse_mesh,
    slice_mesh,
    strategy_name,
)

if TYPE_CHECKING:
    import pandas as pd

    from ..models.base import TransformerShape

# Bytes per parameter of what training keeps: (weights, gradients, optimizer state).
STATE_BYTES: dict[str, tuple[int, int, int]] = {
    # fp32 training: fp32 weights and gradients, Adam's two fp32 moments.
    "float32": (4, 4, 8),
    # Mixed precision as ZeRO counts it (Rajbhandari et al. 2020, section 3.1): bf16 weights
    # and gradients, and fp32 master weights with Adam's two fp32 moments, 2 + 2 + 12.
    "bfloat16": (2, 2, 12),
}
# Adafactor's state per parameter (Shazeer & Stern 2018): its second moment factored into one
# value per matrix row and one per column, a few parts in a thousand of a weight's bytes (counted
# as none), and no first moment; mixed precision keeps the fp32 master weights (4 bytes).
ADAFACTOR_STATE_BYTES = {"float32": 0, "bfloat16": 4}
# The optimizers a step can update with: AdamW (two fp32 moments per weight) and Adafactor
# (transformers' implementation at a fixed learning rate, as in torchprime's published runs).
OPTIMIZERS = ("adamw", "adafactor")
# Buffers of logits the loss holds at its peak: the logits and their gradient, in the
# activation dtype. libtpu's buffer assignment for a one-layer Llama-3-8B step on a v6e-8 held
# exactly two bf16 [32, 2048, 128256 / 8] buffers (shared/notes/tpu_compiler_offline.md).
LOGIT_BUFFERS = 2
USABLE_FRACTION = 0.9  # of HBM: the compiler needs room for its own temporaries
DEFAULT_SLICES = ("v6e-8", "v6e-16", "v6e-32")
CONVENTION = (
    "Estimated, not compiled: 16 bytes per parameter (fp32: 4 weights + 4 gradients + 8 Adam; "
    "bf16 mixed precision as ZeRO counts it: 2 + 2 + 12 for fp32 master weights and moments; "
    "Adafactor: no first moment, the second a row and a column per matrix, counted as none: "
    "8 either way), split as the strategy splits parameters (dp: none, fsdp: every chip, tp and "
    "dp_tp: the model axis); activations from each block's shape (grouped-query attention, "
    "gated MLPs; the S x S attention scores unless flash attention); the loss's logits and "
    "their gradient; "
    f"fits within {USABLE_FRACTION:.0%} of HBM.")


def _dtype_bytes(dtype: str) -> int:
    if dtype not in STATE_BYTES:
        raise SpecError(f"dtype must be one of {', '.join(STATE_BYTES)}, got {dtype!r}")
    return 2 if dtype == "bfloat16" else 4


def activation_bytes(shape: TransformerShape, batch_size: int, seq_len: int, tp: int = 1,
                     dtype: str = "bfloat16", recompute: bool = False,
                     flash: bool = False) -> float:
    """Bytes the blocks keep for the backward pass, for `batch_size` sequences of `seq_len`
    tokens on one chip, with tensor parallelism `tp` (no sequence parallelism).

    Per block, in values (Korthikanti et al. 2022's accounting, without dropout, extended to
    grouped-query attention and gated MLPs): the two norms' inputs and the attention's and the
    MLP's inputs, whole on every chip, 4sbh; the queries and attention output, 2s·b·a·d, and
    keys and values, 2s·b·g·d, split by tp; the softmax output a·s²·b (flash attention: its
    float32 log-sum-exp, a·s·b); the MLP's inner activations, 2sbI (GELU: its input and
    output) or 4sbI (gated: gate, up, the activated gate and the product), split by tp. With
    `recompute` (full activation checkpointing) each block keeps its input, sbh, and one block
    at a time is recomputed in full. For GPT-2's shape this is Korthikanti's sbh(10 + 24/t) +
    5as²b/t bytes less the dropout masks: sbh(8 + 24/t) + 2as²b/t."""
    v = _dtype_bytes(dtype)
    s, b, t = seq_len, batch_size, tp
    h, a, g, d, inner = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, \
        shape.intermediate
    whole = 4 * s * b * h * v
    attention = (2 * s * b * a * d + 2 * s * b * g * d) * v / t
    scores = a * s * b * 4 / t if flash else a * s * s * b * v / t
    mlp = (4 if shape.mlp == "gated" else 2) * s * b * inner * v / t
    block = whole + attention + scores + mlp
    if recompute:
        return shape.layers * s * b * h * v + block
    return shape.layers * block


def logits_bytes(shape: TransformerShape, batch_size: int, seq_len: int, tp: int = 1,
                 dtype: str = "bfloat16") -> float:
    """Bytes of the loss's logits at their peak: :data:`LOGIT_BUFFERS` buffers of the
    ``batch_size * seq_len * vocab`` logits in the activation dtype, split by tp (a
    vocab-parallel head)."""
    return LOGIT_BUFFERS * batch_size * seq_len * shape.vocab * _dtype_bytes(dtype) / tp


def parameter_shards(strategy: str, mesh_shape: Sequence[int]) -> int:
    """How many ways a strategy splits the weights, gradients and optimizer state: dp none,
    fsdp over every device, tp and dp_tp over the model axis (as if every weight split; the
    few that stay whole, norms and odd widths, make it a little worse)."""
    strategy = strategy_name(strategy)
    if strategy == "dp":
        return 1
    if strategy in EMBEDDING_STRATEGIES:
        raise SpecError(f"strategy {strategy!r} splits embedding tables only, not every "
                        "parameter alike: its memory per chip is embedding_fit_table's")
    if strategy in ("fsdp", "fsdp_tp", "ep"):  # ep: experts on the model axis, all on data
        return math.prod(mesh_shape)
    if len(mesh_shape) != 2:
        raise SpecError(f"strategy {strategy!r} needs a 2-D mesh (data, model), got "
                        f"{mesh_text(mesh_shape)}")
    return mesh_shape[-1]


def fits(n_params: int, strategy: str, mesh_shape: Sequence[int] | str, chip: str = "v6e",
         dtype: str = "float32", activation_bytes: float = 0.0,
         logits_bytes: float = 0.0, optimizer: str = "adamw") -> dict[str, Any]:
    """Would an `n_params` model's training state, with the given per-chip activations and
    logits, fit each chip's HBM under `strategy` on `mesh_shape` (:data:`CONVENTION`;
    `optimizer` ``adafactor``: :data:`ADAFACTOR_STATE_BYTES` in place of Adam's)?

    Returns ``fits`` (bool), ``per_device_bytes``, ``params_bytes``, ``grads_bytes``,
    ``optimizer_bytes``, ``activation_bytes``, ``logits_bytes``, ``hbm_bytes``,
    ``usable_bytes``, ``shards``, ``devices``, ``strategy``, ``mesh``, ``chip``, ``dtype`` and
    ``reason`` (a sentence)."""
    mesh_shape = parse_mesh(mesh_shape)
    strategy = strategy_name(strategy)
    if not isinstance(n_params, int | float) or isinstance(n_params, bool) or n_params <= 0:
        raise SpecError(f"n_params must be a positive number, got {n_params!r}")
    shards = parameter_shards(strategy, mesh_shape)
    _dtype_bytes(dtype)
    c = get_chip(chip)
    if optimizer not in OPTIMIZERS:
        raise SpecError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    per_param = STATE_BYTES[dtype]
    if optimizer == "adafactor":
        per_param = (*per_param[:2], ADAFACTOR_STATE_BYTES[dtype])
    weights, grads, moments = (n_params * b / shards for b in per_param)
    total = weights + grads + moments + activation_bytes + logits_bytes
    hbm = c.hbm_gb * 1e9
    usable = USABLE_FRACTION * hbm
    ok = total <= usable
    gb = 1e9
    reason = (f"{strategy} on {mesh_text(mesh_shape)} {c.name} splits the {dtype} training state "
              f"{shards} way(s): {total / gb:.2f} GB per chip (weights {weights / gb:.2f} + "
              f"grads {grads / gb:.2f} + {optimizer} {moments / gb:.2f} + activations "
              f"{activation_bytes / gb:.2f} + logits {logits_bytes / gb:.2f}) "
              f"{'fits in' if ok else 'exceeds'} {usable / gb:.1f} GB usable "
              f"({USABLE_FRACTION:.0%} of {c.hbm_gb:g} GB HBM)")
    if not ok and strategy == "dp":
        reason += f"; fsdp would split the state {math.prod(mesh_shape)} ways"
    return {"fits": ok, "per_device_bytes": total, "params_bytes": weights,
            "grads_bytes": grads, "optimizer_bytes": moments,
            "activation_bytes": float(activation_bytes), "logits_bytes": float(logits_bytes),
            "hbm_bytes": hbm, "usable_bytes": usable, "shards": shards,
            "devices": math.prod(mesh_shape), "strategy": strategy, "mesh": list(mesh_shape),
            "chip": c.name, "dtype": dtype, "reason": reason}


def fit_table(shape: TransformerShape, n_params: int, batch_size: int, seq_len: int,
              slices: Sequence[str] = DEFAULT_SLICES,
              strategies: Sequence[str] = ("dp", "fsdp", "tp", "dp_tp"),
              dtype: str = "bfloat16", recompute: bool = False,
              flash: bool = False, model_axis: int | None = None,
              optimizer: str = "adamw") -> pd.DataFrame:
    """Does a transformer of `shape` with `n_params` parameters train on each slice with each
    strategy, at global `batch_size` and `seq_len`? One row per (slice, strategy): ``mesh``,
    per-chip GB of ``params``, ``grads``, ``optimizer``, ``activation`` and ``logits``, the
    total (``per_device_gb``), ``usable_gb``, ``fits`` and why. tp and dp_tp need the model
    axis to divide the heads and KV heads (whole heads per chip): where it does not, or where
    the batch does not split over the data axis, the row says so (``fits`` False).
    `model_axis`: the 2-D strategies' model axis (:func:`slice_mesh`). `optimizer`: ``adamw``
    or ``adafactor`` (:func:`fits`)."""
    import pandas as pd

    rows = []
    for name in slices:
        sl = get_slice(name)
        for strategy in strategies:
            strategy = strategy_name(strategy)
            mesh = slice_mesh(sl, strategy, model_axis)
            t = parameter_shards("tp", mesh) if strategy in TP_STRATEGIES else 1
            ways = batch_ways(strategy, mesh)
            row = {"slice": sl.name, "strategy": strategy, "mesh": mesh_text(mesh)}
            bad = [f"{k}={v}" for k, v in (("heads", shape.heads), ("kv_heads", shape.kv_heads))
                   if v % t]
            if bad or batch_size % ways:
                why = (f"{' and '.join(bad)} not divisible by the model axis {t}" if bad else
                       f"batch {batch_size} does not split {ways} ways")
                rows.append({**row, "fits": False, "reason": why})
                continue
            local = batch_size // ways
            f = fits(n_params, strategy, mesh, sl.chip, dtype,
                     activation_bytes(shape, local, seq_len, t, dtype, recompute, flash),
                     logits_bytes(shape, local, seq_len, t, dtype), optimizer)
            rows.append({**row, "fits": f["fits"],
                         **{k.replace("_bytes", "_gb"): f[k] / 1e9 for k in (
                             "per_device_bytes", "params_bytes", "grads_bytes",
                             "optimizer_bytes", "activation_bytes", "logits_bytes",
                             "usable_bytes")},
                         "reason": f["reason"]})
    return pd.DataFrame(rows)


def model_fit_table(model: str, preset: str, batch_size: int, seq_len: int,
                    dtype: str | None = None, options: dict[str, Any] | None = None,
                    **kwargs: Any) -> pd.DataFrame:
    """:func:`fit_table` for a transformer family's preset, in its planning dtype unless
    `dtype` says: its parameters counted on the meta device, its block shape as the family
    declares it. Other keywords go to fit_table (slices, strategies, recompute, flash)."""
    from .. import models

    family = models.get_model(model)
    shape = family.block_shape(family.config(preset, **(options or {})))
    n = models.count_params(model, preset, options)
    table = fit_table(shape, n, batch_size, seq_len, dtype=dtype or family.planning_dtype,
                      **kwargs)
    return table.assign(model=model, preset=preset, params=n)


EMBEDDING_CONVENTION = (
    "From the GSPMD plan (the model built on the meta device, each parameter's largest "
    "per-device slice, padding included), each slice laid out as a TPU lays out fp32 arrays: "
    "its last two dims padded to tiles of 8 x 128 (a 16-wide column slice takes 128 lanes); "
    "fp32 weights, their gradients and AdamW's two moments (16 bytes per parameter held); "
    f"activations left out (MBs at these batches); fits within {USABLE_FRACTION:.0%} of HBM.")
TPU_TILE = (8, 128)  # an fp32 array's last two dims on a TPU (libtpu's layouts: T(8,128))


def tpu_padded(shard_shape: Sequence[int]) -> int:
    """Elements a TPU allocates for an fp32 array of `shard_shape`: the last dim rounded up to
    128 lanes, the one before it to 8 sublanes (a vector: 128 lanes)."""
    dims = list(shard_shape) or [1]
    dims[-1] = -(-dims[-1] // TPU_TILE[1]) * TPU_TILE[1]
    if len(dims) > 1:
        dims[-2] = -(-dims[-2] // TPU_TILE[0]) * TPU_TILE[0]
    return math.prod(dims)


def embedding_fit_table(model: str, preset: str, slices: Sequence[str] = DEFAULT_SLICES,
                        strategies: Sequence[str] = ("dp", "table", "row", "column"),
                        options: dict[str, Any] | None = None) -> pd.DataFrame:
    """Per-chip training state of a family with embedding tables under each strategy on each
    slice, read from :func:`~tpu_workbench.sharding.plan` on the slice's chips in one axis
    (:data:`EMBEDDING_CONVENTION`). ``table`` plans the family's ``table_wise_options`` (the
    tables stacked) where its own tables cannot be split whole. Columns: ``slice``,
    ``strategy``, ``mesh``, ``options``, ``tables_gb`` (the largest per-chip slices of the
    table parameters, in a TPU's layout: :func:`tpu_padded`), ``dense_gb``, ``params_gb``,
    ``state_gb`` (weights, grads, AdamW), ``usable_gb``, ``fits``, ``reason``."""
    import pandas as pd

    from .. import models
    from .strategies import plan, validate

    family = models.get_model(model)
    tables = family.embedding_tables(family.config(preset, **(options or {})))
    rows = []
    for name in slices:
        sl = get_slice(name)
        mesh = (sl.chips,)
        usable = USABLE_FRACTION * get_chip(sl.chip).hbm_gb
        for strategy in strategies:
            strategy = strategy_name(strategy)
            opts = dict(options or {})
            if strategy == "table" and tables and any("table" not in t.axes for t in tables):
                opts.update(getattr(family, "table_wise_options", {}))
            row = {"slice": sl.name, "strategy": strategy, "mesh": mesh_text(mesh),
                   "options": opts}
            cfg = family.config(preset, **opts)
            try:
                validate(mesh, strategy, family, cfg, sl.chips)
            except SpecError as e:
                rows.append({**row, "fits": False, "reason": str(e)})
                continue
            frame = plan(model, preset, mesh, strategy, opts)
            names = {t.param for t in family.embedding_tables(cfg) or []}
            is_table = frame["tensor"].isin(names)
            per = frame["shard_shape"].map(tpu_padded) * 4  # fp32, as a TPU lays it out
            weights = float(per.sum())
            state = weights * sum(STATE_BYTES["float32"]) / STATE_BYTES["float32"][0]
            ok = state / 1e9 <= usable
            rows.append({**row, "tables_gb": float(per[is_table].sum()) / 1e9,
                         "dense_gb": float(per[~is_table].sum()) / 1e9,
                         "params_gb": weights / 1e9, "state_gb": state / 1e9,
                         "usable_gb": usable, "fits": ok,
                         "reason": f"{strategy} on {sl.name}: {state / 1e9:.1f} GB of training "
                                   f"state per chip {'fits in' if ok else 'exceeds'} "
                                   f"{usable:.1f} GB usable"})
    return pd.DataFrame(rows)


__all__ = ["CONVENTION", "DEFAULT_SLICES", "EMBEDDING_CONVENTION", "LOGIT_BUFFERS",
           "STATE_BYTES", "TPU_TILE", "embedding_fit_table", "tpu_padded",
           "activation_bytes", "fit_table", "fits", "logits_bytes", "model_fit_table",
           "parameter_shards"]
