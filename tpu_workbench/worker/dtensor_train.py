"""DTensor strategies that train, one process per device: what each torchrun rank applies.

PyTorch's own parallel APIs over a ``DeviceMesh`` (gloo on a CPU, TorchTPU's ``tpu_dist`` on
chips), placing tensor parallelism as the SPMD path does (:func:`tpu_workbench.sharding.
param_specs`): a rank holds what the device of the same mesh position holds under SPMD, for
tp and dp_tp (tested), but for an embedding tied to the output head, which stays whole; fsdp
shards like FSDP2 (dim 0, padded), SPMD splits the first dimension that divides.

=======  ===================================================================================
dp       replicated parameters, gradients all-reduced over the ``data`` axis (DDP)
fsdp     FSDP2 ``fully_shard`` on every block (each child of a ``ModuleList``) and the root,
         over all devices (a 1-D mesh of them: the SPMD fsdp's both axes flattened)
tp       ``parallelize_module`` on the ``model`` axis: column-parallel where ``param_specs``
         splits a Linear's weight ``("model", None)``, row-parallel where ``(None, "model")``
         (minGPT: ``attn.c_attn``, ``mlp.c_fc`` column; ``attn.c_proj``, ``mlp.c_proj`` row);
         embeddings vocab-parallel where ``param_specs`` splits them, unless tied to the head
         (then whole: the one difference from SPMD); norms replicated
dp_tp    tp on the ``model`` axis, replicated over ``data``: each gradient averaged over the
         data axis after the backward pass (one all-reduce each), as SPMD's dp_tp
=======  ===================================================================================

An MLP's column-parallel output stays sharded into its row-parallel projection (one all-reduce,
Megatron); attention's is gathered first, because minGPT splits its fused q/k/v output into
heads, a reshape DTensor cannot follow from a column shard (:func:`tp_plan`). Plain tensors
meeting DTensors count as replicated (``implicit_replication``).

:class:`Collectives` is ``CommDebugMode`` that also keeps each collective's bytes and process
group, so a step's collectives become rows (collective, module, forward/backward, bytes, the
ranks of its group) for :func:`tpu_workbench.runs.gang.collectives_frame`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor.debug import CommDebugMode

from .. import sharding

_SYNCING = False  # sync_gradients is running: its collectives belong to the backward pass
# c10d / functional-collective op names -> the XLA HLO kinds the collectives frame uses
KINDS = {"all_gather": "all-gather", "allgather": "all-gather", "reduce_scatter": "reduce-scatter",
         "all_reduce": "all-reduce", "allreduce": "all-reduce", "all_to_all": "all-to-all",
         "alltoall": "all-to-all", "broadcast": "broadcast", "gather": "gather",
         "scatter": "scatter", "reduce": "reduce"}


def make_meshes(device_type: str, mesh_shape: tuple[int, ...], strategy: str) -> dict[str, Any]:
    """The DeviceMeshes a strategy trains over: ``mesh`` (the spec's shape and axis names) and,
    for fsdp on a 2-D mesh, ``flat`` (every device on one axis, the group FSDP shards over)."""
    from torch.distributed.device_mesh import init_device_mesh

    names = sharding.axis_names(mesh_shape)
    mesh = init_device_mesh(device_type, mesh_shape, mesh_dim_names=names)
    out = {"mesh": mesh}
    if strategy == "fsdp":
        out["flat"] = mesh if len(mesh_shape) == 1 else mesh[names]._flatten("all")
    return out


def batch_slice(strategy: str, mesh_shape: tuple[int, ...], rank: int) -> tuple[int, int]:
    """(index, parts): this rank takes slice `index` of the batch cut in `parts` along dim 0,
    the way :func:`tpu_workbench.sharding.batch_partition` splits it (rank-major mesh order)."""
    axes = sharding.batch_axes(strategy, mesh_shape)
    if not axes:
        return 0, 1
    coords = sharding.mesh_place(rank, mesh_shape)[0]
    names = sharding.axis_names(mesh_shape)
    index, parts = 0, 1
    for axis in axes:  # major axis first, as XLA and DTensor nest them
        i = names.index(axis)
        index, parts = index * mesh_shape[i] + coords[i], parts * mesh_shape[i]
    return index, parts


def local_batch(batch: dict[str, torch.Tensor], index: int, parts: int) -> dict[str, torch.Tensor]:
    """This rank's slice of a batch (every tensor cut the same way along dim 0)."""
    return {k: v.chunk(parts, dim=0)[index].clone() if v.dim() else v for k, v in batch.items()}


def tp_plan(model: nn.Module, mesh_shape: tuple[int, ...]) -> dict[str, Any]:
    """``parallelize_module`` plan from the workbench's tp partition specs: Linear layers
    column- or row-parallel by how :func:`~tpu_workbench.sharding.param_specs` splits their
    weight, embeddings it splits ``("model", None)`` vocab-parallel (each rank looks up its
    rows; the partial results all-reduced). An embedding tied to the output head stays whole
    here (SPMD splits it: XLA partitions the head and the loss over the vocabulary, which a
    gang's plain loss cannot).

    Inside an ``mlp`` module the column-parallel output stays sharded into the row-parallel
    projection (Megatron: one all-reduce). Elsewhere (attention, a lone head) the module reshapes
    what the layer returns, e.g. minGPT's fused q/k/v into heads, which DTensor cannot follow from
    a column shard: the output is gathered (all-gather) and the row-parallel projection takes its
    slice of a replicated input, as XLA's partitioner reshards minGPT's attention."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    specs = sharding.param_specs(model, "tp", mesh_shape)
    tied = {id(owner) for _, _, owner, _ in _tied(model)}
    plan: dict[str, Any] = {}
    for path, module in model.named_modules():
        if isinstance(module, nn.Embedding) and specs.get(f"{path}.weight") == ("model", None) \
                and id(module) not in tied:
            plan[path] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
            continue
        if not isinstance(module, nn.Linear) or f"{path}.weight" not in specs:
            continue  # not a Linear, or its weight is tied to another module's
        spec = specs[f"{path}.weight"]
        in_mlp = path.rpartition(".")[0].endswith("mlp")
        if spec == ("model", None):
            plan[path] = ColwiseParallel() if in_mlp else ColwiseParallel(
                output_layouts=Replicate())
        elif spec == (None, "model"):
            plan[path] = RowwiseParallel() if in_mlp else RowwiseParallel(
                input_layouts=Replicate())
    return plan


def blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP wraps one by one: every child of every ``ModuleList``."""
    return [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]


def apply(strategy: str, model: nn.Module, meshes: dict[str, Any]) -> nn.Module:
    """Lay `model` out for `strategy` (in place); return the module the loss calls (call
    :func:`sync_gradients` after each backward pass)."""
    from torch.distributed.fsdp import fully_shard

    mesh = meshes["mesh"]
    if strategy == "dp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, process_group=mesh["data"].get_group())
    if strategy in ("tp", "dp_tp"):
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(model, mesh["model"], tp_plan(model, tuple(mesh.shape)))
    if strategy == "fsdp":
        for block in blocks(model):
            fully_shard(block, mesh=meshes["flat"])
        fully_shard(model, mesh=meshes["flat"])
    return model


def _tied(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module, str]]:
    """(module, name, owner, owner's name) of every parameter that is another module's (a
    head tied to its embedding)."""
    first: dict[int, tuple[nn.Module, str]] = {}
    out = []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in first:
                out.append((module, name, *first[id(p)]))
            else:
                first[id(p)] = (module, name)
    return out


