"""The numerical check of every kernel against its PyTorch reference on random inputs.

``python -m kernels.check`` prints the table (TPU interpret mode on CPU; a few minutes at most
with the default cases). Relative error is max |kernel - reference| / max |reference|, both
given the same inputs in the same dtype; the reference computes in float32 and rounds to that
dtype once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import pandas as pd
import torch

from . import torch_bridge
from ._common import relative_error
from .flash_attention import attention_reference
from .rmsnorm import rmsnorm_reference

# Measured on CPU in interpret mode (see the report in the notebook): f32 <= 4e-7, bf16 <= 4e-3
# (attention's probabilities are rounded to bf16 before the PV matmul, as on the MXU).
TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# (shape of x, block_rows): 37 and 5*7 rows are not multiples of the block.
RMSNORM_CASES = [((64, 256), 16), ((37, 96), 16), ((5, 7, 130), 32)]
# ((batch, heads, q_len, head_dim), kv_len, causal, block_q, block_k)
# Exact multiples; ragged causal with two kv blocks (one step skipped); ragged cross-attention
# with q_len != kv_len and head_dim > 128.
ATTENTION_CASES = [((1, 2, 128, 64), 128, True, 32, 128),
                   ((1, 1, 200, 32), 200, True, 64, 128),
                   ((2, 1, 72, 256), 200, False, 32, 128)]

COLUMNS = ["kernel", "dtype", "shape", "causal", "blocks", "rel_error", "tolerance", "ok",
           "seconds"]


def _randn(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype)


def check_rmsnorm(cases: Iterable[tuple[tuple[int, ...], int]] = RMSNORM_CASES,
                  dtypes: Iterable[str] = ("float32", "bfloat16"), seed: int = 0) -> pd.DataFrame:
    """One row per (case, dtype): the kernel's relative error against `rmsnorm_reference`."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for dtype in dtypes:
        for shape, block_rows in cases:
            x = _randn(shape, DTYPES[dtype], gen)
            w = _randn((shape[-1],), DTYPES[dtype], gen)
            t0 = time.perf_counter()
            y = torch_bridge.rmsnorm(x, w, block_rows=block_rows)
            err = relative_error(y, rmsnorm_reference(x, w))
            rows.append(["rmsnorm", dtype, str(tuple(shape)), False, f"block_rows={block_rows}",
                         err, TOLERANCE[dtype], err <= TOLERANCE[dtype],
                         time.perf_counter() - t0])
    return pd.DataFrame(rows, columns=COLUMNS)


def check_attention(cases: Iterable[tuple] = ATTENTION_CASES,
                    dtypes: Iterable[str] = ("float32", "bfloat16"),
                    seed: int = 0) -> pd.DataFrame:
    """One row per (case, dtype): the kernel's relative error against `attention_reference`.
    A case is ((batch, heads, q_len, head_dim), kv_len, causal, block_q, block_k)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for dtype in dtypes:
        for (b, h, q_len, d), kv_len, causal, block_q, block_k in cases:
            q = _randn((b, h, q_len, d), DTYPES[dtype], gen)
            k, v = (_randn((b, h, kv_len, d), DTYPES[dtype], gen) for _ in range(2))
            t0 = time.perf_counter()
            out = torch_bridge.flash_attention(q, k, v, causal=causal, block_q=block_q,
                                               block_k=block_k)
            err = relative_error(out, attention_reference(q, k, v, causal))
            rows.append(["flash_attention", dtype, f"q {(b, h, q_len, d)}, kv_len {kv_len}",
                         causal, f"block_q={block_q}, block_k={block_k}", err, TOLERANCE[dtype],
                         err <= TOLERANCE[dtype], time.perf_counter() - t0])
    return pd.DataFrame(rows, columns=COLUMNS)


# (q_len, block_q, block_k, causal, dtype, heads, head_dim, seed) -> check_shape's result
_SHAPE_CHECKS: dict[tuple, dict] = {}


def check_shape(q_len: int, block_q: int, block_k: int, causal: bool, dtype: str,
                heads: int = 4, head_dim: int = 32, seed: int = 0,
                reuse: bool = True) -> dict:
    """The attention kernel on one shape, random q/k/v (1, heads, q_len, head_dim) of `dtype`
    (self-attention: kv_len = q_len), against :func:`attention_reference`: ``shape``,
    ``rel_error``, ``tolerance``, ``ok`` and the seconds of the first call (which traces the
    interpret-mode simulation), of a second call (``interpret_s``) and of the reference.
    Kept per shape in this process: ``reuse=True`` returns a shape checked before at once
    (:func:`shape_checked` says whether there is one), ``reuse=False`` measures it again."""
    key = (q_len, block_q, block_k, causal, dtype, heads, head_dim, seed)
    if reuse and key in _SHAPE_CHECKS:
        return _SHAPE_CHECKS[key]
    gen = torch.Generator().manual_seed(seed)
    shape = (1, heads, q_len, head_dim)
    q, k, v = (_randn(shape, DTYPES[dtype], gen) for _ in range(3))
    seconds = []
    for _ in range(2):
        t0 = time.perf_counter()
        out = torch_bridge.flash_attention(q, k, v, causal=causal, block_q=block_q,
                                           block_k=block_k)
        seconds.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    ref = attention_reference(q, k, v, causal)
    reference_s = time.perf_counter() - t0
    err = relative_error(out, ref)
    result = {"shape": shape, "rel_error": err, "tolerance": TOLERANCE[dtype],
              "ok": err <= TOLERANCE[dtype], "first_s": seconds[0], "interpret_s": seconds[1],
              "reference_s": reference_s}
    _SHAPE_CHECKS[key] = result
    return result


def shape_checked(q_len: int, block_q: int, block_k: int, causal: bool, dtype: str,
                  heads: int = 4, head_dim: int = 32, seed: int = 0) -> bool:
    """Whether :func:`check_shape` of these arguments ran in this process already."""
    return (q_len, block_q, block_k, causal, dtype, heads, head_dim, seed) in _SHAPE_CHECKS


def main() -> None:
    """Print the check of both kernels over the default cases."""
    table = pd.concat([check_rmsnorm(), check_attention()], ignore_index=True)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2e}"))
    if not table["ok"].all():
        raise SystemExit(1)


if __name__ == "__main__":
    main()
