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
table    embedding tables stacked on a table dim:    split over every device (dense layers data
         that dim over every device (whole tables    parallel)
         per device); every other one replicated
row      each table's rows over every device         as table
column   each table's columns over every device      as table
=======  ==========================================  ============================================

The embedding strategies split only what a family declares (:mod:`.embedding`); a model without
tables is refused.

tp and dp_tp need a 2-D mesh (data, model); dp and fsdp take a 1-D or 2-D mesh. minGPT's
attention is split along its fused q/k/v output rows, not regrouped per head, so XLA adds some
resharding of its own; widths must still divide by the model axis (checked by :func:`validate`).

Where things run: :func:`validate`, :func:`param_specs`, :func:`predicted_layout`,
:func:`shard_tensor_spec` and everything that reads results (:func:`layout_frame`,
:func:`memory_per_device`, :func:`collectives_frame`, :func:`fits`) never import torch_xla;
:mod:`tpu_workbench.worker.spmd` applies a strategy in the worker (``mark_sharding``) and
reads back what torch_xla made of it.

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

from .collectives import (
    COLLECTIVE_COLUMNS,
    collectives_by_source,
    collectives_frame,
)
from .embedding import (
    embedding_partition,
    lookup_ops,
    table_sizes,
    validate_embedding,
)
from .fit import (
    ADAFACTOR_STATE_BYTES,
    CONVENTION,
    EMBEDDING_CONVENTION,
    STATE_BYTES,
    activation_bytes,
    embedding_fit_table,
    fit_table,
    fits,
    logits_bytes,
    model_fit_table,
    parameter_shards,
    tpu_padded,
)
from .ici import (
    ICI_HOP_US,
    collective_time_us,
    ici_assumptions,
    physical_span,
    slice_topology,
    span_text,
)
from .layout import (
    LAYOUT_COLUMNS,
    device_holdings,
    largest_split_tensor,
    layout_frame,
    predicted_layout,
    shard_tensor_spec,
    tensors_by_size,
    tile_shape,
)
from .memory import (
    MEMORY_COLUMNS,
    memory_per_device,
    step_file,
    xla_memory_parts,
)
from .mesh import (
    ALL_STRATEGIES,
    AXES_1D,
    AXES_2D,
    DEFAULT_STRATEGY,
    EMBEDDING_STRATEGIES,
    MESHES,
    STRATEGIES,
    TP_STRATEGIES,
    TWO_D_STRATEGIES,
    Partition,
    axis_names,
    axis_product,
    batch_axes,
    batch_partition,
    batch_ways,
    check_partition,
    entry_axes,
    group_axis,
    index_label,
    mesh_groups,
    mesh_place,
    mesh_text,
    parse_mesh,
    partition_text,
    slice_mesh,
    strategy_name,
)
from .strategies import (
    ROW_PARALLEL,
    buffer_specs,
    model_strategies,
    param_specs,
    plan,
    strategies_for,
    validate,
)
from .summary import (
    loss_agreement,
    summary_frame,
)

__all__ = [
    "ADAFACTOR_STATE_BYTES",
    "CONVENTION",
    "EMBEDDING_CONVENTION",
    "EMBEDDING_STRATEGIES",
    "embedding_fit_table",
    "TPU_TILE",
    "tpu_padded",
    "embedding_partition",
    "lookup_ops",
    "table_sizes",
    "validate_embedding",
    "STATE_BYTES",
    "activation_bytes",
    "fit_table",
    "logits_bytes",
    "model_fit_table",
    "parameter_shards",
    "largest_split_tensor", "device_holdings", "collectives_by_source",
    "tensors_by_size",
    "ALL_STRATEGIES",
    "AXES_1D",
    "AXES_2D",
    "DEFAULT_STRATEGY",
    "MESHES",
    "Partition",
    "STRATEGIES",
    "TP_STRATEGIES",
    "TWO_D_STRATEGIES",
    "axis_names",
    "axis_product",
    "batch_axes",
    "batch_ways",
    "batch_partition",
    "check_partition",
    "entry_axes",
    "index_label",
    "group_axis",
    "mesh_groups",
    "mesh_place",
    "mesh_text",
    "parse_mesh",
    "partition_text",
    "slice_mesh",
    "strategy_name",
    "ROW_PARALLEL",
    "buffer_specs",
    "param_specs",
    "plan",
    "strategies_for",
    "model_strategies",
    "validate",
    "LAYOUT_COLUMNS",
    "layout_frame",
    "predicted_layout",
    "shard_tensor_spec",
    "tile_shape",
    "MEMORY_COLUMNS",
    "fits",
    "memory_per_device",
    "step_file",
    "xla_memory_parts",
    "COLLECTIVE_COLUMNS",
    "ICI_HOP_US",
    "collective_time_us",
    "collectives_frame",
    "ici_assumptions",
    "physical_span",
    "slice_topology",
    "span_text",
    "summary_frame",
    "loss_agreement",
]