def sync_gradients(strategy: str, model: nn.Module, meshes: dict[str, Any]) -> None:
    """After the backward pass: dp_tp averages each gradient over the data axis (summed over
    the axis's group, divided by its size: DDP's all-reduce, one per parameter), so ranks that
    hold the same pieces keep the same weights. The other strategies synchronise inside."""
    if strategy != "dp_tp":
        return
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    global _SYNCING
    data = meshes["mesh"][meshes["mesh"].mesh_dim_names[0]]
    _SYNCING = True  # counted as the backward pass's, as DDP's all-reduces are
    try:
        for p in model.parameters():
            if p.grad is not None:
                grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                dist.all_reduce(grad, group=data.get_group())
                grad.div_(data.size())
    finally:
        _SYNCING = False


def loss_context() -> Any:
    """Where the forward pass runs: plain tensors meeting DTensors count as replicated."""
    from torch.distributed.tensor.experimental import implicit_replication

    return implicit_replication()


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


def _shape(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return list(value.shape)
    return [_shape(v) for v in value] if isinstance(value, list | tuple) else []


def _group_ranks(args: tuple, kwargs: dict[str, Any]) -> list[int] | None:
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.ScriptObject):  # a c10d op's ProcessGroup (or a ReduceOp)
            try:
                return dist.get_process_group_ranks(dist.ProcessGroup.unbox(value))
            except RuntimeError:
                continue
        if isinstance(value, str):  # a functional collective's group name
            try:
                return dist.get_process_group_ranks(_resolve_process_group(value))
            except (RuntimeError, ValueError, KeyError):
                continue
    return None


class Collectives(CommDebugMode):
    """``CommDebugMode`` that also records, per collective: its kind, the module it ran in,
    forward or backward, the bytes of its result on this rank and its group's ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        before = self.get_total_counts()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is NotImplemented or self.get_total_counts() == before:
            return out  # a DTensor op (desugared into plain ops next) or not a collective
        kwargs = kwargs or {}
        name = func._overloadpacket.__name__.strip("_")
        kind = next((v for k, v in KINDS.items() if name.startswith(k)), name)
        # c10d ops write into their first argument; functional collectives return the result
        inplace = func.namespace == "c10d"
        result = args[0] if inplace else out
        self.rows.append({
            "collective": kind, "op": f"{func.namespace}.{name}",
            "module": _module_path(self.advanced_module_tracker.name),
            "phase": "backward" if self.advanced_module_tracker.is_bw or _SYNCING
                     else "forward",
            "bytes": _nbytes(result), "shape": _shape(result),
            "group": _group_ranks(args, kwargs)})
        return out


def _module_path(name: str) -> str:
    """ModTracker's ``FSDPGPT.transformer.h.0`` as the model's own path, ``transformer.h.0``
    (``""``: the root module; ``"Global"``: outside any module; DDP's ``module.`` dropped)."""
    return name if name == "Global" else name.partition(".")[2].removeprefix("module.")
