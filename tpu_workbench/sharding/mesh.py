"""Meshes, strategies' names and partition specs: pure Python, no torch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import SpecError

STRATEGIES: dict[str, str] = {
    "dp": "data parallel: parameters replicated, batch split over the data axis",
    "fsdp": "fully sharded data parallel: parameters split over all devices, batch too",
    "tp": "tensor parallel (Megatron): layers split over the model axis, batch replicated",
    "dp_tp": "data x tensor parallel: tp over the model axis, batch split over the data axis",
    "fsdp_tp": "fully sharded x tensor parallel: tp over the model axis, every weight also "
               "split over the data axis, batch split over the data axis",
    "ep": "expert parallel: a mixture-of-experts layer's experts split over the model axis "
          "(tokens travel to them by all-to-all), every weight also split over the data axis "
          "(other weights over every device), batch split over every device",
}
# Strategies on the (data, model) mesh: the model axis splits layers (tp) or experts (ep).
TWO_D_STRATEGIES = ("tp", "dp_tp", "fsdp_tp", "ep")
# Strategies whose model axis splits the layers Megatron-style (heads, MLP widths).
TP_STRATEGIES = ("tp", "dp_tp", "fsdp_tp")
# Strategies that split only a family's declared embedding tables (ModelFamily.embedding_tables),
# each along the dim of its name's role; the dense layers and the batch are data parallel.
EMBEDDING_STRATEGIES: dict[str, str] = {
    "table": "table-wise: whole embedding tables per device (a stack of tables split on its "
             "table axis), dense layers and the batch data parallel over every device",
    "row": "row-wise: each embedding table's rows split over every device, dense layers and the "
           "batch data parallel",
    "column": "column-wise: each embedding table's columns (its width) split over every device, "
              "dense layers and the batch data parallel",
}
ALL_STRATEGIES: dict[str, str] = {**STRATEGIES, **EMBEDDING_STRATEGIES}


DEFAULT_STRATEGY = "dp"


AXES_1D = ("data",)


AXES_2D = ("data", "model")


def _named_meshes() -> dict[str, tuple[int, ...]]:
    """The (data, model) mesh of every v6e slice XLA:CPU can stand in for (at most 64 virtual
    devices), from the one slice table: ``v6e-8`` is (2, 4), ``v6e-16`` (4, 4)."""
    from ..environment.chips import SLICES

    return {name: s.mesh_2d for name, s in SLICES.items() if s.chip == "v6e" and s.chips <= 64}


MESHES: dict[str, tuple[int, ...]] = _named_meshes()


def slice_mesh(slice_: Any, strategy: str | None,
               model_axis: int | None = None) -> tuple[int, ...]:
    """The mesh a strategy uses over a slice's chips (a :class:`~tpu_workbench.environment.chips.
    Slice`): every chip on one data axis for dp and fsdp, a (data, model) mesh for the 2-D
    strategies (:data:`TWO_D_STRATEGIES`) with `model_axis` chips on the model axis (default the
    slice's last physical axis); the embedding strategies split tables and the batch over every
    chip, one axis. SpecError for a `model_axis` that does not divide the chips."""
    if strategy_name(strategy) not in TWO_D_STRATEGIES:
        return (slice_.chips,)
    if model_axis is None:
        return slice_.mesh_2d
    if not isinstance(model_axis, int) or isinstance(model_axis, bool) or model_axis < 1 \
            or slice_.chips % model_axis:
        raise SpecError(f"model_axis={model_axis!r} must be a positive int dividing "
                        f"{slice_.name}'s {slice_.chips} chips")
    return (slice_.chips // model_axis, model_axis)


Partition = tuple[Any, ...]  # one entry per dim: None, an axis name, or a tuple of axis names


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


def strategy_name(strategy: str | None) -> str:
    """A strategy's name (None means ``dp``), checked against :data:`ALL_STRATEGIES`."""
    name = DEFAULT_STRATEGY if strategy is None else strategy
    if name not in ALL_STRATEGIES:
        raise SpecError(f"unknown strategy {name!r}; valid strategies: "
                        f"{', '.join(ALL_STRATEGIES)} (None means dp)")
    return name


def _all_devices(mesh_shape: Sequence[int]) -> Any:
    """The partition entry that splits one dim over every device (axes flattened)."""
    names = axis_names(mesh_shape)
    return names[0] if len(names) == 1 else names


def batch_axes(strategy: str, mesh_shape: Sequence[int]) -> tuple[str, ...]:
    """Mesh axes the batch (dim 0 of each input) is split over under `strategy`."""
    names = axis_names(mesh_shape)
    strategy = strategy_name(strategy)
    if strategy in ("fsdp", "ep") or strategy in EMBEDDING_STRATEGIES:
        return names
    if strategy == "tp":
        return ()
    return ("data",)


def batch_ways(strategy: str, mesh_shape: Sequence[int]) -> int:
    """How many slices the batch is cut into under `strategy` (each device's batch is the
    global batch over this): the product of :func:`batch_axes`' sizes."""
    names = axis_names(mesh_shape)
    return math.prod(mesh_shape[names.index(a)] for a in batch_axes(strategy, mesh_shape))


def batch_partition(strategy: str, mesh_shape: Sequence[int], ndim: int) -> Partition:
    """Partition spec of an input of rank `ndim`: dim 0 on :func:`batch_axes`, the rest whole."""
    axes = batch_axes(strategy, mesh_shape)
    first = None if not axes else axes[0] if len(axes) == 1 else axes
    return (first,) + (None,) * (ndim - 1)


def entry_axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple | list) else (entry,)


def axis_product(entry: Any, mesh_shape: Sequence[int]) -> int:
    """How many pieces a dim with partition `entry` is split into."""
    names = axis_names(mesh_shape)
    return math.prod(mesh_shape[names.index(a)] for a in entry_axes(entry))


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
        for a in entry_axes(entry):
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


def mesh_place(device: int, mesh_shape: Sequence[int]) -> tuple[list[int], int, int]:
    coords, rest = [], device
    for size in reversed(mesh_shape):
        coords.append(rest % size)
        rest //= size
    coords.reverse()
    row, col = (coords[0], coords[1]) if len(coords) == 2 else (0, coords[0])
    return coords, row, col


def mesh_groups(mesh_shape: Sequence[int]) -> dict[str, list[list[int]]]:
    """The groups of devices a collective runs within: for each mesh axis (``data``,
    ``model``) the devices that differ only in that axis's coordinate, then ``all`` devices
    (on a 1-D mesh the same group as ``data``, which comes first)."""
    n = math.prod(mesh_shape)
    out: dict[str, list[list[int]]] = {}
    for i, axis in enumerate(axis_names(mesh_shape)):
        groups: dict[tuple[int, ...], list[int]] = {}
        for d in range(n):
            coords = mesh_place(d, mesh_shape)[0]
            groups.setdefault(tuple(c for j, c in enumerate(coords) if j != i), []).append(d)
        out[axis] = list(groups.values())
    out["all"] = [list(range(n))]
    return out


def group_axis(groups: Sequence[Sequence[int]], mesh_shape: Sequence[int] | None) -> str:
    """The mesh axis collectives over `groups` of devices run along: ``data``, ``model``,
    ``all`` (every device; on a 1-D mesh its one axis, ``data``), ``other`` (e.g. the pairs of a
    collective-permute). `groups` may be some of an axis's groups (a gang rank sees its own)."""
    if not mesh_shape or not groups:
        return ""
    names = axis_names(mesh_shape)
    given = {tuple(sorted(g)) for g in groups}
    if given == {tuple(range(math.prod(mesh_shape)))}:
        return names[0] if len(names) == 1 else "all"
    named = mesh_groups(mesh_shape)
    for axis in names:
        if given <= {tuple(sorted(g)) for g in named[axis]}:
            return axis
    return "other"


def index_label(index: list[list[int]], shape: Sequence[int]) -> str:
    parts = [":" if (a, b) == (0, s) else f"{a}:{b}" for (a, b), s in zip(index, shape,
                                                                         strict=True)]
    return ", ".join(parts) if parts else "scalar"
