"""SPMD in the worker: one mesh per run, ``mark_sharding`` on parameters, optimizer state and
inputs per a strategy of :mod:`tpu_workbench.sharding`, and the layouts torch_xla really made."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

from ..sharding.layout import layout_record, tile_shape
from ..sharding.mesh import Partition, axis_names, batch_axes, batch_partition, strategy_name
from ..sharding.strategies import buffer_specs, is_experts, param_specs


def make_mesh(mesh_shape: Sequence[int]) -> Any:
    """``xs.Mesh(np.arange(n), mesh_shape, axis_names(mesh_shape))``, also set as the global
    mesh. A run makes it once and hands it to the functions below."""
    import numpy as np
    import torch_xla.distributed.spmd as xs

    mesh_shape = tuple(mesh_shape)
    mesh = xs.Mesh(np.arange(math.prod(mesh_shape)), mesh_shape, axis_names(mesh_shape))
    xs.set_global_mesh(mesh)
    return mesh


def _mark(t: torch.Tensor, mesh: Any, partition: Partition | None) -> None:
    import torch_xla.distributed.spmd as xs

    xs.mark_sharding(t, mesh, tuple(partition) if partition else (None,) * t.dim())


def mark_experts(model: nn.Module, strategy: str | None, mesh_shape: Sequence[int]) -> None:
    """Tell kernels.moe how to split the experts' slots: their groups of tokens as the batch
    is split and, under ep, the experts over the model axis."""
    ep = strategy_name(strategy) == "ep"
    groups = tuple(a for a in batch_axes(strategy, mesh_shape) if not (ep and a == "model"))
    for module in model.modules():
        if is_experts(module):
            module.expert_axis = "model" if ep else None
            module.group_axes = groups


def shard_model(model: nn.Module, mesh: Any, strategy: str | None) -> None:
    """``mark_sharding`` on every parameter per the strategy (replicated ones explicitly too)
    and on floating-point buffers (:func:`buffer_specs`), over `mesh` (:func:`make_mesh`)."""
    specs = param_specs(model, strategy, mesh.mesh_shape)
    for name, p in model.named_parameters():
        _mark(p, mesh, specs[name])
    mark_experts(model, strategy, mesh.mesh_shape)
    # Every buffer gets an explicit sharding, replicated unless buffer_specs splits it: a buffer
    # the step updates (BatchNorm's num_batches_tracked) and that had none came back from step 0
    # marked replicated, a new input sharding, so step 1 compiled the step a second time.
    buffers = buffer_specs(model, strategy, mesh.mesh_shape)
    for name, b in model.named_buffers():
        if b.device.type == "xla":
            _mark(b, mesh, buffers.get(name))


def shard_optimizer_state(opt: torch.optim.Optimizer, model: nn.Module, mesh: Any,
                          strategy: str | None, state_of: Callable[..., dict[str, Any]]) -> None:
    """Remake every parameter's optimizer state with ``state_of(p, zeros)``
    (:func:`tpu_workbench.worker.backend.optimizer_state`), each tensor sharded as its parameter
    along the dims it keeps (Adam's moments whole, Adafactor's row and column vectors less one
    dim), so FSDP/TP really divide the optimizer's memory. The TPU trace shards them the same
    way. Scalars (``step``) are left alone."""
    specs = param_specs(model, strategy, mesh.mesh_shape)
    for name, p in model.named_parameters():
        if p not in opt.state:
            continue

        def zeros(shape: tuple[int, ...], dims: tuple[int, ...],
                  p: torch.Tensor = p, partition: Partition | None = specs[name]) -> torch.Tensor:
            t = p.new_zeros(shape)
            _mark(t, mesh, tuple(partition[d] for d in dims) if partition else None)
            return t

        opt.state[p] = state_of(p, zeros)


def shard_batch(batch: dict[str, torch.Tensor], mesh: Any,
                strategy: str | None) -> dict[str, torch.Tensor]:
    """Split dim 0 of every input over the strategy's batch axes (:func:`batch_axes`)."""
    strategy = strategy_name(strategy)
    for t in batch.values():
        if t.dim():
            _mark(t, mesh, batch_partition(strategy, mesh.mesh_shape, t.dim()))
    return batch


def _measured(name: str, tensor_kind: str, t: torch.Tensor, partition: Partition | None,
              mesh_shape: Sequence[int], prefix: str) -> list[dict[str, Any]]:
    import torch_xla

    shape = list(t.shape)
    dtype = str(t.dtype).removeprefix("torch.")
    xla_spec = torch_xla._XLAC._get_xla_sharding_spec(t)
    n = math.prod(mesh_shape)
    if not xla_spec:  # never annotated: replicated, every device holds all of it
        return [layout_record(name, tensor_kind, shape, dtype, partition, "", d,
                        f"{prefix}:{d}", mesh_shape, [[0, s] for s in shape], [1] * len(shape),
                        d, n) for d in range(n)]
    tiles = tile_shape(xla_spec, len(shape))
    # One entry per addressable device, in device order (checked: the same order as the device
    # names of _get_local_shards). Ellipsis: the whole tensor.
    pairs = torch_xla._XLAC._get_local_shard_replica_and_indices([t])[0]
    out = []
    for d, (replica, indices) in enumerate(pairs):
        if indices is Ellipsis:
            index = [[0, s] for s in shape]
        else:
            index = []
            for sl, size in zip(indices, shape, strict=True):
                start = 0 if sl.start is None else sl.start
                stop = size if sl.stop is None else sl.stop
                index.append([min(start, size), min(stop, size)])
        out.append(layout_record(name, tensor_kind, shape, dtype, partition, xla_spec,
                           d, f"{prefix}:{d}", mesh_shape, index, tiles, int(replica), 0))
    # replicas of a slice: devices holding the same index ranges
    counts: dict[str, int] = {}
    for r in out:
        counts[r["index_label"]] = counts.get(r["index_label"], 0) + 1
    for r in out:
        r["num_replicas"] = counts[r["index_label"]]
    return out


def layout_records(model: nn.Module, batch: dict[str, torch.Tensor], mesh_shape: Sequence[int],
                   strategy: str | None) -> list[dict[str, Any]]:
    """What every device holds of every parameter and input, read back from torch_xla.

    One record per (tensor, device), fields as in the module docstring. Ranges come from
    ``_get_local_shard_replica_and_indices`` and the spec string (not from
    ``XLAShardedTensor.placements``, which is wrong for named mesh axes in torch_xla 2.9).
    """
    import torch_xla.runtime as xr

    prefix = xr.device_type() or "CPU"
    mesh_shape = tuple(mesh_shape)
    strategy = strategy_name(strategy)
    specs = param_specs(model, strategy, mesh_shape)
    records = []
    for name, p in model.named_parameters():
        records += _measured(name, "param", p, specs[name], mesh_shape, prefix)
    for key, t in batch.items():
        part = batch_partition(strategy, mesh_shape, t.dim()) if t.dim() else ()
        records += _measured(f"batch.{key}", "input", t, part, mesh_shape, prefix)
    return records
