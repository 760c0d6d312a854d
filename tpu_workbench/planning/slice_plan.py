"""A plan on a multi-host slice, before anything runs: the mesh over every chip, and the
collectives one training step needs there with their ICI time (the ring model of
:mod:`tpu_workbench.sharding.collectives`, with its no-wrap-around rule for axes shorter than
16 chips on v5e/v6e). Pure, primitives in; :func:`model_step_collectives` counts a family's
parameters on the meta device."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..environment.chips import Slice, get_slice
from ..errors import SpecError
from ..sharding.ici import collective_time_us, ici_assumptions, span_text
from ..sharding.mesh import (
    TP_STRATEGIES,
    TWO_D_STRATEGIES,
    batch_ways,
    mesh_groups,
    mesh_text,
    parse_mesh,
    slice_mesh,
    strategy_name,
)


def check_mesh(mesh: str | Sequence[int] | None, strategy: str, sl: Slice) -> tuple[int, ...]:
    """The mesh a plan uses: `mesh`, which must hold exactly the slice's chips (one device
    per chip of every host), or by default the strategy's mesh on the slice (every chip on the
    data axis for dp and fsdp, the slice's (data, model) mesh for tp and dp_tp)."""
    if mesh is None:
        return slice_mesh(sl, strategy)
    shape = parse_mesh(mesh)
    n = math.prod(shape)
    if n != sl.chips:
        pairs = [f"{a}x{sl.chips // a}" for a in range(1, sl.chips + 1) if sl.chips % a == 0]
        raise SpecError(f"mesh {mesh_text(shape)} has {n} devices but {sl.name} has "
                        f"{sl.chips} chips ({sl.hosts} host(s) x {sl.chips_per_host}); a mesh "
                        f"over the whole slice: {sl.chips} or one of {', '.join(pairs)}")
    if strategy in TWO_D_STRATEGIES and len(shape) != 2:
        raise SpecError(f"strategy {strategy!r} needs a 2-D (data, model) mesh, got "
                        f"{mesh_text(shape)}; on {sl.name}: {mesh_text(sl.mesh_2d)}")
    return shape


# --------------------------------------------------------------------------------------------
def step_collectives(n_params: int, hidden: int, layers: int, slice_name: str, strategy: str,
                     batch_size: int, seq_len: int, bytes_per_value: float = 4,
                     mesh: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """The collectives one training step needs on a slice, per kind, with ICI estimates.

    Analytic (not XLA's inserted collectives, which the layout sections count): gradients
    all-reduced over the data axis (dp; dp_tp: each chip's 1/model share of them); fsdp
    gathers the parameters for the forward and again for the backward pass and
    reduce-scatters the gradients (ZeRO-3); tensor parallelism all-reduces a layer's
    activations twice forward and twice backward over the model axis (Megatron-LM, the
    batch one data shard sees). Times: :func:`~tpu_workbench.sharding.collective_time_us`
    of one group of the mesh axis on the slice's torus, as every view times a collective.
    One row per kind: ``collective``, ``kind``, ``axis``, ``physical_axes``, ``count``,
    ``bytes`` (each), ``estimated_us`` (each), ``total_us``."""
    sl = get_slice(slice_name)
    strategy = strategy_name(strategy)
    shape = check_mesh(mesh, strategy, sl)
    groups = mesh_groups(shape)
    rows: list[dict[str, Any]] = []

    def add(what: str, kind: str, axis: str, count: int, nbytes: float) -> None:
        group = None if axis == "all" else groups[axis][0]
        each = collective_time_us(kind, nbytes, group, sl.topology, sl.chip)
        rows.append({"collective": what, "kind": kind, "axis": axis,
                     "physical_axes": span_text(group, sl.topology), "count": count,
                     "bytes": float(nbytes), "estimated_us": each, "total_us": count * each})

    grads = n_params * bytes_per_value
    data, model = shape if len(shape) == 2 else (shape[0], 1)
    if strategy in ("fsdp", "ep"):  # parameters split over every chip, whatever the mesh
        add("parameters, forward", "all-gather", "all", 1, grads)
        add("parameters, backward", "all-gather", "all", 1, grads)
        add("gradients", "reduce-scatter", "all", 1, grads)
    if strategy == "ep":  # tokens to their experts and back, forward and backward
        add("tokens to and from the experts (4 per layer)", "all-to-all", "model", 4 * layers,
            batch_size // batch_ways(strategy, shape) * seq_len * hidden * bytes_per_value)
    if strategy == "fsdp_tp":  # each chip's 1/model share, split over the data axis
        add("parameters, forward (1/model share)", "all-gather", "data", 1, grads / model)
        add("parameters, backward (1/model share)", "all-gather", "data", 1, grads / model)
        add("gradients (1/model share)", "reduce-scatter", "data", 1, grads / model)
    if strategy in TP_STRATEGIES:
        local_batch = batch_size // batch_ways(strategy, shape)
        add("activations (2 per layer forward, 2 backward)", "all-reduce", "model",
            4 * layers, local_batch * seq_len * hidden * bytes_per_value)
    if strategy in ("dp", "dp_tp") and data > 1:  # the model axis, if any, holds replicas
        add("gradients" + (" (each chip's 1/model share)" if model > 1 and strategy == "dp_tp"
                           else ""), "all-reduce", "data", 1,
            grads / (model if strategy == "dp_tp" else 1))
    return rows


def collective_assumptions(chip: str = "v6e") -> str:
    """What :func:`step_collectives` assumes, for a caption under its table."""
    return ("Analytic, not XLA's collectives: dp all-reduces the gradients, fsdp all-gathers "
            "the parameters twice and reduce-scatters the gradients, tp all-reduces each "
            "layer's activations 4 times per step (no sequence parallelism, no overlap). "
            + ici_assumptions(chip))


def model_step_collectives(model: str, preset: str, slice_name: str, strategy: str,
                           batch_size: int, seq_len: int, dtype: str | None = None):
    """:func:`step_collectives` of a transformer family's preset as a DataFrame: its parameters
    counted on the meta device, its width and depth as the family declares them, values in its
    planning dtype (bf16 for hf:*, fp32 for minGPT) unless `dtype` says."""
    import pandas as pd

    from .. import models
    from ..sharding.fit import STATE_BYTES

    family = models.get_model(model)
    shape = family.block_shape(family.config(preset))
    dtype = dtype or family.planning_dtype
    if dtype not in STATE_BYTES:
        raise SpecError(f"dtype must be one of {', '.join(STATE_BYTES)}, got {dtype!r}")
    n_params = models.count_params(model, preset)
    rows = step_collectives(n_params, shape.hidden, shape.layers, slice_name, strategy,
                            batch_size, seq_len, STATE_BYTES[dtype][1])  # gradient bytes
    return pd.DataFrame(rows).assign(model=model, preset=preset, params=n_params)
