"""What the kernels share: TPU block-shape rules (checked in plain Python, before any tracing),
padding to block multiples, Pallas' TPU interpret mode and the relative error of a result."""

from __future__ import annotations

from typing import Any

import numpy as np

LANES = 128  # a TPU vector register is 8 sublanes x 128 lanes of 32-bit words
SUBLANES = 8


def as_dtype(dtype: Any) -> np.dtype:
    """A numpy/jax dtype for a torch, numpy or jax dtype, or a name such as ``"bfloat16"``."""
    import jax.numpy as jnp

    return jnp.dtype(str(dtype).removeprefix("torch.") if "torch." in str(dtype) else dtype)


def sublane_multiple(dtype: Any) -> int:
    """Rows of a TPU tile for `dtype`: 8 for 32-bit, 16 for bf16/f16 (two rows per 32-bit word)."""
    return SUBLANES * max(1, 4 // as_dtype(dtype).itemsize)


def dtype_name(dtype: Any) -> str:
    """``float32`` / ``bfloat16`` for a torch, numpy or jax dtype."""
    return as_dtype(dtype).name


def check_block(kernel: str, name: str, value: Any, multiple: int, why: str) -> None:
    """Raise ValueError unless `value` is a positive int multiple of `multiple`."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{kernel}: {name} must be a positive int, got {value!r}")
    if value % multiple:
        raise ValueError(f"{kernel}: {name}={value} is not a multiple of {multiple} ({why}); "
                         f"valid values are {multiple}, {2 * multiple}, {3 * multiple}, ...")


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= `n`."""
    return -(-n // multiple) * multiple


def interpret_mode(interpret: bool) -> Any:
    """The ``interpret=`` argument of ``pl.pallas_call``: Pallas' TPU interpreter (runs on CPU,
    simulating VMEM, DMAs and the grid) when `interpret`, else False (compile with Mosaic)."""
    if not interpret:
        return False
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.InterpretParams()


# Interpret mode makes a large XLA:CPU program of a loop over the grid with host callbacks: its
# compile time dominates a call, and LLVM's optimisations buy nothing here (measured: 3-4x
# faster compiles with XLA_FLAGS set like this, same run time).
INTERPRET_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0,
                              "xla_llvm_disable_expensive_passes": True}


def jit_for_interpret(fn: Any) -> Any:
    """``jax.jit(fn)`` compiled with `INTERPRET_COMPILER_OPTIONS`."""
    import jax

    return jax.jit(fn, compiler_options=INTERPRET_COMPILER_OPTIONS)


def relative_error(result: Any, reference: Any) -> float:
    """max |result - reference| / max |reference|, both taken as float64 arrays."""
    a = _as_f64(result)
    b = _as_f64(reference)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: result {a.shape}, reference {b.shape}")
    scale = float(np.abs(b).max()) or 1.0
    return float(np.abs(a - b).max()) / scale


def _as_f64(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor (bf16 has no numpy dtype: go through float32)
        return x.detach().cpu().float().numpy().astype(np.float64)
    return np.asarray(x, dtype=np.float32).astype(np.float64)
