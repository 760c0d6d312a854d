"""``tpu-workbench generate``: decode strategies x modes, timed per token, to tables and charts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import charts
from ..charts import generation as gen_charts
from ..environment.paths import writable_folder
from ..errors import SpecError
from ..generation import analysis as generation
from ..generation.runs import GenerationComparison, generate_many, specs_for, trained_weights
from ..generation.spec import GENERATION_MODES


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints, "
                                         "e.g. 8,16,32") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mingpt", help="a sequence model (default: mingpt)")
    parser.add_argument("--preset", default="tiny", help="size preset (default: tiny)")
    parser.add_argument("--strategies", default=",".join(generation.STRATEGIES),
                        help=f"comma-separated, out of {', '.join(generation.STRATEGIES)}")
    parser.add_argument("--modes", default="torch_eager,lazy,compile",
                        help=f"comma-separated, out of {', '.join(GENERATION_MODES)}")
    parser.add_argument("--tokens", type=int, default=16, help="new tokens per prompt")
    parser.add_argument("--prompts", type=_ints, default=(5,),
                        help="prompt lengths, one request each (default: 5)")
    parser.add_argument("--buckets", type=_ints, default=generation.DEFAULT_BUCKETS,
                        help="bucket lengths for 'bucketed' (default: 8,16,32)")
    parser.add_argument("--batch-size", type=int, default=None, help="prompts per request (1)")
    parser.add_argument("--train-steps", type=int, default=0,
                        help="decode with weights trained this many steps on the model's task "
                             "(a stored training run is reused; 0, the default: random "
                             "weights, whose tokens check only consistency); the prompts "
                             "must then fit the trained positions (minGPT tiny: prompt + "
                             "tokens - 1 <= 11, e.g. --prompts 6,7,8 --tokens 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm", action="store_true",
                        help="share warm workers (default: a fresh worker per mode, so every "
                             "compilation is counted)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")


def write_outputs(comparison: GenerationComparison, out: Path) -> list[Path]:
    """tokens.csv, summary.csv, compiles.csv, outputs.csv and the charts (HTML and PNG)."""
    tokens = comparison.tokens
    tables = {"tokens.csv": tokens, "summary.csv": comparison.summary,
              "compiles.csv": comparison.compiles, "outputs.csv": comparison.outputs}
    written = []
    for name, frame in tables.items():
        tmp = out / (name + ".tmp")
        frame.to_csv(tmp, index=False)
        tmp.replace(out / name)  # never a half-written table under the final name
        written.append(out / name)
    if len(tokens):
        figures = {"ms_per_token": gen_charts.ms_per_token(tokens),
                   "compiles_per_token": gen_charts.compiles_per_token(tokens),
                   "ttft_vs_steady": gen_charts.ttft_vs_steady(comparison.summary),
                   "compiles_by_phase": gen_charts.compiles_by_phase(
                       generation.compiles_by_phase(tokens))}
        for name, chart in figures.items():
            written += charts.save_chart(chart, out, name)
    return written


def generate(args: argparse.Namespace) -> int:
    out = writable_folder(args.out)
    names = [n.strip() for n in args.strategies.split(",") if n.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not names or not modes:
        raise SpecError(f"--strategies {args.strategies!r} and --modes {args.modes!r} must each "
                        f"name at least one; strategies: {', '.join(generation.STRATEGIES)}")
    weights = None
    if args.train_steps:
        if args.train_steps < 0:
            raise SpecError(f"--train-steps must be 0 (random weights) or a positive number "
                            f"of steps, got {args.train_steps}")
        # the generation spec is checked first: a bad one fails before anything trains
        specs_for(args.model, args.preset, modes, names, new_tokens=args.tokens,
                  prompts=args.prompts, buckets=args.buckets, batch_size=args.batch_size,
                  seed=args.seed)
        trained = trained_weights(args.model, args.preset, args.train_steps)
        weights = str(trained.out_dir)
        print(f"weights: {trained.run_id} ({'reused' if trained.reused else 'trained now'}, "
              f"held-out accuracy {trained.summary.get('metric', float('nan')):.0%})",
              file=sys.stderr)
    specs = specs_for(args.model, args.preset, modes, names, new_tokens=args.tokens,
                      prompts=args.prompts, buckets=args.buckets, batch_size=args.batch_size,
                      seed=args.seed, weights=weights)  # bad input fails here, before any worker
    options = specs[0].options
    if options:
        print(f"model options for generation: {options}", file=sys.stderr)

    def progress(comparison: GenerationComparison, spec) -> None:
        print(f"  {spec.mode}/{spec.decode}: done", file=sys.stderr)

    comparison = generate_many(specs, progress, fresh=not args.warm)
    written = write_outputs(comparison, out)
    summary = comparison.summary
    if len(summary):
        cols = ["mode", "measured_on", "strategy", "ttft_ms", "steady_ms_per_token",
                "steady_ms_p10", "steady_ms_p90", "tokens_per_s", "compiles_total",
                "compiles_steady", "cache_bytes"]
        print(summary[cols].to_string(index=False, float_format=lambda v: f"{v:,.3g}"))
    outputs = comparison.outputs
    if len(outputs):
        differ = outputs[outputs["same_as_pytorch"] == False]  # noqa: E712 (None: no baseline)
        print("greedy tokens: " + ("identical across strategies and modes" if not len(differ)
                                   else f"{len(differ)} run(s) differ from plain PyTorch"))
        checked = outputs["correct"].dropna()
        if weights and len(checked):
            print(f"the task's answer: {int(checked.sum())} of {len(checked)} continuations")
        elif not weights:
            print("(random weights: equal tokens show the strategies compute the same function, "
                  "not that a cache is right; --train-steps N decodes a trained model)")
    for name, err in comparison.errors.items():
        print(f"FAILED {name}: {err}", file=sys.stderr)
    print(f"wrote {len(written)} files to {out}")
    return 1 if comparison.errors else 0
