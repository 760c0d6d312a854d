"""Memory per device from a run's layouts (and XLA's own report), and whether a model of
n parameters fits a slice's HBM."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..environment.chips import SLICES as CHIP_SLICES
from ..errors import SpecError

if TYPE_CHECKING:
    import pandas as pd

from .layout import layout_frame
from .mesh import mesh_text, parse_mesh, strategy_name

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
        report = step_file(Path(hlo_dir), "memory-usage-report.txt")
        if report is not None:
            from .. import hlo

            xla_total = float(hlo.memory_report(report.read_text())["total_bytes"])
    frame["xla_total_bytes"] = xla_total
    return frame.sort_values("device").reset_index(drop=True)[MEMORY_COLUMNS]


def step_file(hlo_dir: Path, suffix: str) -> Path | None:
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
    from ..environment.chips import get_chip

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


def xla_memory_parts(result_or_hlo_dir: Any) -> dict[str, float] | None:
    """XLA's own memory total for a run's train step, split the way a reader can check it
    against :func:`memory_per_device` (for display; None where the run captured no HLO).

    From the step's ``memory-usage-report.txt``, each allocation counted once (the report lists
    the largest ones twice): ``arguments_bytes`` (the program's parameters: the model's
    parameters, Adam's moments and the batch, as laid out on a device), ``outputs_bytes``
    (buffers the step returns that are not written in place: the updated weights and moments),
    ``temporaries_bytes`` (everything else: activations, gradients and intermediates, mostly one
    preallocated block) and ``total_bytes`` (the report's own total).
    """
    hlo_dir = result_or_hlo_dir
    if getattr(result_or_hlo_dir, "out_dir", None) is not None:
        hlo_dir = Path(result_or_hlo_dir.out_dir) / "hlo"
    report = step_file(Path(hlo_dir), "memory-usage-report.txt") if hlo_dir else None
    if report is None:
        return None
    from .. import hlo

    parsed = hlo.memory_report(report.read_text())
    allocs = parsed["allocations"].drop_duplicates("allocation")
    arguments = allocs["kind"] == "parameter"
    outputs = ~arguments & allocs["maybe_live_out"]
    return {"arguments_bytes": float(allocs.loc[arguments, "size_bytes"].sum()),
            "outputs_bytes": float(allocs.loc[outputs, "size_bytes"].sum()),
            "temporaries_bytes": float(allocs.loc[~arguments & ~outputs, "size_bytes"].sum()),
            "total_bytes": float(parsed["total_bytes"])}


# The slices a plan is checked on by default: name -> (data, model) mesh, from the one slice
# table (tpu_workbench.environment.chips.SLICES, which fit_table also accepts). dp and fsdp use all
# the slice's chips as one data axis.
SLICES = {name: CHIP_SLICES[name].mesh_2d for name in ("v6e-8", "v6e-16", "v6e-32")}


def activation_bytes(batch_size: int, seq_len: int, hidden: int, layers: int, heads: int,
                     tp: int = 1, bytes_per_value: float = 2, recompute: bool = False) -> float:
    """Activations one training step keeps for its backward pass in a decoder-only transformer,
    with no recomputation: ``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` bytes per layer for 16-bit
    activations and tensor parallelism `t` (Korthikanti et al. 2022, "Reducing Activation
    Recomputation in Large Transformer Models", eqs. 1-2), scaled by ``bytes_per_value / 2``.
    `batch_size` is the batch one device sees. ``recompute=True`` (full activation
    checkpointing) keeps only each layer's input, ``2*s*b*h`` bytes. An estimate: embeddings,
    the logits and XLA's temporaries come on top."""
    s, b, h, a, t = seq_len, batch_size, hidden, heads, tp
    per_layer = 2 * s * b * h if recompute else s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    return layers * per_layer * bytes_per_value / 2


def fit_table(n_params: int, batch_size: int, seq_len: int, hidden: int, layers: int,
              heads: int, kv_heads: int | None = None, slices: Sequence[str] = tuple(SLICES),
              strategies: Sequence[str] = ("dp", "fsdp", "tp", "dp_tp"),
              recompute: bool = False, **fits_kwargs: Any) -> pd.DataFrame:
    """Does a transformer of `n_params` train on each slice with each strategy? One row per
    (slice, strategy): per-chip GB of params, grads, Adam state and activations (the global
    `batch_size` split over the data axis; see :func:`activation_bytes`, and `recompute`),
    ``fits`` and why.
    tp and dp_tp need the model axis to divide `heads` and `kv_heads` (GQA); where it does not,
    the row says so (``fits`` False). Other keywords go to :func:`fits` (e.g. bf16 params)."""
    import pandas as pd

    rows = []
    for name in slices:
        if name not in CHIP_SLICES:
            raise SpecError(f"unknown slice {name!r}; valid: {', '.join(CHIP_SLICES)}")
        data, model = CHIP_SLICES[name].mesh_2d
        devices = data * model
        for strategy in strategies:
            strategy = strategy_name(strategy)
            split = strategy in ("tp", "dp_tp")
            mesh = (data, model) if split else (devices,)
            t = model if split else 1
            batch_ways = {"dp": devices, "fsdp": devices, "tp": 1, "dp_tp": data}[strategy]
            row = {"slice": name, "strategy": strategy, "mesh": mesh_text(mesh)}
            bad = [f"{k}={v}" for k, v in (("heads", heads), ("kv_heads", kv_heads))
                   if split and v is not None and v % t]
            if bad or batch_size % batch_ways:
                why = (f"{' and '.join(bad)} not divisible by the model axis {t}" if bad else
                       f"batch {batch_size} does not split {batch_ways} ways")
                rows.append({**row, "fits": False, "reason": why})
                continue
            act = activation_bytes(batch_size // batch_ways, seq_len, hidden, layers, heads, t,
                                   recompute=recompute)
            f = fits(n_params, strategy, mesh, activation_bytes=act,
                     **{"chip": CHIP_SLICES[name].chip, **fits_kwargs})
            rows.append({**row, "fits": f["fits"],
                         **{k.replace("_bytes", "_gb"): f[k] / 1e9 for k in (
                             "per_device_bytes", "params_bytes", "grads_bytes",
                             "optimizer_bytes", "activation_bytes", "usable_bytes")},
                         "reason": f["reason"]})
    return pd.DataFrame(rows)


def transformer_shape(family: Any, cfg: Any) -> dict[str, int]:
    """Hidden width, layers, heads and KV heads of a transformer family's config: a Hugging
    Face family's Transformers config (``hf_config``), or minGPT's fields."""
    hf = family.hf_config(cfg) if hasattr(family, "hf_config") else None
    if hf is not None:
        heads = hf.num_attention_heads
        return {"hidden": hf.hidden_size, "layers": hf.num_hidden_layers, "heads": heads,
                "kv_heads": getattr(hf, "num_key_value_heads", None) or heads}
    if all(hasattr(cfg, k) for k in ("n_embd", "n_layer", "n_head")):
        return {"hidden": cfg.n_embd, "layers": cfg.n_layer, "heads": cfg.n_head,
                "kv_heads": cfg.n_head}
    raise SpecError(f"model {family.name!r} is not a transformer family (hf:*, mingpt): a fit "
                    "plan needs its hidden width, layers and heads")


def model_fit_table(model: str, preset: str, batch_size: int, seq_len: int,
                    **kwargs: Any) -> pd.DataFrame:
    """:func:`fit_table` for a transformer family's preset: its parameters counted on the meta
    device (shapes only: Llama-3-8B in a second) and its shape. Keywords go to fit_table."""
    import torch

    from .. import models

    family = models.get_model(model)
    cfg = family.config(preset)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in family.build(cfg).parameters())  # tied counted once
    table = fit_table(n_params, batch_size, seq_len, **transformer_shape(family, cfg), **kwargs)
    return table.assign(model=model, preset=preset, params=n_params)
