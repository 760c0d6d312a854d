"""Fused RMSNorm as a Pallas TPU kernel: ``y = x * rsqrt(mean(x**2, -1) + eps) * weight``.

One grid step normalises ``block_rows`` whole rows: the (block_rows, dim) tile of `x` and the
weight row sit in VMEM, the mean of squares, the scaling and the weight multiply happen there in
float32, and only `y` goes back to HBM (XLA unfused would read `x` twice). Rows are the flattened
leading dimensions; the row count is padded up to a multiple of `block_rows` and the padding
sliced off again, so any number of rows works.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ._common import as_dtype, check_block, interpret_mode, round_up, sublane_multiple

DEFAULT_BLOCK_ROWS = 256


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Plain PyTorch RMSNorm over the last dim, computed in float32, returned in ``x.dtype``."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


def check_rmsnorm_blocks(shape: tuple[int, ...], dtype: Any, block_rows: int) -> None:
    """Raise ValueError (before any tracing) if `block_rows` breaks the TPU tiling rules.

    The tile is (block_rows, dim): dim is the whole last axis (always allowed), block_rows is
    the second-to-last axis, so it must be a multiple of 8 rows (16 for bf16, packed two per
    32-bit word).
    """
    if len(shape) < 1 or any(n <= 0 for n in shape):
        raise ValueError(f"rmsnorm: x must have a non-empty last dim, got shape {tuple(shape)}")
    m = sublane_multiple(dtype)
    check_block("rmsnorm", "block_rows", block_rows, m,
                f"the second-to-last dim of a TPU tile of {as_dtype(dtype).name}")


def _kernel(x_ref, w_ref, o_ref, *, eps: float) -> None:
    import jax
    import jax.numpy as jnp

    x = x_ref[...].astype(jnp.float32)  # (block_rows, dim), in VMEM
    inv = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    o_ref[...] = (x * inv * w_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


@functools.cache
def rmsnorm_call(rows: int, dim: int, dtype: str, block_rows: int, eps: float,
                 interpret: bool, debug: bool = False) -> Callable:
    """The bare ``pallas_call`` on padded inputs ``x (rows, dim)``, ``w (1, dim)``; `rows` must
    be a multiple of `block_rows`. Nothing else is in it, so torch_xla can take its Mosaic
    payload as one custom call. `debug` prints the kernel's jaxpr and Mosaic MLIR on lowering."""
    import jax
    from jax.experimental import pallas as pl

    if rows % block_rows:
        raise ValueError(f"rmsnorm_call: rows={rows} is not a multiple of block_rows={block_rows}")
    return pl.pallas_call(
        functools.partial(_kernel, eps=eps),
        grid=(rows // block_rows,),
        in_specs=[pl.BlockSpec((block_rows, dim), lambda i: (i, 0)),
                  pl.BlockSpec((1, dim), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((block_rows, dim), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, dim), as_dtype(dtype)),
        interpret=interpret_mode(interpret),
        debug=debug,
        name="workbench_rmsnorm",
    )


def rmsnorm(x: Any, weight: Any, *, block_rows: int = DEFAULT_BLOCK_ROWS, eps: float = 1e-6,
            interpret: bool = True) -> Any:
    """RMSNorm of the jax array `x` (..., dim) with `weight` (dim,) through the Pallas kernel.

    Validates `block_rows` first, pads the rows to a multiple of it, runs the kernel (TPU
    interpret mode when `interpret`, else compiled by Mosaic) and slices the padding off.
    """
    import jax.numpy as jnp

    check_rmsnorm_blocks(tuple(x.shape), x.dtype, block_rows)
    dim = x.shape[-1]
    if tuple(weight.shape) != (dim,):
        raise ValueError(f"rmsnorm: weight must have shape ({dim},), got {tuple(weight.shape)}")
    x2 = x.reshape(-1, dim)
    rows = x2.shape[0]
    padded = round_up(rows, block_rows)
    if padded != rows:
        x2 = jnp.pad(x2, ((0, padded - rows), (0, 0)))
    call = rmsnorm_call(padded, dim, as_dtype(x.dtype).name, block_rows, float(eps), interpret)
    y = _jit(call, interpret)(x2, weight.reshape(1, dim).astype(x.dtype))
    return y[:rows].reshape(x.shape)


@functools.cache
def _jit(call: Callable, interpret: bool) -> Callable:
    import jax

    from ._common import jit_for_interpret

    return jit_for_interpret(call) if interpret else jax.jit(call)
