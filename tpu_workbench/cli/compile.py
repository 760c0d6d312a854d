"""``tpu-workbench compile``: a model's training step compiled by libtpu for a named TPU slice,
with no chip: memory.json, ops.csv, collectives.csv, buffers.csv and tpu_hlo.txt."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..runs.spec import OPTIMIZERS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="hf:llama", help="model family (default: hf:llama)")
    parser.add_argument("--preset", default="tiny", help="size preset (default: tiny)")
    parser.add_argument("--slice", default="v6e-8", help="TPU slice: v6e-8, v6e-16, v5p-8...")
    parser.add_argument("--strategy", default="fsdp",
                        help="dp, fsdp, tp or dp_tp; table, row or column for a model with "
                             "embedding tables (dlrm)")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (even)")
    parser.add_argument("--batch", type=int, default=8,
                        help="global batch (sequences; samples for dlrm, which has no --seq-len)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                        help="bfloat16: mixed precision (default for hf:*); float32")
    parser.add_argument("--attention", default=None, choices=("eager", "sdpa", "flash"),
                        help="hf:* attention; flash: torch_xla's Pallas kernel")
    parser.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS,
                        help="adamw (two moments per weight) or adafactor (a row and a "
                             "column per matrix: torchprime's v6e runs)")
    parser.add_argument("--remat", action="store_true",
                        help="activation checkpointing per block (hf:*)")
    parser.add_argument("--layers", type=int, default=None,
                        help="compile this many blocks instead of the model's own")
    parser.add_argument("--libtpu-flags", default="",
                        help="compiler flags, space-separated: '--xla_...=value ...'")
    parser.add_argument("--out", type=Path, default=Path("tpu-compile"), help="output folder")


def compile(args: argparse.Namespace) -> int:  # noqa: A001 - the subcommand's name
    from ..environment.paths import writable_folder
    from ..tpu_compile import tpu_compile

    options = {}
    if args.attention:
        options["attn_implementation"] = args.attention
    if args.remat:
        options["remat"] = True
    out = writable_folder(args.out)
    c = tpu_compile(args.model, args.preset, args.slice, args.strategy, args.seq_len,
                    args.batch, args.dtype, layers=args.layers, options=options,
                    optimizer=args.optimizer,
                    libtpu_flags=args.libtpu_flags.split(),
                    on_progress=lambda m: print(m, file=sys.stderr, flush=True))
    memory = {**c.memory, "provenance": c.provenance()}
    written = {"memory.json": json.dumps(memory, indent=1, default=str),
               "ops.csv": c.ops.to_csv(index=False),
               "collectives.csv": c.collectives.drop(columns=["replica_groups"]).to_csv(
                   index=False),
               "buffers.csv": c.buffers.to_csv(index=False), "tpu_hlo.txt": c.hlo_text}
    for name, text in written.items():  # each file whole or not at all
        tmp = out / f"{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)
    m = c.memory
    print(c.label)
    print(f"per chip: {_size(m['total_bytes'])} of the {_size(m['hbm_bytes'])} of HBM a program "
          f"may use (arguments {_size(m['arguments'])}, outputs {_size(m['outputs'])} of which "
          f"{_size(m['aliased'])} aliased, temporaries {_size(m['temp'])})")
    print(f"{c.compiled['cost']['flops'] / 1e12:.3g} TFLOP per chip by the compiler's count, "
          f"{c.ops['flops'].sum() / 1e12:.3g} with every loop trip; {len(c.ops)} ops, "
          f"{len(c.collectives)} collectives ("
          + ", ".join(f"{n} {k}" for k, n in c.collectives["kind"].value_counts().items())
          + f"); compiled in {c.compiled['compile_s']:.0f} s"
          + (" (cached)" if c.cached else ""))
    print("wrote " + ", ".join(str(out / n) for n in written))
    return 0


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"
