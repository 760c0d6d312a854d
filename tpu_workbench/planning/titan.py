"""Plan a TorchTitan config for a TPU slice: its TOML read (flavor, parallel degrees, batch,
sequence length, activation checkpointing, torch.compile) and answered as any model is, by
:func:`tpu_workbench.planning.predict.predict` (the step compiled by libtpu for the slice,
never run): fits, memory per chip, predicted step time.

The mapping, one line each (every row's ``titan_notes`` repeats what applies to it):

- flavor: TorchTitan's Llama 3 ``8B`` / ``70B`` / ``405B`` are Transformers' Llama 3.1 of the
  same shapes (``hf:llama`` presets ``llama-3.1-8b``...; ``tests/test_titan.py`` checks the
  shapes); ``debugmodel`` is ``hf:llama`` with its six layers of width 256;
- degrees over the slice's chips, as TorchTitan resolves them (``data_parallel_shard_degree``
  -1 takes what the others leave): FSDP2 alone is ``fsdp``, TP alone ``tp`` (mesh 1 x tp),
  FSDP2 x TP ``fsdp_tp`` (every weight split over both axes) with tp chips on the model axis;
  pipeline and context parallelism and replicated data parallelism are not modelled (refused);
- the global batch: ``local_batch_size`` x the data-parallel degree (or ``global_batch_size``,
  which must then need no gradient accumulation);
- activation checkpointing: ``full`` is per-block recompute; ``selective`` (TorchTitan keeps
  some matmul outputs) is planned as per-block recompute too, the lower bound of its memory;
  ``none`` keeps every activation;
- attention: TorchTitan attends with FlexAttention, a fused kernel that keeps no S x S scores;
  the plan compiles torch_xla's Pallas flash attention, the TPU's fused equivalent;
- ``compile.enable``: the plan is the whole step compiled by XLA either way (what TorchTPU's
  ``torch.compile(backend="tpu")`` runs); eager TorchTPU op by op is not modelled;
- mixed precision: TorchTitan's FSDP2 default (bf16 compute, fp32 weights, gradients reduced
  in fp32) is the plan's ``bfloat16`` (fp32 weights and AdamW moments, bf16 compute).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..environment.chips import get_slice
from ..errors import SpecError
from ..runs.workers import WorkerPool
from ..titan import config as titan_config
from .predict import predict

MODEL = "hf:llama"
PRESETS = {"8B": "llama-3.1-8b", "70B": "llama-3.1-70b", "405B": "llama-3.1-405b",
           "debugmodel": "tiny"}
# TorchTitan's debugmodel as a Transformers Llama (tiny preset's fields replaced).
DEBUG_OPTIONS = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 6,
                 "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 2048,
                 "tie_word_embeddings": False, "max_position_embeddings": 131072}
TITAN_COLUMNS = ["titan_config", "titan_layout", "titan_degrees", "titan_notes"]
# TorchTitan's shipped Llama-3 TOMLs planned for a v6e-8 and a v6e-256, as
# ``python scripts/bench_titan.py --plan --record`` last compiled them (what the scale-out
# notebook shows on open: minutes of compiles per row).
RECORDED = Path(__file__).resolve().parent / "titan_plans.csv"
RECORDED_CONFIGS = ("llama3_8b", "llama3_70b")
RECORDED_SLICES = ("v6e-8", "v6e-256")


def plan_layout(degrees: dict[str, int]) -> tuple[str, int | None]:
    """(the workbench's strategy, the chips on its model axis) for TorchTitan's degrees."""
    if degrees["pp"] > 1 or degrees["cp"] > 1 or degrees["dp_replicate"] > 1:
        raise SpecError(f"{titan_config.strategy_label(degrees)}: the plan models FSDP2 "
                        "(data_parallel_shard_degree) and TP (tensor_parallel_degree); pipeline "
                        "and context parallelism and replicated data parallelism are not "
                        "modelled")
    tp = degrees["tp"]
    if tp == 1:
        return "fsdp", None
    return ("tp" if degrees["dp_shard"] == 1 else "fsdp_tp"), tp


def titan_plan(config: str | Path, slices: Sequence[str] = ("v6e-8",), *,
               attention: str = "flash", pool: WorkerPool | None = None,
               timeout: float = 1800.0,
               on_progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """:func:`~tpu_workbench.planning.predict.predict`'s frame for a TorchTitan TOML (a path, a
    shipped name such as ``llama3_8b``, or TOML text) on each of `slices`, plus
    :data:`TITAN_COLUMNS` (the config, TorchTitan's layout on that slice, its degrees, what the
    mapping assumed). A slice whose chips cannot hold even the weights and optimizer state by
    the estimate gets a row that says so, with nothing compiled, and so does one libtpu fails to
    compile (``reason`` begins "does not fit:" or "no plan:"). SpecError, before anything
    compiles, for a bad TOML, degrees that do not divide a slice, or what is not modelled."""
    cfg = titan_config.read(config)
    plans = []
    for name in slices:  # every check before any compile
        sl = get_slice(name)
        degrees = titan_config.resolve_degrees(cfg, sl.chips)
        strategy, axis = plan_layout(degrees)
        local, total = titan_config.batch(cfg, degrees)
        if total != local * degrees["dp_shard"]:
            raise SpecError(f"{cfg.name}: training.global_batch_size {total} accumulates "
                            "gradients over several local batches, which the plan does not model")
        plans.append((sl, degrees, strategy, axis, total))
    notes = _notes(cfg, attention)
    frames = []
    for sl, degrees, strategy, axis, total in plans:
        kwargs: dict[str, Any] = dict(
            slices=[sl.name], strategies=[strategy], seq_len=cfg.seq_len, batch_size=total,
            dtype="bfloat16", recompute=cfg.ac_mode != "none", attention=attention,
            model_axis=axis, pool=pool, timeout=timeout, on_progress=on_progress,
            options=DEBUG_OPTIONS if cfg.flavor == "debugmodel" else None)
        try:
            frame = predict(MODEL, PRESETS[cfg.flavor], **kwargs)
        except SpecError as exc:
            # the estimate refused every plan, or libtpu failed on the program (0.0.51's sort
            # comparator, u32 against s32, on large fsdp x tp steps): a row that says which
            if str(exc).startswith("no plan fits"):
                reason = f"does not fit: {exc}"
            elif str(exc).startswith("libtpu") and "could not compile" in str(exc):
                reason = f"no plan: {exc}"
            else:
                raise
            frame = pd.DataFrame([{
                "slice": sl.name, "chip": sl.chip, "chips": sl.chips, "strategy": strategy,
                "mesh": "x".join(map(str, (sl.chips // (axis or 1), axis) if axis
                                     else (sl.chips,))),
                "model": MODEL, "preset": PRESETS[cfg.flavor], "batch_size": total,
                "seq_len": cfg.seq_len, "fits": False, "reason": reason, "executions": 0}])
        frame = frame.assign(titan_config=cfg.name,
                             titan_layout=titan_config.strategy_label(degrees),
                             titan_degrees=" x ".join(f"{k} {v}" for k, v in degrees.items()),
                             titan_notes="; ".join(notes))
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    out.attrs = next((f.attrs for f in frames if f.attrs), {})
    return out


def _notes(cfg: titan_config.TitanConfig, attention: str) -> list[str]:
    notes = [f"{cfg.flavor} planned as {MODEL} {PRESETS[cfg.flavor]}"
             + (" with the debug model's shapes" if cfg.flavor == "debugmodel" else "")]
    if cfg.ac_mode == "selective":
        notes.append("selective activation checkpointing planned as per-block recompute (its "
                     "memory's lower bound)")
    if attention == "flash":
        notes.append("FlexAttention planned as the Pallas flash attention (fused, no S x S "
                     "scores)")
    if not cfg.compile:
        notes.append("compile.enable false: the plan is the XLA-compiled step (eager TorchTPU "
                     "is not modelled)")
    return notes



def recorded_plans() -> pd.DataFrame:
    """:data:`RECORDED`: the plans of TorchTitan's Llama-3 TOMLs as last compiled (every
    column of :func:`titan_plan`, plus ``recorded_at``)."""
    return pd.read_csv(RECORDED)
