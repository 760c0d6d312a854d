"""``tpu-workbench launch``: the exact commands and environment that run an experiment on every
host of a multi-host TPU slice (torch_xla or TorchTPU; via gcloud, xpk or Ray); ``--execute``
runs them where the launcher and its credentials exist."""

from __future__ import annotations

import argparse
import json
import sys

from ..scale.launch import RUNTIMES, VIAS, execute, launch_plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slice", required=True,
                        help="TPU slice: v6e-16, v6e-32, v5e-16 (v5litepod-16), v5p-32, or a "
                             "v6e topology like 4x4 (see tpu_workbench.environment.chips.SLICES)")
    parser.add_argument("--runtime", default="torch_xla",
                        help=f"one of {', '.join(RUNTIMES)} (default: torch_xla)")
    parser.add_argument("--via", default="gcloud",
                        help=f"launcher: one of {', '.join(VIAS)} (default: gcloud)")
    parser.add_argument("--name", default=None, help="TPU VM name (gcloud; default "
                                                     "workbench-SLICE)")
    parser.add_argument("--zone", default=None, help="zone (gcloud, xpk; default: gcloud's)")
    parser.add_argument("--project", default=None, help="Google Cloud project (gcloud, xpk)")
    parser.add_argument("--cluster", default=None, help="GKE cluster (xpk; required there)")
    parser.add_argument("--workload", default=None, help="xpk workload name")
    parser.add_argument("--hostnames", default=None,
                        help="the hosts' addresses, comma-separated, host 0 first (default: "
                             "each host finds them when it starts)")
    parser.add_argument("--workdir", default="tpu-workbench",
                        help="where the repo and its venvs are on every host (gcloud, ray; "
                             "relative to $HOME)")
    # the spec options, as tpu-workbench bench / shard take them
    parser.add_argument("--model", default="mingpt", help="model family (default: mingpt)")
    parser.add_argument("--preset", default="tiny", help="size preset (default: tiny)")
    parser.add_argument("--mode", default=None,
                        help="execution mode (default: compile on torch_xla, tpu_compile on "
                             "torch_tpu)")
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--mesh", default=None,
                        help="device mesh over every chip of the slice (default: the "
                             "strategy's: 16 for fsdp on v6e-16, 4x4 for dp_tp)")
    parser.add_argument("--strategy", default="fsdp", help="dp, fsdp, tp or dp_tp")
    parser.add_argument("--titan-config", default=None,
                        help="run TorchTitan's trainer on every host instead (--runtime "
                             "torch_tpu): a TorchTitan TOML or a shipped one (debug_model, "
                             "llama3_8b...), with --dp-shard / --tp / --steps")
    parser.add_argument("--dp-shard", type=int, default=None, help="--titan-config: FSDP2")
    parser.add_argument("--tp", type=int, default=None, help="--titan-config: tensor parallel")
    parser.add_argument("--serve", action="store_true",
                        help="serve --model/--preset with vLLM-TPU instead: the `vllm serve` "
                             "command of `tpu-workbench serve-plan` and `vllm bench serve` at "
                             "--concurrency (with --execute: run here, where vllm-tpu is "
                             "installed; measured.csv in --out)")
    parser.add_argument("--input-len", type=int, default=1000, help="--serve: prompt tokens")
    parser.add_argument("--output-len", type=int, default=1000, help="--serve: output tokens")
    parser.add_argument("--concurrency", default="1,8,64", help="--serve: comma-separated")
    parser.add_argument("--out", default="serve-launch", help="--serve --execute: results")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--execute", action="store_true",
                        help="run the plan (only where its launcher and credentials exist)")


def launch(args: argparse.Namespace) -> int:
    """Print the plan (checked before anything runs); with ``--execute``, run it."""
    if args.serve:
        return _serve(args)
    hostnames = [h.strip() for h in args.hostnames.split(",") if h.strip()] \
        if args.hostnames else None
    titan = None
    if args.titan_config:
        from ..environment.chips import get_slice
        from ..titan.spec import titan_spec

        titan = titan_spec(args.titan_config, get_slice(args.slice).chips,
                           dp_shard=args.dp_shard, tp=args.tp, steps=args.steps,
                           device="tpu", check_env=False)
    plan = launch_plan(args.slice, args.runtime, args.via, model=args.model,
                       preset=args.preset, mode=args.mode, steps=args.steps,
                       batch_size=args.batch_size, mesh=args.mesh, strategy=args.strategy,
                       name=args.name, zone=args.zone, project=args.project,
                       cluster=args.cluster, workload=args.workload, hostnames=hostnames,
                       workdir=args.workdir, titan=titan)
    print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.text(), flush=True)
    if not args.execute:
        return 0
    codes = execute(plan)  # says what is missing, and runs nothing, where it cannot
    for i, code in enumerate(codes):
        print(f"launch command {i}: exit code {code}", file=sys.stderr)
    return 0 if all(c == 0 for c in codes) else 1


def _serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..errors import SpecError
    from ..scale.serve_launch import execute as run_serve
    from ..scale.serve_launch import missing, serve_launch

    try:
        concurrency = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
    except ValueError:
        raise SpecError(f"--concurrency must be ints, got {args.concurrency!r}") from None
    model = "hf:llama" if args.model == "mingpt" else args.model
    preset = "llama-3.1-8b" if args.preset == "tiny" else args.preset
    launch = serve_launch(model, preset, args.slice, args.input_len, args.output_len,
                          concurrency)
    print(launch.text(), flush=True)
    if not args.execute:
        return 0
    why = missing()
    if why:
        print(f"not run: {why}", file=sys.stderr)
        return 1
    frame = run_serve(launch, Path(args.out))
    print(frame.dropna(axis=1, how="all").to_string(index=False))
    return 0
