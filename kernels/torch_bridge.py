"""Calling the Pallas kernels from PyTorch.

* Plain PyTorch CPU tensors: converted to jax arrays (bf16 through float32, exactly), run in
  Pallas' TPU interpret mode, converted back. Slow (about 10-20 ms per grid step), so at most
  ``MAX_INTERPRET_STEPS`` grid steps per call; it exists to check numerics, not to be fast.
* torch_xla tensors on a TPU: ``torch_xla.experimental.custom_kernel.make_kernel_from_pallas``
  lowers the bare ``pallas_call`` to its Mosaic payload and inserts it into the lazy graph as a
  ``tpu_custom_call``; padding and slicing happen in torch, so they are ordinary XLA ops.
  (Not verified here: no TPU in this project.)
* torch_xla tensors on XLA:CPU, or CUDA tensors: ValueError (a Mosaic kernel runs only on a TPU).

Attention is differentiable: the forward runs the kernel, the backward recomputes the reference
math with autograd (no backward kernel; the memory saving of flash attention is forward-only).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ._common import as_dtype, round_up, sublane_multiple
from .flash_attention import (
    DEFAULT_BLOCK_K,
    DEFAULT_BLOCK_Q,
    attention_reference,
    check_attention_blocks,
    flash_attention_call,
)
from .rmsnorm import DEFAULT_BLOCK_ROWS, check_rmsnorm_blocks, rmsnorm_call

MAX_INTERPRET_STEPS = 4096


def where_kernels_run(t: torch.Tensor) -> str:
    """"interpret" (plain CPU tensor), "tpu" (torch_xla tensor on a TPU); ValueError otherwise."""
    if t.device.type == "cpu":
        return "interpret"
    kind = _xla_device_kind() if t.device.type == "xla" else t.device.type.upper()
    if kind == "TPU":
        return "tpu"
    raise ValueError(f"Pallas TPU kernels (e.g. minGPT's attention='pallas') run compiled only "
                     f"on a TPU, and this tensor is on {t.device} ({kind}). Valid: a torch_xla "
                     f"tensor on a TPU, a plain-PyTorch CPU tensor (TPU interpret mode: slow, "
                     f"small shapes), or minGPT's attention='xla' (XLA's own attention)")


def _xla_device_kind() -> str:
    """torch_xla's device type: "TPU", "CPU", ..."""
    import torch_xla.runtime as xr

    return xr.device_type()


def to_jax(t: torch.Tensor) -> Any:
    """A jax array with `t`'s values and dtype (bf16 via float32, which is exact)."""
    import jax.numpy as jnp

    return jnp.asarray(t.detach().cpu().float().numpy()).astype(as_dtype(t.dtype))


def to_torch(a: Any, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of `dtype` with the jax array `a`'s values."""
    return torch.from_numpy(np.array(a.astype("float32"))).to(dtype)


def fit_block_q(q_len: int, dtype: Any, block_q: int | None = None) -> int:
    """`block_q`, or by default the smaller of 128 and q_len rounded up to a whole tile."""
    if block_q is not None:
        return block_q
    return min(DEFAULT_BLOCK_Q, round_up(q_len, sublane_multiple(dtype)))


def _check_interpret_steps(steps: int, what: str) -> None:
    if steps > MAX_INTERPRET_STEPS:
        raise ValueError(f"{what}: interpret mode would run {steps} grid steps (> "
                         f"{MAX_INTERPRET_STEPS}, about 10-20 ms each on CPU); use smaller "
                         f"shapes or larger blocks, or run on a TPU")


@functools.cache
def _tpu_kernel(call: Callable, out_index: int = 0) -> Callable:
    from torch_xla.experimental.custom_kernel import jax_import_guard, make_kernel_from_pallas

    jax_import_guard()  # torch_xla takes the TPU before jax initialises
    return make_kernel_from_pallas(call, lambda *args: [(args[0].shape, args[0].dtype)])


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, *, block_rows: int = DEFAULT_BLOCK_ROWS,
            eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of `x` (..., dim) by the Pallas kernel (forward only; no autograd)."""
    check_rmsnorm_blocks(tuple(x.shape), x.dtype, block_rows)
    where = where_kernels_run(x)
    dim = x.shape[-1]
    x2 = x.reshape(-1, dim)
    rows = x2.shape[0]
    padded = round_up(rows, block_rows)
    call = rmsnorm_call(padded, dim, as_dtype(x.dtype).name, block_rows, float(eps),
                        where == "interpret")
    x2 = F.pad(x2, (0, 0, 0, padded - rows))
    w2 = weight.reshape(1, dim).to(x.dtype)
    if where == "tpu":
        y = _tpu_kernel(call)(x2, w2)
    else:
        _check_interpret_steps(padded // block_rows, "rmsnorm")
        y = to_torch(_jitted(call)(to_jax(x2), to_jax(w2)), x.dtype)
    return y[:rows].reshape(x.shape)


def _attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                       scale: float, block_q: int, block_k: int) -> torch.Tensor:
    where = where_kernels_run(q)
    *lead, q_len, d = q.shape
    kv_len = k.shape[-2]
    q3, k3, v3 = (t.reshape(-1, t.shape[-2], d) for t in (q, k, v))
    bh = q3.shape[0]
    q_pad, kv_pad = round_up(q_len, block_q), round_up(kv_len, block_k)
    call = flash_attention_call(bh, q_len, kv_len, d, as_dtype(q.dtype).name, block_q, block_k,
                                causal, scale, where == "interpret")
    q3 = F.pad(q3, (0, 0, 0, q_pad - q_len))
    k3, v3 = (F.pad(t, (0, 0, 0, kv_pad - kv_len)).to(q.dtype) for t in (k3, v3))
    if where == "tpu":
        out = _tpu_kernel(call)(q3, k3, v3)
    else:
        _check_interpret_steps(bh * (q_pad // block_q) * (kv_pad // block_k), "flash_attention")
        out = to_torch(_jitted(call)(to_jax(q3), to_jax(k3), to_jax(v3)), q.dtype)
    return out[:, :q_len].reshape(*lead, q_len, d)


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, block_q, block_k):  # type: ignore[override]
        ctx.save_for_backward(q, k, v)
        ctx.causal, ctx.scale = causal, scale
        return _attention_forward(q, k, v, causal, scale, block_q, block_k)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            out = attention_reference(q, k, v, ctx.causal, ctx.scale)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad_out)
        return dq, dk, dv, None, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    sm_scale: float | None = None, block_q: int | None = None,
                    block_k: int = DEFAULT_BLOCK_K) -> torch.Tensor:
    """Attention of q (..., q_len, d), k and v (..., kv_len, d) by the Pallas kernel.

    `block_q` defaults to `fit_block_q`. Blocks are validated before anything is traced.
    Differentiable (the backward recomputes the reference math).
    """
    bq = fit_block_q(q.shape[-2], q.dtype, block_q)
    check_attention_blocks(tuple(q.shape), tuple(k.shape), q.dtype, bq, block_k)
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"flash_attention: v {tuple(v.shape)} must have k's shape "
                         f"{tuple(k.shape)}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    return _FlashAttention.apply(q, k, v, bool(causal), scale, bq, block_k)


@functools.cache
def _jitted(call: Callable) -> Callable:
    from ._common import jit_for_interpret

    return jit_for_interpret(call)
