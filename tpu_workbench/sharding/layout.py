"""Per-device layouts: predicted from a partition spec (pure Python) and read back from
records (the columns of :data:`LAYOUT_COLUMNS`, documented in :mod:`tpu_workbench.sharding`)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import SpecError

if TYPE_CHECKING:
    import pandas as pd

from .mesh import (
    Partition,
    axis_names,
    axis_product,
    check_partition,
    entry_axes,
    index_label,
    mesh_place,
    parse_mesh,
    partition_text,
)


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


_DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8,
                "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


def _partition_json(partition: Partition | None, rank: int) -> list[Any]:
    if partition is None:
        return [None] * rank
    return [list(e) if isinstance(e, tuple | list) else e for e in partition]


def layout_record(name: str, tensor_kind: str, shape: list[int], dtype: str,
            partition: Partition | None, xla_spec: str, device: int, device_name: str,
            mesh_shape: Sequence[int],
            index: list[list[int]], tiles: Sequence[int], replica_id: int,
            num_replicas: int) -> dict[str, Any]:
    coords, row, col = mesh_place(device, mesh_shape)
    itemsize = _DTYPE_BYTES.get(dtype, 4)
    shard_shape = [-(-s // t) for s, t in zip(shape, tiles, strict=True)]
    return {
        "tensor": name, "tensor_kind": tensor_kind, "shape": list(shape), "dtype": dtype,
        "partition": partition_text(partition),
        "partition_spec": _partition_json(partition, len(shape)), "spec": xla_spec,
        "device": device, "device_name": device_name,
        "mesh_coords": coords, "row": row, "col": col, "index": index,
        "index_label": index_label(index, shape), "shard_shape": shard_shape,
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
    used = [a for e in partition for a in entry_axes(e)]
    unused = [a for a in names if a not in used]
    tiles = [axis_product(e, mesh_shape) for e in partition]
    num_replicas = math.prod(mesh_shape[names.index(a)] for a in unused)
    records = []
    for d in range(math.prod(mesh_shape)):
        coords, _, _ = mesh_place(d, mesh_shape)
        index = []
        for size, entry, t in zip(shape, partition, tiles, strict=True):
            piece = 0
            for a in entry_axes(entry):
                i = names.index(a)
                piece = piece * mesh_shape[i] + coords[i]
            step = -(-size // t) if t else size
            index.append([min(piece * step, size), min((piece + 1) * step, size)])
        replica = 0
        for a in unused:
            i = names.index(a)
            replica = replica * mesh_shape[i] + coords[i]
        records.append(layout_record(name, tensor_kind, shape, dtype, partition, "",
                               d, f"{device_prefix}:{d}", mesh_shape, index, tiles, replica,
                               num_replicas))
    return records


def tile_shape(xla_spec: str, rank: int) -> list[int]:
    """How many pieces each dim is split into, read from an XLA sharding annotation."""
    match = re.search(r"devices=\[([\d,]+)\]", xla_spec or "")
    if not match:
        return [1] * rank
    return [int(x) for x in match.group(1).split(",")][:rank]


LAYOUT_COLUMNS = ["tensor", "tensor_kind", "shape", "dtype", "partition", "partition_spec",
                  "spec", "device",
                  "device_name", "mesh_coords", "row", "col", "index", "index_label",
                  "shard_shape", "shard_bytes", "data_bytes", "replica_id", "num_replicas"]


def _records_of(result_or_records: Any) -> list[dict[str, Any]]:
    return list(getattr(result_or_records, "records", result_or_records) or [])


def tensors_by_size(layout: pd.DataFrame) -> list[str]:
    """The tensors of a layout frame, largest per-device buffer first."""
    sizes = layout.groupby("tensor", sort=False)["shard_bytes"].max()
    return list(sizes.sort_values(ascending=False, kind="stable").index)


def largest_split_tensor(layout: pd.DataFrame) -> str:
    """The parameter a layout picture shows by default: the largest one split over devices (the
    largest of all where none is split; the first tensor where there is no parameter)."""
    params = layout[layout["tensor_kind"] == "param"]
    if params.empty:
        return str(layout["tensor"].iloc[0])
    per = params.groupby("tensor", sort=False).agg(
        pieces=("index_label", "nunique"), size=("data_bytes", "max"))
    split = per[per["pieces"] > 1]
    return str((split if len(split) else per)["size"].idxmax())


def device_holdings(layout: pd.DataFrame, device_name: str) -> pd.DataFrame:
    """What one device holds: a row per tensor of a layout frame (its kind, full shape, the
    slice this device holds, the slice's shape and bytes, how many devices hold that same
    slice), largest first. Raises ValueError naming the devices for an unknown one."""
    rows = layout[layout["device_name"] == device_name]
    if rows.empty:
        devices = ", ".join(dict.fromkeys(layout["device_name"]))
        raise ValueError(f"no device {device_name!r} in this layout; devices: {devices}")
    out = rows[["tensor", "tensor_kind", "shape", "index_label", "shard_shape", "shard_bytes",
                "num_replicas"]].rename(columns={"index_label": "slice held",
                                                 "num_replicas": "devices holding it"})
    return out.sort_values("shard_bytes", ascending=False, kind="stable", ignore_index=True)


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
