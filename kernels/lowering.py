"""What the compiled kernels look like in the program XLA receives, without a TPU: lowering for
the ``tpu`` platform needs no chip, and a ``pallas_call`` with ``interpret=False`` becomes one
``stablehlo.custom_call @tpu_custom_call`` whose ``backend_config`` carries the Mosaic kernel
(serialized MLIR bytecode, base64) that libtpu compiles."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
from collections.abc import Callable
from typing import Any

import pandas as pd

from ._common import round_up
from .flash_attention import (
    DEFAULT_BLOCK_K,
    DEFAULT_BLOCK_Q,
    check_attention_blocks,
    flash_attention,
    flash_attention_call,
)
from .rmsnorm import DEFAULT_BLOCK_ROWS, check_rmsnorm_blocks, rmsnorm, rmsnorm_call

_CONFIG = re.compile(r'backend_config = "((?:[^"\\]|\\.)*)"')
_CALL = re.compile(r"stablehlo\.custom_call @(\w+)\(([^)]*)\)")


def lower_for_tpu(fn: Callable, *args: Any, **kwargs: Any) -> str:
    """StableHLO text of ``jax.jit(fn)`` lowered for the TPU platform (args may be
    ``jax.ShapeDtypeStruct``)."""
    import jax

    return jax.jit(fn, **kwargs).trace(*args).lower(lowering_platforms=("tpu",)).as_text()


def attention_stablehlo(batch_heads: int, q_len: int, kv_len: int, head_dim: int,
                        dtype: str = "bfloat16", block_q: int = DEFAULT_BLOCK_Q,
                        block_k: int = DEFAULT_BLOCK_K, causal: bool = True) -> str:
    """StableHLO for a TPU of the whole compiled attention wrapper: padding, the custom call,
    slicing. Raises ValueError for bad blocks before tracing."""
    import jax

    q = jax.ShapeDtypeStruct((batch_heads, q_len, head_dim), dtype)
    kv = jax.ShapeDtypeStruct((batch_heads, kv_len, head_dim), dtype)
    return lower_for_tpu(lambda a, b, c: flash_attention(
        a, b, c, causal=causal, block_q=block_q, block_k=block_k, interpret=False), q, kv, kv)


def rmsnorm_stablehlo(rows: int, dim: int, dtype: str = "bfloat16",
                      block_rows: int = DEFAULT_BLOCK_ROWS) -> str:
    """StableHLO for a TPU of the compiled RMSNorm wrapper."""
    import jax

    x = jax.ShapeDtypeStruct((rows, dim), dtype)
    w = jax.ShapeDtypeStruct((dim,), dtype)
    return lower_for_tpu(lambda a, b: rmsnorm(a, b, block_rows=block_rows, interpret=False), x, w)


def shorten(text: str) -> str:
    """`text` with each custom call's base64 payload replaced by its size."""
    def repl(m: re.Match) -> str:
        return f'backend_config = "<{len(_payload(m.group(1))):,} bytes of Mosaic MLIR bytecode>"'

    return _CONFIG.sub(repl, text)


def custom_calls(text: str) -> pd.DataFrame:
    """One row per ``stablehlo.custom_call`` in `text`: ``target`` (tpu_custom_call),
    ``kernel_name``, ``operands``, ``signature`` (operand and result types),
    ``payload_bytes`` (the decoded Mosaic bytecode) and ``line`` (shortened)."""
    rows = []
    for line in text.splitlines():
        m = _CALL.search(line)
        if not m:
            continue
        cfg = _CONFIG.search(line)
        name = re.search(r'kernel_name = "([^"]*)"', line)
        rows.append({
            "target": m.group(1), "kernel_name": name.group(1) if name else "",
            "operands": m.group(2), "signature": line.rsplit(" : ", 1)[-1].strip(),
            "payload_bytes": len(_payload(cfg.group(1))) if cfg else 0,
            "line": shorten(line.strip())})
    return pd.DataFrame(rows, columns=["target", "kernel_name", "operands", "signature",
                                       "payload_bytes", "line"])


def _payload(escaped: str) -> bytes:
    """The Mosaic body of a backend_config (MLIR-escaped JSON with base64 inside)."""
    raw = re.sub(r"\\([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), escaped)
    try:
        body = json.loads(raw)["custom_call_config"]["body"]
    except (ValueError, KeyError, TypeError):
        return b""
    return base64.b64decode(body)


def attention_mosaic(batch_heads: int, q_len: int, kv_len: int, head_dim: int,
                     dtype: str = "bfloat16", block_q: int = DEFAULT_BLOCK_Q,
                     block_k: int = DEFAULT_BLOCK_K, causal: bool = True) -> str:
    """The attention kernel's jaxpr and Mosaic MLIR (what the custom call's payload holds:
    block shapes as ``window_bounds``, index maps as ``transform_*`` functions), as Pallas
    prints them with ``debug=True`` when lowering for a TPU."""
    import jax

    check_attention_blocks((batch_heads, q_len, head_dim), (batch_heads, kv_len, head_dim), dtype,
                           block_q, block_k)
    call = flash_attention_call.__wrapped__(
        batch_heads, q_len, kv_len, head_dim, dtype, block_q, block_k, causal,
        1.0 / head_dim ** 0.5, False, True)
    q = jax.ShapeDtypeStruct((batch_heads, round_up(q_len, block_q), head_dim), dtype)
    kv = jax.ShapeDtypeStruct((batch_heads, round_up(kv_len, block_k), head_dim), dtype)
    return _printed(lambda: lower_for_tpu(call, q, kv, kv))


def rmsnorm_mosaic(rows: int, dim: int, dtype: str = "bfloat16",
                   block_rows: int = DEFAULT_BLOCK_ROWS) -> str:
    """The RMSNorm kernel's jaxpr and Mosaic MLIR (see `attention_mosaic`)."""
    import jax

    check_rmsnorm_blocks((rows, dim), dtype, block_rows)
    padded = round_up(rows, block_rows)
    call = rmsnorm_call.__wrapped__(padded, dim, dtype, block_rows, 1e-6, False, True)
    return _printed(lambda: lower_for_tpu(call, jax.ShapeDtypeStruct((padded, dim), dtype),
                                          jax.ShapeDtypeStruct((1, dim), dtype)))


def _printed(fn: Callable[[], Any]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn()
    return buf.getvalue().strip()
