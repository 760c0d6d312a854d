"""torch_xla's Pallas flash attention as a Transformers attention implementation, and lowering
it for the TPU while a step is traced on XLA:CPU.

* :func:`register` adds :data:`IMPLEMENTATION` to Transformers' ``AttentionInterface``; the
  hf:* families build with it for ``attn_implementation="flash"``. It calls
  ``torch_xla.experimental.custom_kernel.flash_attention(q, k, v, causal=True)`` (forward and
  backward are Pallas kernels, ``tpu_custom_call`` in the graph), with GQA's KV heads repeated
  (the kernel takes equal head counts) and, under SPMD, partitioned over the global mesh.
* :func:`tpu_lowering`: while it is open, torch_xla lowers Pallas kernels for the ``tpu``
  platform instead of jax's default one, so on XLA:CPU a step traces to the HLO a TPU would
  compile (never run it: XLA:CPU cannot execute a ``tpu_custom_call``).
* :func:`unavailable`: why flash attention cannot run on a device (None where it can).

Importing this module imports neither torch_xla nor jax: a model is built (and planned on the
meta device) without them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ._common import round_up

# Transformers treats any implementation named "*flash*" as Dao-AILab's flash-attn and tries to
# import it (transformers.utils.generic.is_flash_attention_requested): a name without "flash".
IMPLEMENTATION = "xla_pallas"
# The kernel's query/key blocks in torch_xla 2.9 are min(default, seq) (512 forward, 1024/512/256
# in the backward) and must divide the sequence and be multiples of 128: lengths that satisfy
# every one are 128, 256, 512 and multiples of 1024.
_LENGTHS = (128, 256, 512)
_LENGTH_MULTIPLE = 1024
MAX_SMALL_HEAD_DIM = 128  # a head_dim above this must be a multiple of it

_lowering_depth = 0
_payloads: dict[tuple, str] = {}


def register() -> str:
    """Register :func:`attention` with Transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, attention)
    return IMPLEMENTATION


def kernel_length(seq: int) -> int:
    """The sequence length the kernel runs at: `seq` padded to 128, 256, 512 or a multiple of
    1024 (padding at the end is masked away by causality and sliced off)."""
    for length in _LENGTHS:
        if seq <= length:
            return length
    return round_up(seq, _LENGTH_MULTIPLE)


def head_dim_problem(head_dim: int) -> str | None:
    """Why the kernel cannot take `head_dim` (None if it can)."""
    if head_dim > MAX_SMALL_HEAD_DIM and head_dim % MAX_SMALL_HEAD_DIM:
        return (f"head_dim={head_dim}: the Pallas flash attention kernel takes a head_dim of at "
                f"most {MAX_SMALL_HEAD_DIM} or a multiple of {MAX_SMALL_HEAD_DIM}")
    return None


def unavailable(device: torch.device) -> str | None:
    """Why flash attention cannot run (or be traced) for tensors on `device`; None if it can."""
    if device.type == "xla":
        import torch_xla.runtime as xr

        if xr.device_type() == "TPU" or _lowering_depth:
            return None
        where = f"XLA:{xr.device_type()}"
    else:
        where = f"plain PyTorch on {device}"
    return (f"flash attention runs on a TPU; on XLA:CPU it can only be traced for the TPU "
            f"compiler (inside kernels.xla_flash.tpu_lowering()), and this model runs on "
            f"{where}; use eager or sdpa here")


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
              scaling: float | None = None, sliding_window: int | None = None,
              softcap: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention of (B, H, S, D) query and (B, KV, S, D) key/value through torch_xla's
    Pallas kernel; returns (B, S, H, D) and no weights, as Transformers' implementations do.

    No mask is built for this implementation (Transformers skips it for registered ones), so
    padding masks are not applied: the task's batches have none.
    """
    if dropout or sliding_window is not None or softcap is not None:
        raise ValueError(f"the Pallas flash attention kernel has no dropout, sliding window or "
                         f"soft-capping; got dropout={dropout}, sliding_window={sliding_window}, "
                         f"softcap={softcap}")
    reason = unavailable(query.device)
    if reason:
        raise ValueError(reason)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # the kernel takes as many KV heads as query heads
        key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
    seq = query.shape[2]
    pad = kernel_length(seq) - seq
    if pad:
        query, key, value = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in
                             (query, key, value))
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    spec, mesh = _partition(query.shape)
    out = _kernel()(query, key, value, causal=True, sm_scale=scale, partition_spec=spec,
                    mesh=mesh)
    return out[:, :, :seq].transpose(1, 2).contiguous(), None


def _kernel() -> Any:
    """torch_xla's ``flash_attention`` (imported on the first call)."""
    from torch_xla.experimental.custom_kernel import flash_attention

    return flash_attention


