"""``tpu-workbench titan``: TorchTitan's own trainer over a gang of torchrun ranks, its metrics
streamed into the workbench's records; losses, memory per rank and the run's folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..environment.paths import writable_folder
from ..titan import DEFAULT_CONFIG, SHIPPED


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help=f"a TorchTitan TOML (its own format), or a shipped one: "
                             f"{', '.join(SHIPPED)} (default: {DEFAULT_CONFIG})")
    parser.add_argument("--ranks", type=int, default=4, help="processes (torchrun ranks)")
    parser.add_argument("--dp-shard", type=int, default=None,
                        help="FSDP2 degree (default: the TOML's; -1: what tp leaves)")
    parser.add_argument("--tp", type=int, default=None, help="tensor-parallel degree")
    parser.add_argument("--pp", type=int, default=None,
                        help="pipeline-parallel degree (refused: fails on torch 2.13)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0, help="TorchTitan's debug.seed")
    parser.add_argument("--batch", type=int, default=None,
                        help="global batch in sequences (default: the TOML's local batch x "
                             "the data-parallel ranks)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence")
    parser.add_argument("--out", type=Path, required=True, help="output folder")


def titan(args: argparse.Namespace) -> int:
    from .. import charts
    from ..titan import runs
    from ..titan.spec import titan_spec

    out = writable_folder(args.out)
    # bad input (a TOML key, degrees, no .venv-torchtpu) fails here, before any rank starts
    spec = titan_spec(args.config, args.ranks, dp_shard=args.dp_shard, tp=args.tp, pp=args.pp,
                      steps=args.steps, seed=args.seed, global_batch=args.batch,
                      seq_len=args.seq_len)
    print(f"TorchTitan {spec.preset} ({spec.config_name}) over {spec.ranks} ranks, "
          f"{spec.strategy}: mesh {'x'.join(map(str, spec.mesh))}, {spec.steps} steps",
          file=sys.stderr, flush=True)

    def show(record: dict) -> None:
        if record.get("kind") == "step":
            ranks = " ".join(f"{ms:.0f}" for ms in record.get("rank_wall_ms") or [])
            print(f"step {record['step']:3d}  loss {record['loss']:.4f}  "
                  f"ms per rank [{ranks}]", file=sys.stderr, flush=True)
        elif record.get("kind") == "heldout":
            print(f"held-out loss after step {record['step']}: {record['loss']:.4f}",
                  file=sys.stderr, flush=True)

    from ..runs import runner

    result = runner.run(spec, show, out_dir=out)
    written = [result.out_dir]
    for name, frame in (("losses.csv", runs.losses_frame([result])),
                        ("memory.csv", runs.memory_frame([result]))):
        tmp = out / (name + ".tmp")
        frame.to_csv(tmp, index=False)
        tmp.replace(out / name)
        written.append(out / name)
    written += charts.save_chart(charts.titan_losses(runs.losses_frame([result])), out,
                                 "losses")
    s = result.summary
    print(f"{s['strategy']}: loss {s['first_loss']:.4f} -> {s['final_loss']:.4f} (training), "
          f"{s['heldout_first']:.4f} -> {s['heldout_last']:.4f} (held-out, after the first "
          f"and the last step); {s['n_params']:,} parameters, global batch {s['batch_size']} "
          f"x {s['seq_len']} tokens, TorchTitan {s['torchtitan']}, {s['dist_backend']}")
    memory = runs.memory_frame([result])
    measured = memory[memory["source"] == "measured"].groupby("rank")["bytes"].sum()
    estimate = memory[memory["source"] == "estimate"]["bytes"].sum()
    print("training state per rank (measured shards): " + ", ".join(
        f"rank {r}: {b / 1e6:.1f} MB" for r, b in measured.items())
          + f"; the workbench's estimate for {spec.strategy}: {estimate / 1e6:.1f} MB")
    for note in s.get("notes") or []:
        print(f"  note: {note}")
    print("wrote " + ", ".join(map(str, written)))
    return 0
