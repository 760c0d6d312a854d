"""A predicted TPU step time from the TPU program of one training step: a roofline per op and
the ring model for its collectives. Pure: takes frames and primitives (a chip, a slice, a
mesh), never an ExperimentSpec; :mod:`tpu_workbench.planning.predict` compiles the step and
calls it, and lists what every prediction assumes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ..environment.chips import Chip, get_chip
from ..errors import SpecError
from ..sharding.ici import collective_time_us

# bf16 passes of the MXU per f32 matmul, by torch_xla's mat-mul precision for 32-bit inputs
# (torch_xla.backends.set_mat_mul_precision's documentation: "default" downcasts to bf16, "high"
# takes three passes, "highest" six). torch_xla 2.9 runs "default" unless a program sets another,
# and the workbench sets none.
MATMUL_PASSES = {"default": 1, "high": 3, "highest": 6}

# Opcodes the ICI model times; everything else of the entry computation is compute or HBM.
COLLECTIVE_OPS = re.compile(r"^(all-reduce|all-gather|reduce-scatter|all-to-all|"
                            r"collective-permute|collective-broadcast)(-start|-done)?$")

PREDICTION_COLUMNS = [
    "slice", "chip", "chips", "strategy", "mesh", "predicted_compute_ms", "predicted_hbm_ms",
    "predicted_roofline_ms", "predicted_ici_ms", "predicted_step_ms", "predicted_step_min_ms",
    "predicted_step_max_ms", "predicted_mfu", "predicted_mfu_min", "predicted_mfu_max",
    "bottleneck",
    "flops_per_device", "bytes_per_device", "collective_bytes_per_device"]


def op_times(ops: pd.DataFrame, chip: str | Chip = "v6e", precision: str = "default",
             dtype: str | None = None) -> pd.DataFrame:
    """The roofline of every op of a per-device program: ``compute_s`` = FLOPs / peak (the
    chip's bf16 peak for bf16 ops; for f32 ones, that over :data:`MATMUL_PASSES` of torch_xla's
    mat-mul `precision`), ``hbm_s`` = bytes / HBM
    bandwidth, ``time_s`` = their max, ``bound`` (``compute`` or ``hbm``). `ops` has
    ``opcode``, ``shape``, ``flops`` and ``bytes`` (as :func:`tpu_workbench.hlo.per_op_cost`
    gives them); collectives are left out (the ICI model times them).

    An op is f32 when its result is (32- or 64-bit), unless `dtype` (``"bfloat16"`` or
    ``"float32"``) says how all its matmuls run (a TPU program's f32 results often come from
    bf16 matmuls: mixed precision, or torch_xla's default precision)."""
    c = get_chip(chip) if isinstance(chip, str) else chip
    if precision not in MATMUL_PASSES:
        raise SpecError(f"precision must be one of {', '.join(MATMUL_PASSES)}, got "
                        f"{precision!r}")
    keep = ~ops["opcode"].astype(str).str.match(COLLECTIVE_OPS.pattern)
    out = ops[keep].copy()
    wide = out["shape"].astype(str).str.contains(r"\b(?:f32|f64|s32|u32|s64|u64)\[")
    if dtype is not None:
        if dtype not in ("bfloat16", "float32"):
            raise SpecError(f"dtype must be 'bfloat16' or 'float32', got {dtype!r}")
        wide[:] = dtype == "float32"
    peak = c.peak_flops / wide.map({True: MATMUL_PASSES[precision], False: 1}).astype(float)
    out["compute_s"] = out["flops"].astype(float).fillna(0.0) / peak
    out["hbm_s"] = out["bytes"].astype(float).fillna(0.0) / (c.hbm_gbps * 1e9)
    out["time_s"] = out[["compute_s", "hbm_s"]].max(axis=1)
    out["bound"] = (out["compute_s"] >= out["hbm_s"]).map({True: "compute", False: "hbm"})
    return out.reset_index(drop=True)


def totals(ops: pd.DataFrame, collectives: pd.DataFrame) -> dict[str, float]:
    """The additive totals of one compiled program that :func:`predict_step` and
    :func:`extrapolate` work with: ``compute_s`` and ``hbm_s`` (time of the compute-bound and
    of the HBM-bound ops), ``flops``, ``bytes``, ``collective_bytes``, and the ICI time of the
    collectives per logical mesh axis, ``ici_s:<axis>`` for those the program waits on and
    ``ici_async_s:<axis>`` for asynchronous ones (a ``-start`` whose ``-done`` comes later:
    compute may hide them), from :func:`op_times` and the collectives' ICI estimates
    (:func:`tpu_workbench.sharding.collectives_frame` on the slice's topology)."""
    out = {"compute_s": float(ops.loc[ops["bound"] == "compute", "time_s"].sum()),
           "hbm_s": float(ops.loc[ops["bound"] == "hbm", "time_s"].sum()),
           "flops": float(ops["flops"].sum()), "bytes": float(ops["bytes"].sum()),
           "collective_bytes": float(collectives["bytes"].sum()) if len(collectives) else 0.0}
    if len(collectives):
        is_async = collectives.get("is_async", pd.Series(False, index=collectives.index))
        key = is_async.map({True: "ici_async_s:", False: "ici_s:"})
        for (k, axis), t in collectives.groupby([key, "axis"])["estimated_us"].sum().items():
            out[f"{k}{axis}"] = float(t) / 1e6
    return out


def widen_collectives(collectives: pd.DataFrame, chip: str | Chip, mesh: Sequence[int],
                      wide_mesh: Sequence[int], topology: Sequence[int]) -> pd.DataFrame:
    """`collectives` of a program compiled on `mesh`, re-timed for the same program on
    `wide_mesh` (the same model axis, a longer data axis) over a slice of `topology`: a
    collective over every device, or along the data axis, moves the same buffer (a gathered
    weight, a gradient before its reduce-scatter) around the longer ring of the wide mesh;
    the others (along the model axis, a permute between two chips) are unchanged."""
    out = collectives.copy()
    if not len(out):
        return out
    topology = tuple(int(a) for a in topology)
    n, wide = math.prod(mesh), math.prod(wide_mesh)
    axis = out["axis"] if "axis" in out else pd.Series("", index=out.index)
    everyone = (out["group_size"] == n) | (axis == "all")
    along_data = (axis == "data") & ~everyone & (len(mesh) == 2)
    # Row-major device ids: the data axis's first group is every model_axis-th device.
    data_group = list(range(0, wide, int(wide_mesh[-1])))
    for rows, group, size in ((everyone, None, wide), (along_data, data_group, len(data_group))):
        out.loc[rows, "estimated_us"] = [
            collective_time_us(k, b, group, topology, chip)
            for k, b in zip(out.loc[rows, "kind"], out.loc[rows, "buffer_bytes"], strict=True)]
        out.loc[rows, "group_size"] = size
    return out


def extrapolate(one: Mapping[str, float], two: Mapping[str, float], layers: int,
                first: int = 1) -> dict[str, float]:
    """Totals of a model of `layers` blocks from compiles of the same model with `first` and
    ``first + 1`` blocks: what one block adds is ``two - one``, and embeddings, head and loss
    are in ``one`` once: ``one + (layers - first) * (two - one)`` for every total."""
    if not isinstance(layers, int) or layers < 1:
        raise SpecError(f"layers must be a positive int, got {layers!r}")
    keys = set(one) | set(two)
    return {k: one.get(k, 0.0) + (layers - first) * (two.get(k, 0.0) - one.get(k, 0.0))
            for k in sorted(keys)}


def predict_step(total: Mapping[str, float], chip: str | Chip, chips: int, model_flops: float,
                 efficiency: float = 1.0) -> dict[str, Any]:
    """Predicted step time of one device's program from its `total` (:func:`totals`).

    ``predicted_compute_ms`` (compute-bound ops, at `efficiency` of the peak),
    ``predicted_hbm_ms`` (HBM-bound ops), ``predicted_roofline_ms`` (their sum: no
    communication), ``predicted_ici_ms`` (every collective, one after another),
    ``predicted_step_ms`` (the estimate: roofline + the collectives the program waits on + what
    of the asynchronous ones the roofline cannot hide), ``predicted_step_max_ms`` (no overlap:
    roofline + ICI), ``predicted_step_min_ms`` (perfect overlap: the larger), the MFU at each
    (the model's own FLOPs per step, `model_flops`, over the bf16 peak of all `chips`: work a
    strategy repeats on several chips, tp's replicas over the data axis, is not useful work)
    and the ``bottleneck``: ICI on an axis if communication outweighs computation, else
    compute or HBM, whichever ops take longer.
    """
    c = get_chip(chip) if isinstance(chip, str) else chip
    if not 0 < efficiency <= 1:
        raise SpecError(f"efficiency must be in (0, 1], got {efficiency!r}")
    compute = total["compute_s"] / efficiency
    hbm = total["hbm_s"]
    waited = {k.split(":", 1)[1]: v for k, v in total.items() if k.startswith("ici_s:")}
    hidden = {k.split(":", 1)[1]: v for k, v in total.items() if k.startswith("ici_async_s:")}
    ici = {a: waited.get(a, 0.0) + hidden.get(a, 0.0) for a in {*waited, *hidden}}
    comm = sum(ici.values())
    roof = compute + hbm
    slow, fast = roof + comm, max(roof, comm)
    step = roof + sum(waited.values()) + max(0.0, sum(hidden.values()) - roof)
    if comm > roof:
        axis = max(ici, key=ici.get)
        bottleneck = f"ICI ({'every axis' if axis == 'all' else axis + ' axis'})"
    else:
        bottleneck = "compute" if compute >= hbm else "HBM"

    def mfu(t: float) -> float:
        return model_flops / (chips * c.peak_flops * t) if t > 0 else math.nan

    return {"predicted_compute_ms": compute * 1e3, "predicted_hbm_ms": hbm * 1e3,
            "predicted_roofline_ms": roof * 1e3, "predicted_ici_ms": comm * 1e3,
            "predicted_step_ms": step * 1e3, "predicted_step_min_ms": fast * 1e3,
            "predicted_step_max_ms": slow * 1e3, "predicted_mfu": mfu(step),
            "predicted_mfu_min": mfu(slow), "predicted_mfu_max": mfu(fast),
            "bottleneck": bottleneck, "flops_per_device": total["flops"],
            "bytes_per_device": total["bytes"],
            "collective_bytes_per_device": total.get("collective_bytes", 0.0)}


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
