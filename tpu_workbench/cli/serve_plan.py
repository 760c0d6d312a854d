"""``tpu-workbench serve-plan``: vLLM-TPU serving a model on a v6e slice, planned from the
engine's own programs compiled by libtpu (never run): serve.csv (one row per concurrency),
programs.csv and the ``vllm serve`` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import SpecError

SHOWN = ["concurrency", "itl_median_ms", "itl_mean_ms", "ttft_ms", "output_tokens_per_s",
         "output_tokens_per_s_per_chip", "kv_sequences_fit", "fits", "bottleneck"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="hf:llama", help="hf:llama or hf:qwen3")
    parser.add_argument("--preset", default="llama-3.1-8b",
                        help="llama-3.1-8b, llama-3.3-70b (hf:llama); qwen3-8b, qwen3-32b "
                             "(hf:qwen3)")
    parser.add_argument("--slice", default="v6e-8", help="v6e-1, v6e-4, v6e-8; larger slices "
                        "are data-parallel replicas of v6e-8")
    parser.add_argument("--input-len", default="1000", help="prompt tokens per request")
    parser.add_argument("--output-len", default="1000", help="generated tokens per request")
    parser.add_argument("--concurrency", default="1,8,64",
                        help="requests in flight, comma-separated: 1,8,64,128")
    parser.add_argument("--max-num-batched-tokens", default=None,
                        help="tokens per engine step (prefill chunk; default 2048)")
    parser.add_argument("--max-num-seqs", default=None,
                        help="requests per replica (default: the largest concurrency per "
                             "replica, to a power of two)")
    parser.add_argument("--max-model-len", default=None,
                        help="tokens per sequence (default: input + output)")
    parser.add_argument("--kv-cache-dtype", default="bf16", help="bf16 or fp8")
    parser.add_argument("--engine", default="vllm", help="vllm or sglang (its command)")
    parser.add_argument("--tensor-parallel", default=None,
                        help="chips per replica: 1, 4, 8 (default: the slice, up to 8)")
    parser.add_argument("--out", type=Path, default=Path("serve-plan"), help="output folder")


def _int(flag: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise SpecError(f"{flag} must be an int, got {text!r}") from None


def _ints(flag: str, text: str) -> tuple[int, ...]:
    return tuple(_int(flag, t.strip()) for t in text.split(",") if t.strip())


def serve_plan(args: argparse.Namespace) -> int:
    import pandas as pd

    from ..serving.plan import check_plan
    from ..serving.serve import commands, serve_plan, write_plan

    kwargs = dict(model=args.model, preset=args.preset, slice=args.slice,
                  input_len=_int("--input-len", args.input_len),
                  output_len=_int("--output-len", args.output_len),
                  concurrency=_ints("--concurrency", args.concurrency),
                  max_num_batched_tokens=_int("--max-num-batched-tokens",
                                              args.max_num_batched_tokens),
                  max_num_seqs=_int("--max-num-seqs", args.max_num_seqs),
                  max_model_len=_int("--max-model-len", args.max_model_len),
                  kv_cache_dtype=args.kv_cache_dtype, engine=args.engine,
                  tensor_parallel=_int("--tensor-parallel", args.tensor_parallel))
    check_plan(**kwargs)  # every flag, before anything is compiled
    plan = serve_plan(**kwargs, on_progress=lambda m: print(m, flush=True))
    paths = write_plan(plan, args.out)
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(plan.frame[SHOWN].round(2).to_string(index=False))
    print(plan.label)
    print(commands(plan))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
