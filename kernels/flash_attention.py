"""Block-wise (flash) attention as a Pallas TPU kernel: online softmax over key/value blocks.

Inputs are ``(batch*heads, seq, head_dim)`` (4-D ``(batch, heads, seq, head_dim)`` is flattened).
The grid is ``(batch*heads, q blocks, kv blocks)``, kv innermost. At grid step (b, i, j) VMEM
holds rows ``[i*block_q, (i+1)*block_q)`` of Q and of the output, and rows
``[j*block_k, (j+1)*block_k)`` of K and V; three float32 scratch buffers carry the running row
max ``m``, the running softmax denominator ``l`` and the unnormalised output ``acc`` from one kv
step to the next. The full (seq x seq) score matrix never exists. At the last kv step ``acc / l``
is written out.

Causal: a kv block wholly above the diagonal of its q block is skipped (``pl.when``), and its
index map points K/V at block 0, the first block the next q block needs, so the pipeline fetches
nothing new during skipped steps (the trick of jax's own ``pallas.ops.tpu.flash_attention``).

Ragged lengths: q and kv are padded up to multiples of ``block_q`` / ``block_k``; key positions
>= the true kv length get a large negative score, padded query rows are sliced off.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ._common import LANES, as_dtype, check_block, interpret_mode, round_up, sublane_multiple

DEFAULT_BLOCK_Q = 128
DEFAULT_BLOCK_K = 128
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)  # finite: exp(mask - max) is 0, never NaN


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        sm_scale: float | None = None) -> torch.Tensor:
    """Plain PyTorch scaled dot-product attention (float32 math, result in ``q.dtype``); causal
    masks key j > query i (top-left aligned, as SDPA's ``is_causal``)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                         scale=scale)
    return out.to(q.dtype)


def check_attention_blocks(q_shape: tuple[int, ...], k_shape: tuple[int, ...], dtype: Any,
                           block_q: int, block_k: int) -> None:
    """Raise ValueError (before any tracing) for shapes or blocks the TPU kernel cannot take.

    Q/O tiles are (block_q, head_dim) and K/V tiles (block_k, head_dim): block_q is a
    second-to-last dim, so a multiple of 8 (16 for bf16). block_k is also the last (lane) dim
    of the (block_q, block_k) score tile and of its 128-lane row statistics, so a multiple of
    128. head_dim is the whole last axis; the running statistics are 128 lanes wide and are
    sliced or repeated to head_dim, so head_dim must be <= 128 or a multiple of 128.
    """
    if len(q_shape) not in (3, 4) or len(k_shape) != len(q_shape):
        raise ValueError(f"flash_attention: q and k must both be (batch*heads, seq, head_dim) or "
                         f"(batch, heads, seq, head_dim); got {tuple(q_shape)}, {tuple(k_shape)}")
    if q_shape[:-2] != k_shape[:-2] or q_shape[-1] != k_shape[-1]:
        raise ValueError(f"flash_attention: q {tuple(q_shape)} and k {tuple(k_shape)} must agree "
                         f"in every dim except the sequence length")
    if any(n <= 0 for n in (*q_shape, *k_shape)):
        raise ValueError(f"flash_attention: empty shape {tuple(q_shape)} / {tuple(k_shape)}")
    name = as_dtype(dtype).name
    check_block("flash_attention", "block_q", block_q, sublane_multiple(dtype),
                f"the second-to-last dim of a TPU tile of {name}")
    check_block("flash_attention", "block_k", block_k, LANES,
                "the lane dim of the (block_q, block_k) score tile")
    d = q_shape[-1]
    if d > LANES and d % LANES:
        raise ValueError(f"flash_attention: head_dim={d} must be <= {LANES} or a multiple of "
                         f"{LANES} (the 128-lane row statistics are sliced or repeated to it)")


def kv_runs(i: Any, j: Any, block_q: int, block_k: int, causal: bool) -> Any:
    """Whether grid step (q block i, kv block j) computes anything: always, or for causal when
    some key of block j is at or left of the last query of block i. Works on Python ints, numpy
    arrays and jax tracers alike (the kernel and `tiling.attention_schedule` share it)."""
    if not causal:
        return j >= 0
    return (i + 1) * block_q - 1 >= j * block_k


def kv_block_index(i: Any, j: Any, block_q: int, block_k: int, causal: bool, where: Any) -> Any:
    """Which K/V block the pipeline holds at step (i, j): j, or block 0 when the step is
    skipped (already the block the next q block starts with, so no copy is issued)."""
    return where(kv_runs(i, j, block_q, block_k, causal), j, 0)


def _kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, causal: bool, sm_scale: float,
            block_q: int, block_k: int, kv_len: int, num_kv: int) -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    i, j = pl.program_id(1), pl.program_id(2)
    head_dim = acc_ref.shape[-1]

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def _to_head_dim(stat):  # (block_q, 128) lane-replicated -> (block_q, head_dim)
        if head_dim <= LANES:
            return stat[:, :head_dim]
        return pltpu.repeat(stat, head_dim // LANES, 1)

    def _step():
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * sm_scale
        cols = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1) + j * block_k
        keep = None
        if kv_len % block_k:  # padded keys exist
            keep = cols < kv_len
        if causal:
            rows = jax.lax.broadcasted_iota(jnp.int32, s.shape, 0) + i * block_q
            keep = cols <= rows if keep is None else keep & (cols <= rows)
        if keep is not None:
            s = jnp.where(keep, s, MASK_VALUE)
        m_prev, l_prev = m_ref[...], l_ref[...]  # (block_q, 128), all lanes equal
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - pltpu.repeat(m_next, block_k // LANES, 1))
        alpha = jnp.exp(m_prev - m_next)
        l_ref[...] = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
        m_ref[...] = m_next
        pv = jax.lax.dot(p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)
        acc_ref[...] = acc_ref[...] * _to_head_dim(alpha) + pv

    if causal:  # steps above the diagonal do nothing
        pl.when(kv_runs(i, j, block_q, block_k, causal))(_step)
    else:
        _step()

    @pl.when(j == num_kv - 1)
    def _store():
        o_ref[...] = (acc_ref[...] / _to_head_dim(l_ref[...])).astype(o_ref.dtype)


@functools.cache
def flash_attention_call(bh: int, q_len: int, kv_len: int, head_dim: int, dtype: str,
                         block_q: int, block_k: int, causal: bool, sm_scale: float,
                         interpret: bool, debug: bool = False) -> Callable:
    """The bare ``pallas_call`` on padded ``q (bh, round_up(q_len, block_q), head_dim)`` and
    ``k, v (bh, round_up(kv_len, block_k), head_dim)``. `kv_len` is the true key length (for
    the padding mask). Nothing else is in it, so torch_xla can take its Mosaic payload as one
    custom call. `debug` prints the kernel's jaxpr and Mosaic MLIR on lowering."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    q_pad, kv_pad = round_up(q_len, block_q), round_up(kv_len, block_k)
    num_kv = kv_pad // block_k
    kernel = functools.partial(_kernel, causal=causal, sm_scale=sm_scale, block_q=block_q,
                               block_k=block_k, kv_len=kv_len, num_kv=num_kv)

    def q_map(b, i, j):
        return b, i, 0

    def kv_map(b, i, j):
        return b, kv_block_index(i, j, block_q, block_k, causal, jax.lax.select), 0

    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            grid=(bh, q_pad // block_q, num_kv),
            in_specs=[pl.BlockSpec((None, block_q, head_dim), q_map),
                      pl.BlockSpec((None, block_k, head_dim), kv_map),
                      pl.BlockSpec((None, block_k, head_dim), kv_map)],
            out_specs=pl.BlockSpec((None, block_q, head_dim), q_map),
            scratch_shapes=[pltpu.VMEM((block_q, LANES), jnp.float32),  # m
                            pltpu.VMEM((block_q, LANES), jnp.float32),  # l
                            pltpu.VMEM((block_q, head_dim), jnp.float32)],  # acc
        ),
        out_shape=jax.ShapeDtypeStruct((bh, q_pad, head_dim), as_dtype(dtype)),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret_mode(interpret),
        debug=debug,
        name="workbench_flash_attention",
    )


def flash_attention(q: Any, k: Any, v: Any, *, causal: bool = False,
                    sm_scale: float | None = None, block_q: int = DEFAULT_BLOCK_Q,
                    block_k: int = DEFAULT_BLOCK_K, interpret: bool = True) -> Any:
    """Attention of jax arrays q (..., q_len, d), k and v (..., kv_len, d) through the kernel.

    Validates the blocks first, flattens batch and heads, pads both sequence axes to block
    multiples, runs the kernel (TPU interpret mode when `interpret`, else compiled by Mosaic)
    and slices the padding off. `sm_scale` defaults to 1/sqrt(d).
    """
    import jax.numpy as jnp

    check_attention_blocks(tuple(q.shape), tuple(k.shape), q.dtype, block_q, block_k)
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"flash_attention: v {tuple(v.shape)} must have k's shape "
                         f"{tuple(k.shape)}")
    *lead, q_len, d = q.shape
    kv_len = k.shape[-2]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    q3, k3, v3 = (t.reshape(-1, t.shape[-2], d) for t in (q, k, v))
    q_pad, kv_pad = round_up(q_len, block_q), round_up(kv_len, block_k)
    q3 = jnp.pad(q3, ((0, 0), (0, q_pad - q_len), (0, 0)))
    k3, v3 = (jnp.pad(t, ((0, 0), (0, kv_pad - kv_len), (0, 0))) for t in (k3, v3))
    call = flash_attention_call(q3.shape[0], q_len, kv_len, d, as_dtype(q.dtype).name, block_q,
                                block_k, bool(causal), scale, interpret)
    out = _jit(call, interpret)(q3, k3.astype(q.dtype), v3.astype(q.dtype))
    return out[:, :q_len].reshape(*lead, q_len, d)


@functools.cache
def _jit(call: Callable, interpret: bool) -> Callable:
    import jax

    from ._common import jit_for_interpret

    return jit_for_interpret(call) if interpret else jax.jit(call)
