"""A predicted TPU step time from the SPMD-partitioned HLO of one training step: a roofline per
op and the ring model for the collectives XLA inserted. Pure: takes frames and primitives (a
chip, a slice, a mesh), never an ExperimentSpec; :mod:`tpu_workbench.planning.predict` compiles the
step and calls it.

Every number it makes is a prediction, and :func:`assumptions` lists what it assumes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..environment.chips import Chip, Slice, get_chip
from ..errors import SpecError
from ..sharding.collectives import ICI_HOP_US, _axis_of, _group_axes, collective_time_us
from ..sharding.mesh import axis_names

if TYPE_CHECKING:
    import pandas as pd

# An f32 matmul on the MXU is several bf16 passes: torch_xla's "highest" mat-mul precision for
# 32-bit inputs takes six (torch_xla.backends.set_mat_mul_precision), so f32 ops get 1/6 of the
# bf16 peak here. "high" (3 passes) or "default" (1) would be faster.
FP32_DERATE = 6.0

# Opcodes the ICI model times; everything else of the entry computation is compute or HBM.
COLLECTIVE_OPS = re.compile(r"^(all-reduce|all-gather|reduce-scatter|all-to-all|"
                            r"collective-permute|collective-broadcast)(-start|-done)?$")

PREDICTION_COLUMNS = [
    "slice", "chip", "chips", "strategy", "mesh", "predicted_compute_ms", "predicted_hbm_ms",
    "predicted_roofline_ms", "predicted_ici_ms", "predicted_step_ms", "predicted_step_min_ms",
    "predicted_step_max_ms", "predicted_mfu_min", "predicted_mfu_max", "bottleneck",
    "flops_per_device", "bytes_per_device", "collective_bytes_per_device"]


def op_times(ops: pd.DataFrame, chip: str | Chip = "v6e", fp32_derate: float = FP32_DERATE,
             dtype: str | None = None) -> pd.DataFrame:
    """The roofline of every op of a per-device program: ``compute_s`` = FLOPs / peak (the
    chip's bf16 peak for bf16 ops, peak / `fp32_derate` for f32 ones), ``hbm_s`` = bytes / HBM
    bandwidth, ``time_s`` = their max, ``bound`` (``compute`` or ``hbm``). `ops` has
    ``opcode``, ``shape``, ``flops`` and ``bytes`` (as :func:`tpu_workbench.hlo.per_op_cost`
    gives them); collectives are left out (the ICI model times them).

    An op is f32 when its result is (32- or 64-bit), unless `dtype` (``"bfloat16"`` or
    ``"float32"``) says what the model trains in: XLA:CPU's optimised HLO computes bf16 dots
    in f32 (it has no bf16 matmul), which a TPU would not."""
    c = get_chip(chip) if isinstance(chip, str) else chip
    keep = ~ops["opcode"].astype(str).str.match(COLLECTIVE_OPS.pattern)
    out = ops[keep].copy()
    wide = out["shape"].astype(str).str.contains(r"\b(?:f32|f64|s32|u32|s64|u64)\[")
    if dtype is not None:
        if dtype not in ("bfloat16", "float32"):
            raise SpecError(f"dtype must be 'bfloat16' or 'float32', got {dtype!r}")
        wide[:] = dtype == "float32"
    peak = c.peak_flops / wide.map({True: fp32_derate, False: 1.0}).astype(float)
    out["compute_s"] = out["flops"].astype(float).fillna(0.0) / peak
    out["hbm_s"] = out["bytes"].astype(float).fillna(0.0) / (c.hbm_gbps * 1e9)
    out["time_s"] = out[["compute_s", "hbm_s"]].max(axis=1)
    out["bound"] = (out["compute_s"] >= out["hbm_s"]).map({True: "compute", False: "hbm"})
    return out.reset_index(drop=True)


def physical_axes(groups: list[list[int]] | None, group_size: int, mesh_shape: Sequence[int],
                  topology: Sequence[int]) -> tuple[tuple[int, ...], str]:
    """The physical torus axes one collective's groups run over, and the logical axis name.

    A 1-D mesh spans every physical axis of the slice (an all-reduce over a 4x4 v6e-16 runs
    two rings of 4 at once); on a 2-D (data, model) mesh the model axis is the last physical
    axis and the data axis the others (:attr:`tpu_workbench.environment.chips.Slice.mesh_2d`)."""
    mesh_shape, topology = tuple(mesh_shape), tuple(topology)
    names = axis_names(mesh_shape)
    spanned = _group_axes(groups, group_size, mesh_shape)
    if len(mesh_shape) == 1:
        return (topology if spanned == mesh_shape else spanned), names[0]
    axis = _axis_of(groups, mesh_shape) if groups else "all"
    if axis == "all" or spanned == mesh_shape:
        return topology, "all"
    physical = {names[0]: topology[:-1], names[-1]: topology[-1:]}
    if axis in physical and math.prod(physical[axis]) == group_size:
        return tuple(physical[axis]), axis
    return spanned, "other"


def collective_times(collectives: pd.DataFrame, mesh_shape: Sequence[int],
                     topology: Sequence[int], chip: str | Chip = "v6e") -> pd.DataFrame:
    """Each collective of `collectives` (:func:`tpu_workbench.sharding.collectives_frame`:
    ``kind``, ``buffer_bytes``, ``replica_groups``, ``group_size``) timed with the ring model
    over the physical axes it spans (:func:`physical_axes`): adds ``physical_axes``,
    ``ici_axis`` and ``ici_s``."""
    out = collectives.copy()
    spans = [physical_axes(g, int(n), mesh_shape, topology)
             for g, n in zip(out["replica_groups"], out["group_size"], strict=True)]
    out["physical_axes"] = ["x".join(map(str, s)) for s, _ in spans]
    out["ici_axis"] = [a for _, a in spans]
    out["ici_s"] = [collective_time_us(k, float(b), s, chip) / 1e6
                    for k, b, (s, _) in zip(out["kind"], out["buffer_bytes"], spans, strict=True)]
    return out


def totals(ops: pd.DataFrame, collectives: pd.DataFrame) -> dict[str, float]:
    """The additive totals of one compiled program that :func:`predict_step` and
    :func:`extrapolate` work with: ``compute_s`` and ``hbm_s`` (time of the compute-bound and
    of the HBM-bound ops), ``flops``, ``bytes``, ``collective_bytes`` and ``ici_s:<axis>`` per
    logical mesh axis, from :func:`op_times` and :func:`collective_times`."""
    out = {"compute_s": float(ops.loc[ops["bound"] == "compute", "time_s"].sum()),
           "hbm_s": float(ops.loc[ops["bound"] == "hbm", "time_s"].sum()),
           "flops": float(ops["flops"].sum()), "bytes": float(ops["bytes"].sum()),
           "collective_bytes": float(collectives["bytes"].sum()) if len(collectives) else 0.0}
    if len(collectives):
        for axis, t in collectives.groupby("ici_axis")["ici_s"].sum().items():
            out[f"ici_s:{axis}"] = float(t)
    return out


def extrapolate(one: Mapping[str, float], two: Mapping[str, float],
                layers: int) -> dict[str, float]:
    """Totals of a model of `layers` blocks from compiles of the same model with one and two
    blocks: what one block adds is ``two - one``, and embeddings, head and loss are in ``one``
    once: ``one + (layers - 1) * (two - one)`` for every total."""
    if not isinstance(layers, int) or layers < 1:
        raise SpecError(f"layers must be a positive int, got {layers!r}")
    keys = set(one) | set(two)
    return {k: one.get(k, 0.0) + (layers - 1) * (two.get(k, 0.0) - one.get(k, 0.0))
            for k in sorted(keys)}


def predict_step(total: Mapping[str, float], chip: str | Chip, chips: int,
                 recompute_factor: float = 1.0) -> dict[str, Any]:
    """Predicted step time of one device's program from its `total` (:func:`totals`).

    ``predicted_compute_ms`` (compute-bound ops), ``predicted_hbm_ms`` (HBM-bound ops),
    ``predicted_roofline_ms`` (their sum: compute only, no communication),
    ``predicted_ici_ms`` (every collective, one after another), ``predicted_step_max_ms``
    (no overlap: roofline + ICI), ``predicted_step_min_ms`` (perfect overlap: the larger),
    ``predicted_step_ms`` (= the no-overlap figure, the safe one to plan with), the MFU range
    (all of XLA's FLOPs on all `chips` over bf16 peak, at the two step times) and the
    ``bottleneck``: ICI on an axis if communication outweighs computation, else compute or HBM,
    whichever ops take longer. `recompute_factor` scales compute and HBM time (activation
    recomputation runs the forward pass again) but not the MFU's FLOPs.
    """
    c = get_chip(chip) if isinstance(chip, str) else chip
    compute = total["compute_s"] * recompute_factor
    hbm = total["hbm_s"] * recompute_factor
    ici = {k.split(":", 1)[1]: v for k, v in total.items() if k.startswith("ici_s:")}
    comm = sum(ici.values())
    roof = compute + hbm
    slow, fast = roof + comm, max(roof, comm)
    if comm > roof:
        axis = max(ici, key=ici.get)
        bottleneck = f"ICI ({'every axis' if axis == 'all' else axis + ' axis'})"
    else:
        bottleneck = "compute" if compute >= hbm else "HBM"
    model_flops = total["flops"] * chips

    def mfu(t: float) -> float:
        return model_flops / (chips * c.peak_flops * t) if t > 0 else math.nan

    return {"predicted_compute_ms": compute * 1e3, "predicted_hbm_ms": hbm * 1e3,
            "predicted_roofline_ms": roof * 1e3, "predicted_ici_ms": comm * 1e3,
            "predicted_step_ms": slow * 1e3, "predicted_step_min_ms": fast * 1e3,
            "predicted_step_max_ms": slow * 1e3, "predicted_mfu_min": mfu(slow),
            "predicted_mfu_max": mfu(fast), "bottleneck": bottleneck,
            "flops_per_device": total["flops"], "bytes_per_device": total["bytes"],
            "collective_bytes_per_device": total.get("collective_bytes", 0.0)}


def strategy_mesh(slice_: Slice, strategy: str) -> tuple[int, ...]:
    """The logical mesh a strategy uses on a slice: every chip on one data axis for dp and
    fsdp, the slice's (data, model) mesh for tp and dp_tp."""
    return slice_.mesh_2d if strategy in ("tp", "dp_tp") else (slice_.chips,)


def assumptions(chip: str | Chip = "v6e", fp32_derate: float = FP32_DERATE) -> list[str]:
    """What every prediction assumes, one sentence each (listed under every chart)."""
    c = get_chip(chip) if isinstance(chip, str) else chip
    return [
        "Predicted, not measured: per-device FLOPs and bytes from XLA's cost analysis of the "
        "SPMD-partitioned step as XLA:CPU compiled it (its fusions, not a TPU's).",
        f"Per op: max(FLOPs / peak, bytes / HBM bandwidth) on {c.name}: {c.bf16_tflops:g} "
        f"TFLOP/s for a bf16 model, 1/{fp32_derate:g} of it for an f32 one (six bf16 MXU "
        f"passes, torch_xla's 'highest' precision); {c.hbm_gbps:g} GB/s HBM. Bytes as XLA:CPU "
        "fused the step (it upcasts bf16 math to f32), attention as the model computes it "
        "(its S x S scores pass through HBM; a flash-attention kernel would keep them on chip).",
        f"Collectives XLA inserted, timed with the ring model on {c.name} ICI "
        f"({c.ici_link_gbps:g} GB/s per link and direction); axes shorter than "
        f"{c.wraparound_from} chips have no wrap-around (one direction, N-1 hops); "
        f"{ICI_HOP_US:g} µs per hop; a 1-D mesh spans every physical axis of the slice.",
        "No overlap = compute + communication; perfect overlap = the larger of the two. MFU: "
        "XLA's FLOPs of all chips over their bf16 peak.",
        "Large models: one and two blocks compiled at full width on the real mesh of virtual "
        "devices, the difference scaled to the model's blocks (embeddings and head once).",
        "Adam's moments are created inside the compiled step (no buffers allocated), so their "
        "HBM reads are not counted; activation recomputation, where asked, scales compute and "
        "HBM time by 4/3 (the forward pass again).",
    ]


def calibration(predicted: Mapping[str, Any], measured_ms: float) -> dict[str, Any]:
    """Predicted vs measured step time of one plan (a row of :func:`tpu_workbench.predict`
    and the steady median of the same spec measured on the chip): ``error`` is measured over
    the no-overlap prediction minus 1, ``in_range`` whether the measurement fell between
    perfect overlap and no overlap."""
    if not (isinstance(measured_ms, int | float) and measured_ms > 0):
        raise SpecError(f"measured_ms must be a positive number of ms, got {measured_ms!r}")
    low, high = float(predicted["predicted_step_min_ms"]), float(predicted["predicted_step_max_ms"])
    return {"predicted_step_min_ms": low, "predicted_step_max_ms": high,
            "measured_step_ms": float(measured_ms), "error": measured_ms / high - 1,
            "in_range": low <= measured_ms <= high,
            "bottleneck": predicted.get("bottleneck", "")}