def _partition(shape: torch.Size) -> tuple[tuple | None, Any]:
    """The kernel's partition spec over the global SPMD mesh (None, None without one): batch
    over the first axis ("data"), heads over the second ("model") where the mesh has one; an
    axis that does not divide its dim is left out (that dim is whole on every device)."""
    import torch_xla.distributed.spmd as xs

    mesh = xs.get_global_mesh()
    if mesh is None:
        return None, None
    spec: list[str | None] = [None] * 4
    for dim, axis in enumerate(mesh.axis_names[:2]):
        size = mesh.mesh_shape[dim]
        if size > 1 and shape[dim] % size == 0:
            spec[dim] = axis
    return tuple(spec), mesh


@contextlib.contextmanager
def tpu_lowering() -> Iterator[None]:
    """Lower torch_xla's Pallas kernels for the TPU platform while open (nests; restores
    ``custom_kernel.trace_pallas`` on exit). Only for tracing on XLA:CPU: a step traced inside
    holds ``tpu_custom_call`` ops that only a TPU (or its compiler) can take."""
    import torch_xla.experimental.custom_kernel as ck

    global _lowering_depth
    original = ck.trace_pallas
    ck.trace_pallas = _trace_pallas_for_tpu
    _lowering_depth += 1
    try:
        yield
    finally:
        _lowering_depth -= 1
        ck.trace_pallas = original


def _trace_pallas_for_tpu(kernel: Any, *args: Any, static_argnums: Any = None,
                          static_argnames: Any = None, use_cache: bool = False,
                          **kwargs: Any) -> tuple[str, list[torch.Tensor]]:
    """torch_xla 2.9's ``custom_kernel.trace_pallas`` with ``.trace(...).lower(
    lowering_platforms=("tpu",))`` in place of ``.lower(...)`` (which lowers for jax's default
    platform: the CPU here, where Pallas has only interpret mode).

    Lowered in jax's forward-compatible mode (as for ``jax.export``): off a TPU VM, jax 0.7.1
    serializes Mosaic at its newest version, 8, which libtpu 0.0.21 (torch_xla 2.9's) refuses
    ("Unsupported version: expected <= 7 but got 8"); on a TPU VM jax would pick 7 itself from
    the runtime's build date.
    """
    import jax
    import jax._src.pallas.mosaic.pallas_call_registration  # noqa: F401 - the TPU lowering rule
    import torch_xla.experimental.custom_kernel as ck
    from jax._src.interpreters import mlir

    jax_args = [ck.to_jax_shape_dtype_struct(a) if torch.is_tensor(a) else a for a in args]
    tensors = [a for a in args if torch.is_tensor(a)]
    names = tuple(static_argnames) if static_argnames is not None else None
    key = (jax.config.jax_default_matmul_precision, kernel, static_argnums, names,
           tuple(jax_args), repr(sorted(kwargs.items())))
    if use_cache and key in _payloads:
        return _payloads[key], tensors
    jitted = jax.jit(kernel, static_argnums=static_argnums, static_argnames=static_argnames)
    lowered = jitted.trace(*jax_args, **kwargs).lower(
        lowering_platforms=("tpu",), _private_parameters=mlir.LoweringParameters(for_export=True))
    payload = ck._extract_backend_config(lowered.compiler_ir())
    if use_cache:
        _payloads[key] = payload
    return payload, tensors
