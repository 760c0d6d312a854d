"""``tpu-workbench predict``: predicted step time, MFU and bottleneck of a model per TPU slice
and strategy, from its step compiled for each slice by libtpu (never run), with the compiler's
memory per chip; predict.csv and a chart."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SpecError
from ..runs.spec import OPTIMIZERS

if TYPE_CHECKING:
    import pandas as pd

SHOWN = ["slice", "strategy", "mesh", "fits", "compiler_memory_gb", "estimated_memory_gb",
         "predicted_step_ms", "predicted_step_min_ms", "predicted_step_max_ms", "predicted_mfu",
         "bottleneck", "predict_s"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mingpt", help="model family (default: mingpt)")
    parser.add_argument("--preset", default="gpt-mini", help="size preset (default: gpt-mini)")
    parser.add_argument("--slice", default="v6e-8",
                        help="TPU slice(s), comma-separated: v6e-8,v6e-16 (see chips.SLICES)")
    parser.add_argument("--strategy", default="fsdp",
                        help="strategies, comma-separated: dp, fsdp, tp, dp_tp, fsdp_tp, ep "
                             "(models with embedding tables, dlrm: also table, row, column; "
                             "their memory per chip from the sharding plan; wb.predict also "
                             "times their compiled step)")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (even)")
    parser.add_argument("--batch", type=int, default=None,
                        help="global batch (default: 32 sequences; dlrm: its preset's batch)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                        help="training dtype (default: bfloat16 for hf:*, else float32)")
    parser.add_argument("--recompute", action="store_true",
                        help="activation checkpointing per block (hf:* remat)")
    parser.add_argument("--attention", default=None, choices=("eager", "sdpa", "flash"),
                        help="hf:* attention; flash: torch_xla's Pallas kernel")
    parser.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS,
                        help="adamw (two moments per weight) or adafactor (a row and a "
                             "column per matrix: torchprime's v6e runs)")
    parser.add_argument("--whole", action="store_true",
                        help="compile the whole model, not one and two blocks")
    parser.add_argument("--model-axis", type=int, default=None,
                        help="chips on the model axis of tp, dp_tp, fsdp_tp and ep (default: "
                             "the slice's last physical axis)")
    parser.add_argument("--libtpu-flags", default="",
                        help="compiler flags, space-separated: '--xla_...=value ...'")
    parser.add_argument("--estimate-only", action="store_true",
                        help="models with embedding tables (dlrm): memory per chip from the "
                             "plan only, instant (default: also the step compiled and timed "
                             "for each plan that fits)")
    parser.add_argument("--titan-config", default=None,
                        help="a TorchTitan TOML (or a shipped one: llama3_8b, llama3_70b): its "
                             "flavor, degrees, batch, sequence length and activation "
                             "checkpointing replace --model ... --recompute (tpu_workbench."
                             "planning.titan)")
    parser.add_argument("--out", type=Path, default=Path("predict"), help="output folder")


def _embedding_fit(args: argparse.Namespace, slices: list[str],
                   strategies: list[str]) -> pd.DataFrame:
    """A model with embedding tables (dlrm): memory per chip from the GSPMD plan, per slice and
    strategy, printed and written to fit.csv (instant: nothing compiles)."""
    from ..sharding import EMBEDDING_CONVENTION, embedding_fit_table

    frame = embedding_fit_table(args.model, args.preset, slices, strategies)
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "fit.csv.tmp"
    frame.to_csv(tmp, index=False)
    tmp.replace(args.out / "fit.csv")
    print(f"ESTIMATED (not compiled, not measured) memory per chip for {args.model} "
          f"{args.preset}:")
    cols = [c for c in ("slice", "strategy", "mesh", "tables_gb", "dense_gb", "state_gb",
                        "usable_gb", "fits") if c in frame]
    print(frame[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for _, row in frame[~frame["fits"]].iterrows():
        print(f"  {row['slice']} {row['strategy']}: does not fit: {row['reason']}")
    print(f"Convention: {EMBEDDING_CONVENTION}\nwrote {args.out / 'fit.csv'}")
    return frame


def _titan(args: argparse.Namespace, slices: list[str]) -> int:
    """``--titan-config``: the plan of a TorchTitan TOML on each slice."""
    from ..planning.titan import titan_plan

    started = time.perf_counter()
    frame = titan_plan(args.titan_config, slices,
                       on_progress=lambda m: print(m, file=sys.stderr, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "predict.csv.tmp"
    frame.to_csv(tmp, index=False)
    tmp.replace(args.out / "predict.csv")
    row = frame.iloc[0]
    print(f"PREDICTED (not measured) for TorchTitan {row['titan_config']} ({row['preset']}, "
          f"seq {row['seq_len']}):")
    shown = ["slice", "titan_layout", "strategy", "mesh", "batch_size", *[
        c for c in SHOWN[3:] if c in frame and frame[c].notna().any()]]
    print(frame[shown].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for _, r in frame[~frame["fits"].astype(bool)].iterrows():
        print(f"  {r['slice']} {r['titan_layout']}: {r['reason']}")
    print("TorchTitan -> plan: " + row["titan_notes"])
    if frame.attrs.get("assumptions"):
        print("Assumptions:\n" + "\n".join(f"  - {a}" for a in frame.attrs["assumptions"]))
    print(f"{time.perf_counter() - started:.0f} s; wrote {args.out / 'predict.csv'}")
    return 0


def predict(args: argparse.Namespace) -> int:
    import pandas as pd

    from ..charts._common import save_chart
    from ..charts.predict import predicted_step_times
    from ..planning.predict import predict as run_predict

    slices = [s for s in args.slice.split(",") if s.strip()]
    strategies = [s for s in args.strategy.split(",") if s.strip()]
    if not slices or not strategies:
        raise SpecError("--slice and --strategy need at least one name each")
    if args.titan_config:
        return _titan(args, slices)
    from .. import models

    family = models.get_model(args.model)
    cfg = family.config(args.preset)
    tables = bool(family.embedding_tables(cfg))
    batch = args.batch if args.batch is not None else (cfg.batch_size if tables else 32)
    plans = None
    if tables:  # the instant estimate first; the step compiled only where it fits
        fit = _embedding_fit(args, slices, strategies)
        if args.estimate_only:
            return 0
        plans = fit[fit["fits"]]
        if not len(plans):
            print("No plan fits by the estimate: nothing to compile.")
            return 0
    started = time.perf_counter()
    frames = [run_predict(args.model, args.preset, slices=s, strategies=t,
                          seq_len=args.seq_len, batch_size=batch, dtype=args.dtype,
                          recompute=args.recompute, attention=args.attention,
                          whole=args.whole or None, libtpu_flags=args.libtpu_flags.split(),
                          model_axis=args.model_axis, optimizer=args.optimizer,
                          on_progress=lambda m: print(m, file=sys.stderr, flush=True))
              for s, t in ([(slices, strategies)] if plans is None else
                           [([r.slice], [r.strategy]) for r in plans.itertuples()])]
    frame = pd.concat(frames, ignore_index=True)
    frame.attrs = frames[0].attrs
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "predict.csv.tmp"
    frame.to_csv(tmp, index=False)
    tmp.replace(args.out / "predict.csv")  # whole or not at all
    written = [args.out / "predict.csv"]
    if frame["predicted_step_ms"].notna().any():
        written += save_chart(predicted_step_times(frame), args.out, "predict")
    print(f"PREDICTED (not measured) for {args.model} {args.preset}, global batch "
          f"{batch}" + ("" if tables else f", seq {args.seq_len}") + ":")
    shown = [c for c in SHOWN if c in frame and frame[c].notna().any()]
    print(frame[shown].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for _, row in frame[~frame["fits"]].iterrows():
        print(f"  {row['slice']} {row['strategy']}: does not fit: {row['reason']}")
    print("Assumptions:\n" + "\n".join(f"  - {a}" for a in frame.attrs["assumptions"]))
    print(f"{time.perf_counter() - started:.0f} s; wrote " + ", ".join(map(str, written)))
    return 0
