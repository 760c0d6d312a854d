"""Sharding layouts on a device mesh: strategies, per-device layouts, collectives, memory.

A run with ``spec.mesh`` set runs under SPMD (GSPMD): every tensor gets a *partition spec*, one
entry per dimension naming the mesh axis (or axes) that dimension is split over (``None``: not
split), and XLA's SPMD partitioner turns the one global program into a per-device program with the
collectives it needs.

Meshes. The devices ``0 .. n-1`` are laid out row-major in the mesh shape
(``xs.Mesh(np.arange(n), mesh)``): on a ``2x4`` mesh device ``d`` sits at row ``d // 4`` (its
``data`` coordinate) and column ``d % 4`` (its ``model`` coordinate). Axis names are ``("data",)``
for a 1-D mesh and ``("data", "model")`` for a 2-D one (:func:`axis_names`). Named meshes of real
TPU slices are in :data:`MESHES`; :func:`parse_mesh` reads ``"2x4"`` or a name.

Strategies (``spec.strategy``; None means ``dp``):

=======  ==========================================  ============================================
name     parameters (and their grads, Adam state)    batch (dim 0 of every input)
=======  ==========================================  ============================================
dp       replicated on every device                  split over ``data`` only. On a 2-D mesh the
                                                     ``model`` axis then holds replicas that do
                                                     the same work (a 1-D mesh uses every device
                                                     for data); kept so that dp and dp_tp differ
                                                     only by the model axis.
fsdp     first dimension divisible by the device     split over every device (``data`` and
         count split over every device (both axes    ``model`` flattened): each device is a data-
         flattened, e.g. ``(("data", "model"),       parallel worker holding 1/n of the weights
         None)``); replicated if none divides        (ZeRO-3 / FSDP)
tp       Megatron-style on the ``model`` axis:       replicated
         column-parallel ``attn.c_attn``,
         ``mlp.c_fc`` (weight ``("model", None)``,
         bias ``("model",)``), row-parallel
         ``attn.c_proj``, ``mlp.c_proj`` (weight
         ``(None, "model")``); embeddings
         vocab-parallel where divisible; conv
         weights split on output channels
         (``("model", None, None, None)``), other
         Linear layers column-parallel, where
         divisible; norms replicated
dp_tp    as tp                                       split over ``data``
=======  ==========================================  ============================================

tp and dp_tp need a 2-D mesh (data, model); dp and fsdp take a 1-D or 2-D mesh. minGPT's
attention is split along its fused q/k/v output rows, not regrouped per head, so XLA adds some
resharding of its own; widths must still divide by the model axis (checked by :func:`validate`).

Where things run: :func:`validate`, :func:`param_specs`, :func:`predicted_layout`,
:func:`shard_tensor_spec` and everything that reads results (:func:`layout_frame`,
:func:`memory_per_device`, :func:`collectives_frame`, :func:`fits`) never import torch_xla;
:func:`make_mesh`, :func:`shard_model`, :func:`shard_optimizer_state`, :func:`shard_batch` and
:func:`layout_records` run in the worker.

Layout records (one per tensor and device, streamed as ``kind="layout"`` before training; also
what :func:`predicted_layout` returns; columns of :func:`layout_frame`):

================  ================================================================================
tensor            parameter name (module path, e.g. ``transformer.h.0.mlp.c_fc.weight``) or
                  ``batch.<key>`` for an input
tensor_kind       ``param`` or ``input`` (not ``kind``: that key marks the record's own kind)
shape             global shape (list)
dtype             e.g. ``float32``
partition         the partition spec asked for, as text, e.g. ``('model', None)`` or
                  ``replicated``
partition_spec    the same as a JSON list, e.g. ``["model", null]``, ``[["data", "model"], null]``
spec              XLA's sharding annotation (``torch_xla._XLAC._get_xla_sharding_spec``), e.g.
                  ``{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}``; ``''`` or
                  ``{replicated}``: every device holds all of it
device            device index (int); ``device_name`` e.g. ``CPU:3``
mesh_coords       the device's coordinates in the mesh (list); ``row``, ``col`` its place in a
                  grid (2-D: the two coordinates; 1-D: row 0, col = coordinate)
index             the global index range the device holds, ``[[start, stop], ...]`` per dim
                  (stop clipped to the shape; the whole dim if not split)
index_label       the same as text, e.g. ``0:128, :`` (``:`` = the whole dim)
shard_shape       shape of the device's buffer (a split dim rounds up: ragged tails are padded)
shard_bytes       bytes of that buffer (what the device allocates)
data_bytes        bytes of real (unpadded) data the device holds
replica_id        which copy of its slice the device holds (0 .. replicas-1)
num_replicas      how many devices hold that slice
================  ================================================================================
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import SpecError

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from torch import nn

    from .spec import ExperimentSpec

STRATEGIES: dict[str, str] = {
    "dp": "data parallel: parameters replicated, batch split over the data axis",
    "fsdp": "fully sharded data parallel: parameters split over all devices, batch too",
    "tp": "tensor parallel (Megatron): layers split over the model axis, batch replicated",
    "dp_tp": "data x tensor parallel: tp over the model axis, batch split over the data axis",
}
DEFAULT_STRATEGY = "dp"
AXES_1D = ("data",)
AXES_2D = ("data", "model")

# Named meshes: a v6e host has 8 chips in a 2x4 torus; larger slices of the same generation.
MESHES: dict[str, tuple[int, ...]] = {
    "v6e-1": (1,),
    "v6e-4": (2, 2),
    "v6e-8": (2, 4),
    "4x4": (4, 4),
    "4x8": (4, 8),
}

# Megatron-style rules, by the end of a Linear layer's module path.
COLUMN_PARALLEL = ("attn.c_attn", "mlp.c_fc", "to_q", "to_k", "to_v")
ROW_PARALLEL = ("attn.c_proj", "mlp.c_proj", "to_out.0")

Partition = tuple[Any, ...]  # one entry per dim: None, an axis name, or a tuple of axis names


# --------------------------------------------------------------------------------------------
# Meshes and partition specs (pure Python)
# --------------------------------------------------------------------------------------------
def parse_mesh(text: str | Sequence[int]) -> tuple[int, ...]:
    """``"2x4"`` -> ``(2, 4)``; also a name of :data:`MESHES` (``"v6e-8"``) or a tuple of ints."""
    if isinstance(text, list | tuple):
        shape = tuple(text)
        if not shape or len(shape) > 2 or any(
                not isinstance(n, int) or isinstance(n, bool) or n <= 0 for n in shape):
            raise SpecError(f"mesh {text!r} must be 1 or 2 positive ints, e.g. (8,) or (2, 4)")
        return shape
    if not isinstance(text, str):
        raise SpecError(f"mesh must be text like '2x4' or a tuple of ints, got {text!r}")
    key = text.strip().lower()
    if key in MESHES:
        return MESHES[key]
    parts = key.replace("*", "x").replace(",", "x").split("x")
    if not 1 <= len(parts) <= 2 or not all(p.strip().isdigit() for p in parts):
        raise SpecError(f"mesh {text!r} is not a mesh shape; write ROWSxCOLS like '2x4' or a "
                        f"single size like '8', or a named mesh: {', '.join(MESHES)}")
    shape = tuple(int(p) for p in parts)
    if any(n <= 0 for n in shape):
        raise SpecError(f"mesh {text!r} has an axis of size 0; every axis needs >= 1 device")
    return shape


def mesh_text(mesh_shape: Sequence[int]) -> str:
    return "x".join(str(n) for n in mesh_shape)


def axis_names(mesh_shape: Sequence[int]) -> tuple[str, ...]:
    """``("data",)`` for a 1-D mesh, ``("data", "model")`` for a 2-D one."""
    if len(mesh_shape) == 1:
        return AXES_1D
    if len(mesh_shape) == 2:
        return AXES_2D
    raise SpecError(f"mesh {mesh_text(mesh_shape)} has {len(mesh_shape)} axes; meshes here have "
                    "1 axis (data,) or 2 axes (data, model), e.g. 8 or 2x4")


def strategy_name(spec_or_strategy: Any) -> str:
    """The strategy of a spec (None means ``dp``), checked against :data:`STRATEGIES`."""
    name = getattr(spec_or_strategy, "strategy", spec_or_strategy)
    name = DEFAULT_STRATEGY if name is None else name
    if name not in STRATEGIES:
        raise SpecError(f"unknown strategy {name!r}; valid strategies: {', '.join(STRATEGIES)} "
                        "(None means dp)")
    return name


def _all_devices(mesh_shape: Sequence[int]) -> Any:
    """The partition entry that splits one dim over every device (axes flattened)."""
    names = axis_names(mesh_shape)
    return names[0] if len(names) == 1 else names


def batch_axes(strategy: str, mesh_shape: Sequence[int]) -> tuple[str, ...]:
    """Mesh axes the batch (dim 0 of each input) is split over under `strategy`."""
    names = axis_names(mesh_shape)
    strategy = strategy_name(strategy)
    if strategy == "fsdp":
        return names
    if strategy == "tp":
        return ()
    return ("data",)


def batch_partition(strategy: str, mesh_shape: Sequence[int], ndim: int) -> Partition:
    """Partition spec of an input of rank `ndim`: dim 0 on :func:`batch_axes`, the rest whole."""
    axes = batch_axes(strategy, mesh_shape)
    first = None if not axes else axes[0] if len(axes) == 1 else axes
    return (first,) + (None,) * (ndim - 1)


def _entry_axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple | list) else (entry,)


def axis_product(entry: Any, mesh_shape: Sequence[int]) -> int:
    """How many pieces a dim with partition `entry` is split into."""
    names = axis_names(mesh_shape)
    return math.prod(mesh_shape[names.index(a)] for a in _entry_axes(entry))


def check_partition(name: str, shape: Sequence[int], partition: Sequence[Any],
                    mesh_shape: Sequence[int]) -> Partition:
    """Validate a user-given partition spec for tensor `name`; returns it as a tuple.

    Raises SpecError for: a rank that differs from the tensor's, an axis name (or index) not in
    the mesh, an axis used twice. A dim that does not divide evenly is allowed (XLA pads the
    last shards; the layout shows it).
    """
    names = axis_names(mesh_shape)
    partition = tuple(partition)
    if len(partition) != len(shape):
        raise SpecError(f"partition spec {partition!r} has {len(partition)} entries but tensor "
                        f"{name!r} has rank {len(shape)} (shape {list(shape)}); give one entry "
                        "per dimension (None = not split)")
    used: list[str] = []
    out = []
    for entry in partition:
        axes = []
        for a in _entry_axes(entry):
            if isinstance(a, int) and not isinstance(a, bool) and 0 <= a < len(names):
                a = names[a]
            if a not in names:
                raise SpecError(f"partition spec {partition!r} of tensor {name!r} names axis "
                                f"{a!r}, which is not in mesh {mesh_text(mesh_shape)}; its axes "
                                f"are {', '.join(map(repr, names))} (or None)")
            if a in used:
                raise SpecError(f"partition spec {partition!r} of tensor {name!r} uses mesh axis "
                                f"{a!r} twice; each axis can split at most one dimension")
            used.append(a)
            axes.append(a)
        if not axes:
            out.append(None)
        elif isinstance(entry, tuple | list):
            out.append(tuple(axes))
        else:
            out.append(axes[0])
    return tuple(out)


def partition_text(partition: Partition | None) -> str:
    return "replicated" if partition is None or all(e is None for e in partition) \
        else repr(tuple(partition))


# --------------------------------------------------------------------------------------------
# Which parameter gets which partition spec (pure torch, works on a "meta" model too)
# --------------------------------------------------------------------------------------------
def _tp_partition(module: nn.Module, path: str, pname: str, shape: tuple[int, ...],
                  m: int) -> Partition | None:
    from torch import nn

    def divisible(n: int) -> bool:
        return n % m == 0

    if isinstance(module, nn.Linear):
        if any(path.endswith(s) for s in ROW_PARALLEL):
            if pname == "weight" and divisible(shape[1]):
                return (None, "model")
            return None  # the bias is added after the all-reduce: replicated
        if pname == "weight" and divisible(shape[0]):
            return ("model", None)  # column-parallel (also lm_head-like layers where divisible)
        if pname == "bias" and divisible(shape[0]):
            return ("model",)
        return None
    if isinstance(module, nn.modules.batchnorm._NormBase | nn.GroupNorm) and len(shape) == 1 \
            and divisible(shape[0]):
        # Channel norms after a conv split on its output channels: weight, bias and running
        # statistics split the same way. (Left replicated, the running statistics came back
        # split after step 0 and the step compiled a second time.)
        return ("model",)
    if isinstance(module, nn.Embedding) and pname == "weight" and divisible(shape[0]):
        return ("model", None)  # vocab-parallel
    if isinstance(module, nn.Conv2d | nn.ConvTranspose2d) and divisible(
            module.out_channels):
        if pname == "weight" and isinstance(module, nn.Conv2d):
            return ("model", None, None, None)  # [out, in, kh, kw]: split output channels
        if pname == "weight":  # ConvTranspose2d: [in, out, kh, kw]
            return (None, "model", None, None)
        if pname == "bias":
            return ("model",)
    return None


def _fsdp_partition(shape: tuple[int, ...], mesh_shape: Sequence[int]) -> Partition | None:
    n = math.prod(mesh_shape)
    for i, size in enumerate(shape):
        if size % n == 0:
            return tuple(_all_devices(mesh_shape) if j == i else None for j in range(len(shape)))
    return None


def param_specs(model: nn.Module, strategy: str | None,
                mesh_shape: Sequence[int]) -> dict[str, Partition | None]:
    """Partition spec of every parameter of `model` (None: replicated), by module path.

    Pure torch (no torch_xla): works on a model built on the ``meta`` device. Tied weights
    appear once, under their first name (minGPT's ``lm_head.weight`` is ``transformer.wte``'s).
    """
    strategy = strategy_name(strategy)
    mesh_shape = tuple(mesh_shape)
    axis_names(mesh_shape)  # checks the rank
    if strategy in ("tp", "dp_tp") and len(mesh_shape) != 2:
        raise SpecError(f"strategy {strategy!r} needs a 2-D mesh (data, model), got mesh "
                        f"{mesh_text(mesh_shape)}")
    out: dict[str, Partition | None] = {}
    seen: set[int] = set()
    for path, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            name = f"{path}.{pname}" if path else pname
            shape = tuple(p.shape)
            if strategy == "dp":
                spec = None
            elif strategy == "fsdp":
                spec = _fsdp_partition(shape, mesh_shape)
            else:
                spec = _tp_partition(module, path, pname, shape, mesh_shape[1])
            out[name] = spec
    return out


def buffer_specs(model: nn.Module, strategy: str | None,
                 mesh_shape: Sequence[int]) -> dict[str, Partition | None]:
    """Partition spec of every floating-point buffer (BatchNorm's running statistics...) by the
    rule of a parameter of its shape in its module. Integer buffers (counters), scalars and masks
    are not listed: :func:`shard_model` marks them replicated."""
    strategy = strategy_name(strategy)
    mesh_shape = tuple(mesh_shape)
    out: dict[str, Partition | None] = {}
    for path, module in model.named_modules():
        for bname, b in module.named_buffers(recurse=False):
            if b is None or not b.is_floating_point() or not b.dim():
                continue
            name = f"{path}.{bname}" if path else bname
            shape = tuple(b.shape)
            if strategy == "dp":
                out[name] = None
            elif strategy == "fsdp":
                out[name] = _fsdp_partition(shape, mesh_shape)
            else:
                out[name] = _tp_partition(module, path, bname, shape, mesh_shape[1])
    return out


def plan(spec: ExperimentSpec) -> pd.DataFrame:
    """The partition spec each parameter would get, without running anything.

    Builds the model on the ``meta`` device (no memory, no torch_xla). Columns: ``tensor``,
    ``shape``, ``partition``, ``pieces`` (how many slices), ``params``, ``bytes`` (fp32),
    ``bytes_per_device`` (the largest slice, padded).
    """
    import pandas as pd
    import torch

    from . import models

    family = models.get_model(spec.model)
    cfg = family.config(spec.preset, **spec.options)
    if spec.mesh is None:
        raise SpecError("plan() needs a spec with a mesh, e.g. mesh=(2, 4)")
    with torch.device("meta"):
        model = family.build(cfg)
    params = dict(model.named_parameters())
    rows = []
    for name, part in param_specs(model, spec.strategy, spec.mesh).items():
        shape = list(params[name].shape)
        pieces = [axis_product(e, spec.mesh) for e in (part or (None,) * len(shape))]
        n = math.prod(shape)
        per_dev = math.prod(-(-s // k) for s, k in zip(shape, pieces, strict=True))
        rows.append({"tensor": name, "shape": shape, "partition": partition_text(part),
                     "pieces": math.prod(pieces), "params": n, "bytes": 4 * n,
                     "bytes_per_device": 4 * per_dev})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Validation (parent process; no torch_xla)
# --------------------------------------------------------------------------------------------
def _nearest_multiples(n: int, k: int) -> str:
    lo, hi = (n // k) * k, (n // k + 1) * k
    return f"{lo} or {hi}" if lo > 0 else f"{hi}"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def validate(spec: ExperimentSpec) -> None:
    """Check the strategy, mesh and batch of a sharded spec; raise SpecError naming the fix.

    Called by ``ExperimentSpec.validate`` (after the mesh size was checked against
    ``num_devices``); imports torch and the model family, never torch_xla.
    """
    from . import models

    if spec.strategy is not None and not isinstance(spec.strategy, str):  # [..] is unhashable
        raise SpecError(f"strategy must be None or one of {', '.join(STRATEGIES)} (a string), "
                        f"got {spec.strategy!r}")
    strategy = strategy_name(spec)
    mesh = tuple(spec.mesh or ())
    if len(mesh) not in (1, 2):
        raise SpecError(f"mesh {mesh_text(mesh)} has {len(mesh)} axes; meshes here have 1 axis "
                        "(data,) like (8,) or 2 axes (data, model) like (2, 4)")
    if strategy in ("tp", "dp_tp") and len(mesh) != 2:
        raise SpecError(f"strategy {strategy!r} needs a 2-D mesh (data, model), e.g. (2, 4) or "
                        f"(1, {mesh[0]}); got mesh {mesh_text(mesh)}. dp and fsdp take a 1-D mesh")
    family = models.get_model(spec.model)
    cfg = family.config(spec.preset, **spec.options)
    batch_size = spec.batch_size or family.default_batch_size(cfg)
    axes = batch_axes(strategy, mesh)
    if axes:
        k = math.prod(mesh[axis_names(mesh).index(a)] for a in axes)
        if batch_size % k:
            # Say how many ways the batch is split and of how many devices: on mesh 3x3 the data
            # axis is 3 of the 9 devices (each batch slice is copied over the model axis).
            where = f"{' x '.join(axes)} {'axes' if len(axes) > 1 else 'axis'}"
            n = math.prod(mesh)
            of = f"all {n} devices" if k == n else f"{k} of the mesh's {n} devices"
            raise SpecError(
                f"batch_size={batch_size} does not divide over the {where} of mesh "
                f"{mesh_text(mesh)}: strategy {strategy!r} splits the batch {k} ways (the "
                f"{where}: {of}); batch sizes that would divide are multiples of {k}, e.g. "
                f"{_nearest_multiples(batch_size, k)}")
    if strategy in ("tp", "dp_tp") and spec.model == "mingpt":
        m = mesh[1]
        widths = {"n_head": cfg.n_head, "n_embd": cfg.n_embd}
        bad = {k: v for k, v in widths.items() if v % m}
        if bad:
            ok = [d for d in _divisors(math.gcd(cfg.n_head, cfg.n_embd))
                  if spec.num_devices % d == 0]
            meshes = ", ".join(f"{spec.num_devices // d}x{d}" for d in ok)
            raise SpecError(
                f"strategy {strategy!r} splits minGPT's heads and widths {m} ways over the model "
                f"axis of mesh {mesh_text(mesh)} ({m} of its {math.prod(mesh)} devices), but "
                + ", ".join(f"{k}={v}" for k, v in bad.items())
                + f" is not divisible by {m}; valid model axes divide both n_head and n_embd: "
                + f"meshes {meshes}, or options whose n_head and n_embd divide by {m}")


def shard_tensor_spec(name: str, shape: Sequence[int], spec: Sequence[Any],
                      mesh_shape: Sequence[int] | str, dtype: str = "float32",
                      tensor_kind: str = "param") -> list[dict[str, Any]]:
    """Validate a custom partition spec for a tensor and predict its per-device layout.

    `spec` has one entry per dim: None, an axis name (``"data"``, ``"model"``), an axis index,
    or a tuple of names (split over both, e.g. ``("data", "model")``). Raises SpecError for an
    axis not in the mesh or a spec whose rank differs from the tensor's. Returns layout records
    (the columns of :func:`layout_frame`), computed without torch_xla.
    """
    mesh_shape = parse_mesh(mesh_shape)
    shape = [int(s) for s in shape]
    if any(s < 0 for s in shape):
        raise SpecError(f"tensor {name!r} has a negative size in shape {shape}")
    partition = check_partition(name, shape, spec, mesh_shape)
    return predicted_layout(name, shape, partition, mesh_shape, dtype, tensor_kind)


# --------------------------------------------------------------------------------------------
# Layouts: predicted (pure Python) and measured (worker)
# --------------------------------------------------------------------------------------------
_DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8,
                "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


def _mesh_place(device: int, mesh_shape: Sequence[int]) -> tuple[list[int], int, int]:
    coords, rest = [], device
    for size in reversed(mesh_shape):
        coords.append(rest % size)
        rest //= size
    coords.reverse()
    row, col = (coords[0], coords[1]) if len(coords) == 2 else (0, coords[0])
    return coords, row, col


def _index_label(index: list[list[int]], shape: Sequence[int]) -> str:
    parts = [":" if (a, b) == (0, s) else f"{a}:{b}" for (a, b), s in zip(index, shape,
                                                                         strict=True)]
    return ", ".join(parts) if parts else "scalar"


def _partition_json(partition: Partition | None, rank: int) -> list[Any]:
    if partition is None:
        return [None] * rank
    return [list(e) if isinstance(e, tuple | list) else e for e in partition]


def _record(name: str, tensor_kind: str, shape: list[int], dtype: str,
            partition: Partition | None, xla_spec: str, device: int, device_name: str,
            mesh_shape: Sequence[int],
            index: list[list[int]], tiles: Sequence[int], replica_id: int,
            num_replicas: int) -> dict[str, Any]:
    coords, row, col = _mesh_place(device, mesh_shape)
    itemsize = _DTYPE_BYTES.get(dtype, 4)
    shard_shape = [-(-s // t) for s, t in zip(shape, tiles, strict=True)]
    return {
        "tensor": name, "tensor_kind": tensor_kind, "shape": list(shape), "dtype": dtype,
        "partition": partition_text(partition),
        "partition_spec": _partition_json(partition, len(shape)), "spec": xla_spec,
        "device": device, "device_name": device_name,
        "mesh_coords": coords, "row": row, "col": col, "index": index,
        "index_label": _index_label(index, shape), "shard_shape": shard_shape,
        "shard_bytes": itemsize * math.prod(shard_shape),
        "data_bytes": itemsize * math.prod(b - a for a, b in index),
        "replica_id": replica_id, "num_replicas": num_replicas,
    }


def predicted_layout(name: str, shape: Sequence[int], partition: Partition | None,
                     mesh_shape: Sequence[int], dtype: str = "float32",
                     tensor_kind: str = "param", device_prefix: str = "CPU"
                     ) -> list[dict[str, Any]]:
    """Per-device layout records of a tensor with `partition` on `mesh_shape`, computed by hand.

    Device ``d`` has mesh coordinates ``unravel(d, mesh_shape)``. A dim split over axes
    ``(a1, a2, ...)`` is cut into ``prod(sizes)`` pieces of ``ceil(size / pieces)``; device ``d``
    holds piece ``ravel(coords[a1], coords[a2], ...)`` (first axis major), clipped to the shape.
    Its replica id ravels its coordinates on the axes the spec does not use. This is what XLA
    does (tests check it against ``_get_local_shard_replica_and_indices``).
    """
    shape = [int(s) for s in shape]
    mesh_shape = tuple(mesh_shape)
    names = axis_names(mesh_shape)
    partition = tuple(tuple(e) if isinstance(e, list) else e for e in partition) \
        if partition is not None else (None,) * len(shape)
    used = [a for e in partition for a in _entry_axes(e)]
    unused = [a for a in names if a not in used]
    tiles = [axis_product(e, mesh_shape) for e in partition]
    num_replicas = math.prod(mesh_shape[names.index(a)] for a in unused)
    records = []
    for d in range(math.prod(mesh_shape)):
        coords, _, _ = _mesh_place(d, mesh_shape)
        index = []
        for size, entry, t in zip(shape, partition, tiles, strict=True):
            piece = 0
            for a in _entry_axes(entry):
                i = names.index(a)
                piece = piece * mesh_shape[i] + coords[i]
            step = -(-size // t) if t else size
            index.append([min(piece * step, size), min((piece + 1) * step, size)])
        replica = 0
        for a in unused:
            i = names.index(a)
            replica = replica * mesh_shape[i] + coords[i]
        records.append(_record(name, tensor_kind, shape, dtype, partition, "",
                               d, f"{device_prefix}:{d}", mesh_shape, index, tiles, replica,
                               num_replicas))
    return records


def tile_shape(xla_spec: str, rank: int) -> list[int]:
    """How many pieces each dim is split into, read from an XLA sharding annotation."""
    match = re.search(r"devices=\[([\d,]+)\]", xla_spec or "")
    if not match:
        return [1] * rank
    return [int(x) for x in match.group(1).split(",")][:rank]


# --------------------------------------------------------------------------------------------
# Worker side (imports torch_xla)
# --------------------------------------------------------------------------------------------
def make_mesh(spec: ExperimentSpec) -> Any:
    """``xs.Mesh(np.arange(n), spec.mesh, axis_names(spec.mesh))`` (also the global mesh)."""
    import numpy as np
    import torch_xla.distributed.spmd as xs

    mesh_shape = tuple(spec.mesh)
    mesh = xs.Mesh(np.arange(math.prod(mesh_shape)), mesh_shape, axis_names(mesh_shape))
    xs.set_global_mesh(mesh)
    return mesh


def _mark(t: torch.Tensor, mesh: Any, partition: Partition | None) -> None:
    import torch_xla.distributed.spmd as xs

    xs.mark_sharding(t, mesh, tuple(partition) if partition else (None,) * t.dim())


def shard_model(model: nn.Module, spec: ExperimentSpec) -> None:
    """``mark_sharding`` on every parameter per the strategy (replicated ones explicitly too)
    and on floating-point buffers (:func:`buffer_specs`)."""
    mesh = make_mesh(spec)
    specs = param_specs(model, spec.strategy, spec.mesh)
    for name, p in model.named_parameters():
        _mark(p, mesh, specs[name])
    # Every buffer gets an explicit sharding, replicated unless buffer_specs splits it: a buffer
    # the step updates (BatchNorm's num_batches_tracked) and that had none came back from step 0
    # marked replicated, a new input sharding, so step 1 compiled the step a second time.
    buffers = buffer_specs(model, spec.strategy, spec.mesh)
    for name, b in model.named_buffers():
        if b.device.type == "xla":
            _mark(b, mesh, buffers.get(name))


def shard_optimizer_state(opt: torch.optim.Optimizer, model: nn.Module,
                          spec: ExperimentSpec) -> None:
    """Give every tensor in the optimizer state of a parameter (Adam's ``exp_avg`` and
    ``exp_avg_sq``) its parameter's sharding, so FSDP/TP really divide the optimizer's memory.
    Scalars (``step``) and CPU tensors are left alone."""
    import torch

    mesh = make_mesh(spec)
    specs = param_specs(model, spec.strategy, spec.mesh)
    by_id = {id(p): specs[name] for name, p in model.named_parameters()}
    for p, state in opt.state.items():
        if id(p) not in by_id:
            continue
        for value in state.values():
            if (isinstance(value, torch.Tensor) and value.shape == p.shape and value.dim()
                    and value.device.type == "xla"):
                _mark(value, mesh, by_id[id(p)])


def shard_batch(batch: dict[str, torch.Tensor], spec: ExperimentSpec) -> dict[str, torch.Tensor]:
    """Split dim 0 of every input over the strategy's batch axes (:func:`batch_axes`)."""
    mesh = make_mesh(spec)
    strategy = strategy_name(spec)
    for t in batch.values():
        if t.dim():
            _mark(t, mesh, batch_partition(strategy, spec.mesh, t.dim()))
    return batch


def _measured(name: str, tensor_kind: str, t: torch.Tensor, partition: Partition | None,
              mesh_shape: Sequence[int], prefix: str) -> list[dict[str, Any]]:
    import torch_xla

    shape = list(t.shape)
    dtype = str(t.dtype).removeprefix("torch.")
    xla_spec = torch_xla._XLAC._get_xla_sharding_spec(t)
    n = math.prod(mesh_shape)
    if not xla_spec:  # never annotated: replicated, every device holds all of it
        return [_record(name, tensor_kind, shape, dtype, partition, "", d,
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
        out.append(_record(name, tensor_kind, shape, dtype, partition, xla_spec,
                           d, f"{prefix}:{d}", mesh_shape, index, tiles, int(replica), 0))
    # replicas of a slice: devices holding the same index ranges
    counts: dict[str, int] = {}
    for r in out:
        counts[r["index_label"]] = counts.get(r["index_label"], 0) + 1
    for r in out:
        r["num_replicas"] = counts[r["index_label"]]
    return out


def layout_records(model: nn.Module, batch: dict[str, torch.Tensor],
                   spec: ExperimentSpec) -> list[dict[str, Any]]:
    """What every device holds of every parameter and input, read back from torch_xla.

    One record per (tensor, device), fields as in the module docstring. Ranges come from
    ``_get_local_shard_replica_and_indices`` and the spec string (not from
    ``XLAShardedTensor.placements``, which is wrong for named mesh axes in torch_xla 2.9).
    """
    import torch_xla.runtime as xr

    prefix = xr.device_type() or "CPU"
    mesh_shape = tuple(spec.mesh)
    strategy = strategy_name(spec)
    specs = param_specs(model, strategy, mesh_shape)
    records = []
    for name, p in model.named_parameters():
        records += _measured(name, "param", p, specs[name], mesh_shape, prefix)
    for key, t in batch.items():
        part = batch_partition(strategy, mesh_shape, t.dim()) if t.dim() else ()
        records += _measured(f"batch.{key}", "input", t, part, mesh_shape, prefix)
    return records


# --------------------------------------------------------------------------------------------
# Parent side: frames from results
# --------------------------------------------------------------------------------------------
LAYOUT_COLUMNS = ["tensor", "tensor_kind", "shape", "dtype", "partition", "partition_spec",
                  "spec", "device",
                  "device_name", "mesh_coords", "row", "col", "index", "index_label",
                  "shard_shape", "shard_bytes", "data_bytes", "replica_id", "num_replicas"]


def _records_of(result_or_records: Any) -> list[dict[str, Any]]:
    return list(getattr(result_or_records, "records", result_or_records) or [])


def layout_frame(records: Any) -> pd.DataFrame:
    """Layout records (``kind == "layout"``) of a run, or predicted ones, as a DataFrame.

    Accepts a RunResult, its records, or the list :func:`shard_tensor_spec` /
    :func:`predicted_layout` return. Columns: :data:`LAYOUT_COLUMNS` (see the module docstring).
    """
    import pandas as pd

    rows = [{k: v for k, v in r.items() if k != "kind"} for r in _records_of(records)
            if r.get("kind", "layout") == "layout" and "tensor" in r]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=LAYOUT_COLUMNS)
    return frame[LAYOUT_COLUMNS + [c for c in frame.columns if c not in LAYOUT_COLUMNS]]


MEMORY_COLUMNS = ["device", "device_name", "row", "col", "params_bytes", "grads_bytes",
                  "optimizer_bytes", "inputs_bytes", "total_bytes", "xla_total_bytes"]


def memory_per_device(result_or_records: Any, hlo_dir: str | Path | None = None,
                      optimizer_factor: float = 2.0) -> pd.DataFrame:
    """Bytes each device holds, by kind, from the layout records of a run.

    Columns (:data:`MEMORY_COLUMNS`): ``device``, ``device_name``, ``row``, ``col``;
    ``params_bytes`` (the device's parameter buffers, padded as XLA allocates them);
    ``grads_bytes`` (gradients have their parameter's layout: equal to params);
    ``optimizer_bytes`` (`optimizer_factor` x params: Adam's exp_avg and exp_avg_sq, sharded
    like their parameter); ``inputs_bytes`` (one batch); ``total_bytes`` (their sum; no
    activations); ``xla_total_bytes`` (XLA's own total for the compiled train step from its
    memory-usage report, the same per-device program on every device: needs
    ``capture=("hlo",)``; NaN otherwise; it counts parameters, state, activations and temporaries
    of the step, i.e. what the train-step program touches).
    """
    import pandas as pd

    layout = layout_frame(result_or_records)
    if layout.empty:
        return pd.DataFrame(columns=MEMORY_COLUMNS)
    keys = ["device", "device_name", "row", "col"]
    per = layout.pivot_table(index=keys, columns="tensor_kind", values="shard_bytes",
                             aggfunc="sum", fill_value=0).reset_index()
    per.columns.name = None
    for kind in ("param", "input"):
        if kind not in per:
            per[kind] = 0
    frame = per[keys].copy()
    frame["params_bytes"] = per["param"].astype("int64")
    frame["grads_bytes"] = frame["params_bytes"]
    frame["optimizer_bytes"] = (optimizer_factor * frame["params_bytes"]).round().astype("int64")
    frame["inputs_bytes"] = per["input"].astype("int64")
    frame["total_bytes"] = frame[["params_bytes", "grads_bytes", "optimizer_bytes",
                                  "inputs_bytes"]].sum(axis=1)
    if hlo_dir is None and getattr(result_or_records, "out_dir", None) is not None:
        hlo_dir = Path(result_or_records.out_dir) / "hlo"
    xla_total = float("nan")
    if hlo_dir is not None:
        report = _step_file(Path(hlo_dir), "memory-usage-report.txt")
        if report is not None:
            from . import hlo

            xla_total = float(hlo.memory_report(report.read_text())["total_bytes"])
    frame["xla_total_bytes"] = xla_total
    return frame.sort_values("device").reset_index(drop=True)[MEMORY_COLUMNS]


def _step_file(hlo_dir: Path, suffix: str) -> Path | None:
    """The dumped file of the train step ending in `suffix` (after optimisations).

    The train step's module is named ``<model>_train_step``; without one, the largest file.
    """
    if not hlo_dir.is_dir():
        return None
    files = sorted(p for p in hlo_dir.iterdir() if p.name.endswith(suffix))
    if not files:
        return None
    named = [p for p in files if "train_step" in p.name]
    pool = named or files
    return max(pool, key=lambda p: p.stat().st_size)


ICI_HOP_US = 1.0  # latency of one ICI hop, µs (jax-ml/scaling-book: ~1 µs)


def collective_time_us(kind: str, nbytes: float, axis_sizes: Sequence[int],
                       chip: str | Any = "v6e") -> float:
    """Estimated time in µs of one collective over the mesh axes of sizes `axis_sizes`.

    Ring model (jax-ml/scaling-book, sharding.md), each logical mesh axis laid along one
    physical axis of the slice, neighbours one link apart. V = `nbytes`, the whole buffer the
    collective moves (the gathered result; a reduce-scatter's input), n = the devices in the
    group, k = the axes it spans. Along one axis the bandwidth W is one link's: both
    directions (2 x ``ici_link_gbps``) if the axis wraps around into a ring (v5e/v6e: axes of
    16 chips or more; v5p: 4 or more), else one direction (a line has no wrap-around link).
    Over k axes, k rings run at once: k x W. Latency: ``ICI_HOP_US`` per hop, floor(a/2) hops
    along a ring of a chips, a-1 along a line.

    - all-gather, reduce-scatter: (n-1)/n x V / (k W) + hops
    - all-reduce (a reduce-scatter then an all-gather): 2 (n-1)/n x V / (k W) + 2 hops
    - all-to-all: V / (4 k W) + hops
    - collective-permute: V over one link, one direction, + 1 hop

    Bandwidth and latency only: no overlap with compute, no contention with other traffic.
    """
    from .chips import get_chip

    c = get_chip(chip) if isinstance(chip, str) else chip
    sizes = [int(a) for a in axis_sizes if int(a) > 1]
    if not sizes:
        return 0.0
    link = c.ici_link_gbps * 1e9  # bytes/s, one link, one direction
    if kind == "collective-permute":
        return (nbytes / link) * 1e6 + ICI_HOP_US
    n = math.prod(sizes)
    ring = all(a >= c.wraparound_from for a in sizes)
    bandwidth = (2 * link if ring else link) * len(sizes)
    hops = sum(a // 2 if ring else a - 1 for a in sizes)
    if kind == "all-reduce":
        return 2 * (n - 1) / n * nbytes / bandwidth * 1e6 + 2 * hops * ICI_HOP_US
    if kind == "all-to-all":
        return nbytes / (4 * bandwidth) * 1e6 + hops * ICI_HOP_US
    return (n - 1) / n * nbytes / bandwidth * 1e6 + hops * ICI_HOP_US


def ici_assumptions(chip: str = "v6e") -> str:
    """The assumptions under every ICI estimate, in one sentence for a notebook or the CLI."""
    from .chips import get_chip

    c = get_chip(chip)
    return (f"Estimated, not measured: ring model on {c.name} ICI ({c.ici_link_gbps:g} GB/s per "
            f"link and direction, {c.ici_links} links per chip), each mesh axis laid along one "
            f"physical axis; axes shorter than {c.wraparound_from} chips have no wrap-around "
            f"link (one direction, a-1 hops), {ICI_HOP_US:g} µs per hop; bandwidth and "
            "latency only, no overlap with compute (jax-ml/scaling-book).")


COLLECTIVE_COLUMNS = ["kind", "name", "shape", "bytes", "buffer_bytes", "replica_groups",
                      "groups_text", "group_size", "num_groups", "axis", "estimated_us",
                      "computation", "source_op"]


def _axis_of(groups: list[list[int]], mesh_shape: Sequence[int] | None) -> str:
    """Which mesh axis a collective's groups run along (``data``, ``model``, ``all``...)."""
    if not mesh_shape or not groups:
        return ""
    n = math.prod(mesh_shape)
    norm = sorted(tuple(sorted(g)) for g in groups)
    if norm == [tuple(range(n))]:
        return "all"
    names = axis_names(mesh_shape)
    for i, a in enumerate(names):
        want = sorted(tuple(sorted(d for d in range(n) if all(
            _mesh_place(d, mesh_shape)[0][j] == _mesh_place(base, mesh_shape)[0][j]
            for j in range(len(mesh_shape)) if j != i))) for base in range(n))
        if norm == sorted(set(want)):
            return a
    return "other"


def _group_axes(groups: list[list[int]] | None, group_size: int,
                mesh_shape: Sequence[int] | None) -> tuple[int, ...]:
    """Sizes of the mesh axes one collective's groups span: (4,) along the model axis of a 2x4
    mesh, (2, 4) over all of it; (group_size,) where the groups follow no mesh axes."""
    if not mesh_shape:
        return (group_size,)
    if not groups:  # no replica groups: every device
        return tuple(mesh_shape)
    places = [_mesh_place(d, mesh_shape)[0] for d in groups[0]]
    spanned = tuple(size for i, size in enumerate(mesh_shape)
                    if len({p[i] for p in places}) > 1)
    return spanned if math.prod(spanned) == group_size else (group_size,)


def collectives_frame(result: Any, chip: str = "v6e", hlo_text: str | None = None,
                      mesh_shape: Sequence[int] | None = None) -> pd.DataFrame:
    """Collectives XLA inserted into the partitioned train step, with an ICI time estimate.

    Reads the after-optimisations HLO of the train step in ``result.out_dir / "hlo"`` (needs
    ``capture=("hlo",)``), or `hlo_text` if given, with :func:`tpu_workbench.hlo.collectives`.
    Columns (:data:`COLLECTIVE_COLUMNS`): ``kind`` (all-reduce, all-gather, reduce-scatter,
    all-to-all, collective-permute...), ``name``, ``shape``, ``bytes`` (the op's result, per
    device), ``buffer_bytes`` (the full buffer the ring moves: the result, except for a
    reduce-scatter: result x group size), ``replica_groups`` (list of lists of device ids),
    ``groups_text`` (as XLA wrote them), ``group_size`` (n), ``num_groups``, ``axis`` (the mesh
    axis the groups run along: ``data``, ``model``, ``all`` (every device), ``other`` (e.g.
    the pairs of a collective-permute)), ``estimated_us``, ``computation``, ``source_op``.

    ``estimated_us`` is :func:`collective_time_us` of ``buffer_bytes`` over the mesh axes the
    groups span (the ring model; its assumptions in :func:`ici_assumptions`).
    """
    import pandas as pd

    from . import hlo
    from .chips import get_chip

    target = get_chip(chip)
    if hlo_text is None:
        hlo_dir = Path(result.out_dir) / "hlo" if getattr(result, "out_dir", None) else None
        step = _step_file(hlo_dir, "after_optimizations.txt") if hlo_dir else None
        if step is None:
            raise ValueError("no after-optimisations HLO of the train step found; run with "
                             "capture=('hlo',)")
        hlo_text = step.read_text()
    if mesh_shape is None and getattr(result, "spec", None) is not None:
        mesh_shape = result.spec.mesh
    frame = hlo.collectives(hlo_text)
    if frame.empty:
        return pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    n = frame["group_size"].astype("float")
    frame["buffer_bytes"] = frame["bytes"].where(frame["kind"] != "reduce-scatter",
                                                 frame["bytes"] * n)
    frame["axis"] = [_axis_of(g, mesh_shape) if g else "all" for g in frame["replica_groups"]]
    frame["estimated_us"] = [
        collective_time_us(k, b, _group_axes(g, int(s), mesh_shape), target)
        if s == s and s is not None else float("nan")
        for k, b, s, g in zip(frame["kind"], frame["buffer_bytes"], n, frame["replica_groups"],
                              strict=True)]
    return frame[COLLECTIVE_COLUMNS].reset_index(drop=True)


# --- does a model fit? -----------------------------------------------------------------------
def fits(n_params: int, strategy: str, mesh_shape: Sequence[int] | str, chip: str = "v6e",
         bytes_per_param: float = 4, grad_bytes_per_param: float | None = None,
         optimizer_bytes_per_param: float = 8, activation_bytes: float = 0,
         usable_fraction: float = 0.9) -> dict[str, Any]:
    """Would params + grads + Adam state of an `n_params` model fit each chip's HBM?

    Per-device bytes under `strategy` on `mesh_shape`: dp replicates everything; fsdp divides
    everything by the device count; tp and dp_tp divide by the model axis (as if every weight
    split; embeddings and norms that stay replicated make it a little worse). Defaults are fp32
    training: 4 B params + 4 B grads + 8 B Adam (exp_avg, exp_avg_sq). For bf16 params with fp32
    master weights and Adam use ``bytes_per_param=2, optimizer_bytes_per_param=12``.
    `activation_bytes` is added per device as given. A model fits when the total is at most
    `usable_fraction` of HBM (XLA needs room for temporaries).

    Returns ``fits`` (bool), ``per_device_bytes``, ``params_bytes``, ``grads_bytes``,
    ``optimizer_bytes``, ``activation_bytes``, ``hbm_bytes``, ``usable_bytes``, ``shards``,
    ``devices``, ``strategy``, ``mesh``, ``chip`` and ``reason`` (a sentence).
    """
    from .chips import get_chip

    mesh_shape = parse_mesh(mesh_shape)
    strategy = strategy_name(strategy)
    if strategy in ("tp", "dp_tp") and len(mesh_shape) != 2:
        raise SpecError(f"strategy {strategy!r} needs a 2-D mesh (data, model), got "
                        f"{mesh_text(mesh_shape)}")
    if not isinstance(n_params, int | float) or n_params <= 0:
        raise SpecError(f"n_params must be a positive number, got {n_params!r}")
    c = get_chip(chip)
    devices = math.prod(mesh_shape)
    shards = {"dp": 1, "fsdp": devices}.get(strategy, mesh_shape[-1])
    grad_b = bytes_per_param if grad_bytes_per_param is None else grad_bytes_per_param
    params_b = n_params * bytes_per_param / shards
    grads_b = n_params * grad_b / shards
    opt_b = n_params * optimizer_bytes_per_param / shards
    total = params_b + grads_b + opt_b + activation_bytes
    hbm = c.hbm_gb * 1e9
    usable = usable_fraction * hbm
    ok = total <= usable
    gb = 1e9
    reason = (f"{strategy} on {mesh_text(mesh_shape)} {c.name} splits weights/grads/optimizer "
              f"{shards} way(s): {total / gb:.2f} GB per chip (params {params_b / gb:.2f} + "
              f"grads {grads_b / gb:.2f} + optimizer {opt_b / gb:.2f} + activations "
              f"{activation_bytes / gb:.2f}) {'fits in' if ok else 'exceeds'} "
              f"{usable / gb:.1f} GB usable ({usable_fraction:.0%} of {c.hbm_gb:g} GB HBM)")
    if not ok and strategy == "dp":
        reason += "; fsdp would divide it by " + str(devices)
    return {"fits": ok, "per_device_bytes": total, "params_bytes": params_b,
            "grads_bytes": grads_b, "optimizer_bytes": opt_b,
            "activation_bytes": float(activation_bytes), "hbm_bytes": hbm,
            "usable_bytes": usable, "shards": shards, "devices": devices,
            "strategy": strategy, "mesh": list(mesh_shape), "chip": c.name, "reason": reason}


# --- several runs side by side -------------------------------------------------------------
def summary_frame(results: Iterable[Any]) -> pd.DataFrame:
    """One row per run: ``strategy``, ``mesh``, timing (see ``tpu_workbench.timing.summarize``),
    ``final_loss``, ``collectives`` (count) and ``collective_bytes`` (where HLO was captured),
    ``params_bytes_per_device`` (largest device) and ``xla_total_bytes``."""
    import pandas as pd

    from .experiments import labelled_steps
    from .timing import summarize

    rows = []
    for result in results:
        spec = result.spec
        base = summarize(labelled_steps(spec, result.records, result.run_id))
        row = base.iloc[0].to_dict() if len(base) else {}
        row["strategy"] = strategy_name(spec) if spec.mesh else "single"
        row["mesh"] = mesh_text(spec.mesh) if spec.mesh else "1"
        row["run_id"] = result.run_id
        try:
            coll = collectives_frame(result)
            row["collectives"] = len(coll)
            row["collective_bytes"] = int(coll["bytes"].sum())
            row["collective_est_us"] = float(coll["estimated_us"].sum())
        except (ValueError, OSError, TypeError):
            row.update(collectives=float("nan"), collective_bytes=float("nan"),
                       collective_est_us=float("nan"))
        mem = memory_per_device(result)
        row["params_bytes_per_device"] = float(mem["params_bytes"].max()) if len(mem) \
            else float("nan")
        row["xla_total_bytes"] = float(mem["xla_total_bytes"].max()) if len(mem) \
            else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# CLI: tpu-workbench shard
# --------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mingpt", help="model family (default: mingpt)")
    parser.add_argument("--preset", default="tiny", help="size preset (default: tiny)")
    parser.add_argument("--mesh", default="2x4",
                        help=f"mesh shape like 2x4 or 8, or a named mesh ({', '.join(MESHES)})")
    parser.add_argument("--strategy", default="dp",
                        help=f"one of {', '.join(STRATEGIES)}, several comma-separated, or "
                             "'all' (each runs, tables get a strategy column)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per strategy")
    parser.add_argument("--mode", default="compile", help="execution mode (default: compile)")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--tensor", default=None,
                        help="tensor drawn in the layout chart (default: the largest split one)")
    parser.add_argument("--chip", default="v6e", help="chip for collective time estimates")
    parser.add_argument("--baseline", action="store_true",
                        help="also run on one device (no mesh) to compare losses and step times")
    parser.add_argument("--out", type=Path, required=True, help="output folder")


def specs_from_args(args: argparse.Namespace) -> list[ExperimentSpec]:
    from .spec import ExperimentSpec

    mesh = parse_mesh(args.mesh)
    text = args.strategy.strip()
    names = list(STRATEGIES) if text == "all" else [s.strip() for s in text.split(",")
                                                    if s.strip()]
    if not names:
        raise SpecError(f"--strategy {args.strategy!r} names no strategy; valid: "
                        f"{', '.join(STRATEGIES)} or all")
    specs = []
    for name in names:
        strategy_name(name)
        specs.append(ExperimentSpec(model=args.model, preset=args.preset, mode=args.mode,
                                    steps=args.steps, batch_size=args.batch_size, mesh=mesh,
                                    strategy=name, num_devices=math.prod(mesh),
                                    capture=("hlo",)))
    for spec in specs:
        spec.validate()
    return specs


def _default_tensor(layout: pd.DataFrame) -> str:
    params = layout[layout["tensor_kind"] == "param"]
    if params.empty:
        return str(layout["tensor"].iloc[0])
    per = params.groupby("tensor", sort=False).agg(
        pieces=("index_label", "nunique"), size=("data_bytes", "max"))
    split = per[per["pieces"] > 1]
    return str((split if len(split) else per)["size"].idxmax())


def run(args: argparse.Namespace) -> int:
    """``tpu-workbench shard``: run strategies on a mesh; write layout.csv, memory.csv,
    collectives.csv, summary.json and charts (HTML + PNG) to ``--out``."""
    import pandas as pd

    from . import runner
    from .charts import save_chart
    from .charts import sharding as sharding_charts
    from .errors import WorkbenchError
    from .paths import writable_folder

    out = writable_folder(args.out)
    specs = specs_from_args(args)  # bad input fails here, before any worker starts
    if args.tensor is not None and not isinstance(args.tensor, str):
        raise SpecError(f"--tensor must be a name, got {args.tensor!r}")
    results, errors = [], {}
    for spec in specs:
        print(f"running {spec.model}/{spec.preset} {spec.strategy} on mesh "
              f"{mesh_text(spec.mesh)} ({spec.steps} steps)...", file=sys.stderr)
        try:
            results.append(runner.run(spec))
        except WorkbenchError as exc:
            errors[spec.strategy] = str(exc)
    baseline = None
    if args.baseline and specs:
        try:
            baseline = runner.run(specs[0].replace(mesh=None, strategy=None, capture=()))
        except WorkbenchError as exc:
            errors["single"] = str(exc)

    def tagged(frame: pd.DataFrame, result: Any) -> pd.DataFrame:
        frame.insert(0, "strategy", strategy_name(result.spec))
        return frame

    layout = pd.concat([tagged(layout_frame(r), r) for r in results], ignore_index=True) \
        if results else pd.DataFrame(columns=["strategy", *LAYOUT_COLUMNS])
    memory = pd.concat([tagged(memory_per_device(r), r) for r in results], ignore_index=True) \
        if results else pd.DataFrame(columns=["strategy", *MEMORY_COLUMNS])
    colls = []
    for r in results:
        try:
            colls.append(tagged(collectives_frame(r, chip=args.chip), r))
        except ValueError as exc:
            errors[f"{r.spec.strategy} collectives"] = str(exc)
    collectives = pd.concat(colls, ignore_index=True) if colls \
        else pd.DataFrame(columns=["strategy", *COLLECTIVE_COLUMNS])
    summary = summary_frame(results + ([baseline] if baseline else []))

    written = []
    for name, frame in {"layout.csv": layout, "memory.csv": memory,
                        "collectives.csv": collectives.drop(columns=["replica_groups"])}.items():
        tmp = out / (name + ".tmp")
        frame.to_csv(tmp, index=False)
        tmp.replace(out / name)
        written.append(out / name)
    (out / "summary.json").write_text(json.dumps(
        {"runs": summary.to_dict(orient="records"), "errors": errors}, indent=2, default=str))
    written.append(out / "summary.json")

    if results:
        first = layout[layout["strategy"] == strategy_name(results[0].spec)]
        tensor = args.tensor or _default_tensor(first)
        for r in results:
            s = strategy_name(r.spec)
            frame = layout[(layout["strategy"] == s) & (layout["tensor"] == tensor)]
            if frame.empty:
                errors[f"{s} layout"] = (f"no tensor {tensor!r}; tensors: "
                                         + ", ".join(layout["tensor"].unique()[:8]) + "...")
                continue
            written += save_chart(sharding_charts.layout_grid(frame, tensor, r.spec.mesh),
                                   out, f"layout_{s}")
        written += save_chart(sharding_charts.memory_bars(memory), out, "memory")
        if len(collectives):
            written += save_chart(sharding_charts.collective_bytes(collectives), out,
                                   "collectives")
        if len(summary):
            written += save_chart(sharding_charts.step_time_per_strategy(summary), out,
                                   "step_time")
    if len(summary):
        cols = [c for c in ["strategy", "mesh", "first_step_ms", "steady_median_ms",
                            "final_loss", "collectives", "collective_bytes",
                            "params_bytes_per_device", "xla_total_bytes"] if c in summary]
        print(summary[cols].to_string(index=False, float_format=lambda v: f"{v:,.4g}"))
        print(f"collectives.csv estimated_us: {ici_assumptions(args.chip)}")
    for name, err in errors.items():
        print(f"FAILED {name}: {err}", file=sys.stderr)
    print(f"wrote {len(written)} files to {out}")
    return 1 if errors else 0
