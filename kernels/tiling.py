"""The block schedule of the kernels as DataFrames: which rows of each operand sit in VMEM at
each grid step, computed from the same block sizes and index logic the kernels use (the
pictures in ``notebooks/pallas_kernels.py`` are drawn from these frames)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ._common import LANES, round_up, sublane_multiple
from .flash_attention import check_attention_blocks, kv_block_index, kv_runs
from .rmsnorm import check_rmsnorm_blocks

SCHEDULE_COLUMNS = ["step", "q_block", "kv_block", "computes", "operand", "axis", "block",
                    "row_start", "row_end", "valid_end", "fetched"]


def attention_schedule(q_len: int, kv_len: int, block_q: int, block_k: int, causal: bool,
                       head_dim: int = 64, dtype: str = "float32") -> pd.DataFrame:
    """One row per (grid step, operand) of the flash-attention kernel for one (batch, head).

    Columns: ``step`` (grid order, kv innermost), ``q_block`` i, ``kv_block`` j,
    ``computes`` (False: a causal step above the diagonal, skipped), ``operand`` (Q, K, V, O),
    ``axis`` ("query rows" / "key rows"), ``block`` (the block index the pipeline holds: for
    K/V on a skipped step that is block 0, prefetched for the next q block), ``row_start`` /
    ``row_end`` (rows of the padded operand in VMEM), ``valid_end`` (min(row_end, true length):
    rows beyond it are padding) and ``fetched`` (True when this step's block differs from the
    previous step's, i.e. the pipeline copies it from HBM; O is written back when i changes).
    Raises ValueError for blocks the kernel would refuse, before anything else.
    """
    check_attention_blocks((1, q_len, head_dim), (1, kv_len, head_dim), dtype, block_q, block_k)
    nq, nk = round_up(q_len, block_q) // block_q, round_up(kv_len, block_k) // block_k
    i, j = (a.ravel() for a in np.meshgrid(np.arange(nq), np.arange(nk), indexing="ij"))
    runs = np.asarray(kv_runs(i, j, block_q, block_k, causal)) & np.ones_like(i, dtype=bool)
    kv_block = np.asarray(kv_block_index(i, j, block_q, block_k, causal, np.where))
    step = np.arange(len(i))
    frames = []
    for operand, blocks, size, length, axis in (
        ("Q", i, block_q, q_len, "query rows"),
        ("K", kv_block, block_k, kv_len, "key rows"),
        ("V", kv_block, block_k, kv_len, "key rows"),
        ("O", i, block_q, q_len, "query rows"),
    ):
        start = blocks * size
        fetched = np.r_[True, blocks[1:] != blocks[:-1]]
        frames.append(pd.DataFrame({
            "step": step, "q_block": i, "kv_block": j, "computes": runs, "operand": operand,
            "axis": axis, "block": blocks, "row_start": start, "row_end": start + size,
            "valid_end": np.minimum(start + size, length), "fetched": fetched}))
    out = pd.concat(frames, ignore_index=True)
    order = out["operand"].map({"Q": 0, "K": 1, "V": 2, "O": 3})
    return out.assign(_o=order).sort_values(["step", "_o"], ignore_index=True).drop(columns="_o")


def score_tiles(q_len: int, kv_len: int, block_q: int, block_k: int,
                causal: bool) -> pd.DataFrame:
    """One row per (q block, kv block) tile of the score matrix S = Q K^T: ``q_block``,
    ``kv_block``, ``step``, ``q_start``/``q_end``, ``k_start``/``k_end`` and ``status``:
    "computed", "computed, partly masked" (causal diagonal or padded keys), "skipped"."""
    sched = attention_schedule(q_len, kv_len, block_q, block_k, causal)
    tiles = sched[sched["operand"] == "Q"][["step", "q_block", "kv_block", "computes"]].copy()
    tiles["q_start"] = tiles["q_block"] * block_q
    tiles["q_end"] = np.minimum(tiles["q_start"] + block_q, q_len)
    tiles["k_start"] = tiles["kv_block"] * block_k
    tiles["k_end"] = np.minimum(tiles["k_start"] + block_k, kv_len)
    partly = (tiles["k_start"] + block_k > kv_len)
    if causal:
        partly |= tiles["k_start"] + block_k - 1 > tiles["q_start"]
    tiles["status"] = np.where(~tiles["computes"], "skipped",
                               np.where(partly, "computed, partly masked", "computed"))
    return tiles.drop(columns="computes").reset_index(drop=True)


def rmsnorm_schedule(rows: int, dim: int, block_rows: int,
                     dtype: str = "float32") -> pd.DataFrame:
    """One row per grid step of the RMSNorm kernel: ``step``, ``row_start``, ``row_end``,
    ``valid_end`` (rows past it are padding) and ``vmem_bytes`` (x and y tiles plus the
    weight row, double-buffered as the pipeline does)."""
    check_rmsnorm_blocks((rows, dim), dtype, block_rows)
    n = round_up(rows, block_rows) // block_rows
    start = np.arange(n) * block_rows
    itemsize = 4 if sublane_multiple(dtype) == 8 else 2
    lanes = round_up(dim, LANES)  # VMEM tiles are padded to whole 128-lane rows
    vmem = 2 * (2 * block_rows + 8) * lanes * itemsize
    return pd.DataFrame({"step": np.arange(n), "row_start": start, "row_end": start + block_rows,
                         "valid_end": np.minimum(start + block_rows, rows), "vmem_bytes": vmem})


def attention_vmem_table(block_q: int, block_k: int, head_dim: int,
                         dtype: str = "float32") -> pd.DataFrame:
    """One row per VMEM buffer the attention kernel holds at each grid step: ``buffer`` (Q,
    K, V, O, m, l, acc), ``holds``, ``rows`` x ``width`` (the block as the kernel declares it),
    ``dtype``, ``copies`` (2 for the Q/K/V/O tiles, which the pipeline double-buffers: one
    computed on, one being copied; 1 for the float32 scratch), ``lanes`` (``width`` padded to
    whole 128-lane rows, as VMEM stores a tile), ``bytes`` (as stored) and ``value_bytes`` (the
    values alone, without the lane padding). m and l are 128 lanes wide by design (one value
    per row, repeated across the lanes), acc is as wide as the head."""
    check_attention_blocks((1, block_q, head_dim), (1, block_k, head_dim), dtype, block_q,
                           block_k)
    itemsize = 4 if sublane_multiple(dtype) == 8 else 2
    rows = [("Q", "query rows", block_q, head_dim, dtype, 2),
            ("K", "key rows", block_k, head_dim, dtype, 2),
            ("V", "value rows", block_k, head_dim, dtype, 2),
            ("O", "output rows", block_q, head_dim, dtype, 2),
            ("m", "running max per query row", block_q, LANES, "float32", 1),
            ("l", "running sum per query row", block_q, LANES, "float32", 1),
            ("acc", "unnormalised output", block_q, head_dim, "float32", 1)]
    frame = pd.DataFrame(rows, columns=["buffer", "holds", "rows", "width", "dtype", "copies"])
    size = np.where(frame["dtype"] == "float32", 4, itemsize)
    frame["lanes"] = [round_up(w, LANES) for w in frame["width"]]
    frame["bytes"] = frame["copies"] * frame["rows"] * frame["lanes"] * size
    frame["value_bytes"] = frame["copies"] * frame["rows"] * frame["width"] * size
    frame["block"] = frame["rows"].astype(str) + " x " + frame["width"].astype(str)
    return frame


def vmem_text(block_q: int, block_k: int, head_dim: int, dtype: str = "float32") -> str:
    """Markdown: the VMEM of one grid step of :func:`attention_vmem_table`, as stored and (where
    lanes are padded) as values alone, saying where the figure comes from."""
    table = attention_vmem_table(block_q, block_k, head_dim, dtype)
    total, values = table["bytes"].sum() / 1024, table["value_bytes"].sum() / 1024
    padding = (f": head_dim {head_dim} is padded to {round_up(head_dim, LANES)} lanes, so the "
               f"values themselves are only {values:,.0f} KiB of it" if values < total else
               "; no buffer needs lane padding")
    return (f"**{total:,.0f} KiB of VMEM per grid step** for block_q {block_q}, block_k "
            f"{block_k}, head_dim {head_dim}, {dtype}, as VMEM stores it{padding}. Counted "
            "from the kernel's own block shapes (`kernels.tiling`), not measured.")


def attention_vmem_bytes(block_q: int, block_k: int, head_dim: int,
                         dtype: str = "float32") -> dict[str, int]:
    """VMEM the attention kernel needs per grid step, by buffer of
    :func:`attention_vmem_table` (bytes as VMEM stores them: lanes padded to 128), with their
    ``total`` and ``values`` (the same buffers without the lane padding)."""
    table = attention_vmem_table(block_q, block_k, head_dim, dtype)
    return {**{b: int(n) for b, n in zip(table["buffer"], table["bytes"], strict=True)},
            "total": int(table["bytes"].sum()), "values": int(table["value_bytes"].sum())}


def step_text(schedule: pd.DataFrame, step: int) -> str:
    """Markdown: what grid step `step` of an :func:`attention_schedule` does (its grid point,
    the rows it holds, whether it computes, what the pipeline copies from HBM for it) and how
    many of the head's steps are skipped."""
    here = schedule[schedule["step"] == step].set_index("operand")
    if here.empty:
        raise ValueError(f"step={step} is not a grid step of this schedule: valid steps are "
                         f"0 to {int(schedule['step'].max())}")
    q, k = here.loc["Q"], here.loc["K"]
    copies = ", ".join(op for op in "QKV" if here.loc[op, "fetched"]) or "nothing"
    queries = schedule[schedule["operand"] == "Q"]
    skipped = int((~queries["computes"]).sum())
    what = ("computes" if q.computes else
            "**skipped**: every key of the block is after every query of the block; K/V "
            f"hold block {k.block}, the one the next q block starts with")
    return (f"Step **{step}** = grid point (q block {q.q_block}, kv block {q.kv_block}): "
            f"Q rows {q.row_start}-{q.row_end - 1}, K/V rows {k.row_start}-{k.row_end - 1} "
            f"({what}). Copied from HBM for this step: {copies}. Of the {len(queries)} grid "
            f"steps of one head, {skipped} are skipped.")
