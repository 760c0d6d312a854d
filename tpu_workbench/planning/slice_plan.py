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
from ..sharding.collectives import collective_time_us, ici_assumptions
from ..sharding.mesh import mesh_text, parse_mesh, strategy_name
from .steptime import strategy_mesh


def check_mesh(mesh: str | Sequence[int] | None, strategy: str, sl: Slice) -> tuple[int, ...]:
    """The mesh a plan uses: `mesh`, which must hold exactly the slice's chips (one device
    per chip of every host), or by default the strategy's mesh on the slice (every chip on the
    data axis for dp and fsdp, the slice's (data, model) mesh for tp and dp_tp)."""
    if mesh is None:
        return strategy_mesh(sl, strategy)
    shape = parse_mesh(mesh)
    n = math.prod(shape)
    if n != sl.chips:
        pairs = [f"{a}x{sl.chips // a}" for a in range(1, sl.chips + 1) if sl.chips % a == 0]
        raise SpecError(f"mesh {mesh_text(shape)} has {n} devices but {sl.name} has "
                        f"{sl.chips} chips ({sl.hosts} host(s) x {sl.chips_per_host}); a mesh "
                        f"over the whole slice: {sl.chips} or one of {', '.join(pairs)}")
    if strategy in ("tp", "dp_tp") and len(shape) != 2:
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
    batch one data shard sees). Times: :func:`collective_time_us` over the physical axes the
    mesh axis lies along (a 1-D mesh: every axis of the slice; 2-D: the model axis along the
    last physical axis), so an axis shorter than the chip's wrap-around length runs one way.
    One row per kind: ``collective``, ``kind``, ``axis``, ``physical_axes``, ``count``,
    ``bytes`` (each), ``estimated_us`` (each), ``total_us``."""
    sl = get_slice(slice_name)
    strategy = strategy_name(strategy)
    shape = check_mesh(mesh, strategy, sl)
    topo = sl.topology
    rows: list[dict[str, Any]] = []

    def add(what: str, kind: str, axis: str, physical: tuple[int, ...], count: int,
            nbytes: float) -> None:
        each = collective_time_us(kind, nbytes, physical, sl.chip)
        rows.append({"collective": what, "kind": kind, "axis": axis,
                     "physical_axes": "x".join(map(str, physical)), "count": count,
                     "bytes": float(nbytes), "estimated_us": each, "total_us": count * each})

    grads = n_params * bytes_per_value
    data, model = shape if len(shape) == 2 else (shape[0], 1)
    data_axes = topo if len(shape) == 1 else tuple(topo[:-1])  # a 1-D mesh spans them all
    if strategy == "fsdp":  # parameters split over every chip, whatever the mesh's shape
        add("parameters, forward", "all-gather", "all", topo, 1, grads)
        add("parameters, backward", "all-gather", "all", topo, 1, grads)
        add("gradients", "reduce-scatter", "all", topo, 1, grads)
    if strategy in ("tp", "dp_tp"):
        local_batch = batch_size // data if strategy == "dp_tp" else batch_size
        add("activations (2 per layer forward, 2 backward)", "all-reduce", "model",
            tuple(topo[-1:]), 4 * layers, local_batch * seq_len * hidden * bytes_per_value)
    if strategy in ("dp", "dp_tp") and data > 1:  # the model axis, if any, holds replicas
        add("gradients" + (" (each chip's 1/model share)" if model > 1 and strategy == "dp_tp"
                           else ""), "all-reduce", "data", data_axes, 1,
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
    """:func:`step_collectives` of a transformer family's preset as a DataFrame: its
    parameters counted on the meta device, its width and depth, bf16 values for hf:* families
    (their planning dtype) and fp32 otherwise, unless `dtype` says."""
    import pandas as pd
    import torch

    from .. import models, sharding

    family = models.get_model(model)
    cfg = family.config(preset)
    shape = sharding.transformer_shape(family, cfg)
    with torch.device("meta"):  # shapes only: Llama-3-8B in a second
        n_params = sum(p.numel() for p in family.build(cfg).parameters())
    dtype = dtype or ("bfloat16" if hasattr(family, "hf_config") else "float32")
    rows = step_collectives(n_params, shape["hidden"], shape["layers"], slice_name, strategy,
                            batch_size, seq_len, 2 if dtype == "bfloat16" else 4)
    return pd.DataFrame(rows).assign(model=model, preset=preset, params=n_params)
