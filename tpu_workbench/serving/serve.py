"""``wb.serve_plan``: a model served by vLLM-TPU on a v6e slice, planned from the engine's own
programs compiled by libtpu (:mod:`tpu_workbench.serving.plan` says how each figure is made)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..tpu_compile.compile import DoesNotFit
from . import plan as P
from .compile import EngineProgram, compile_programs

COLUMNS = ["concurrency", "replicas", "tp", "per_replica", "decode_bucket", "itl_median_ms",
           "itl_mean_ms", "ttft_ms", "output_tokens_per_s", "output_tokens_per_s_per_chip",
           "kv_sequences_fit", "kv_sequences_vllm", "fits", "bottleneck", "weights_read_ms",
           "kv_read_ms", "allreduce_ms", "compute_ms", "overhead_ms", "prefill_ms_per_token",
           "rule_of_thumb_itl_ms", "compiler_gb_per_chip", "kv_gb_per_chip", "hbm_gb",
           "compiler_said", "provenance"]


def attention_kernels(program: EngineProgram) -> int:
    """The Pallas kernels (``tpu_custom_call``) in a compiled program: ragged paged attention's
    decode and mixed kernels, two per layer."""
    return program.hlo_text.count('custom_call_target="tpu_custom_call"')


def serve_plan(model: str = "hf:llama", preset: str = "llama-3.1-8b", slice: str = "v6e-8",
               input_len: int = 1000, output_len: int = 1000,
               concurrency: Sequence[int] = (1, 8, 64), max_num_batched_tokens: int | None = None,
               max_num_seqs: int | None = None, max_model_len: int | None = None,
               kv_cache_dtype: str = "bf16", engine: str = "vllm",
               tensor_parallel: int | None = None, num_blocks: int | None = None,
               on_progress: Callable[[str], None] | None = None,
               timeout: float = 1800.0) -> P.ServePlan:
    """Plan serving `preset` on `slice`: vLLM-TPU's decode steps (at the token bucket each
    concurrency pads to), its prefill chunk and LM head, compiled by libtpu for one replica of
    `tensor_parallel` chips (default: the slice up to 8; a larger slice is data-parallel
    replicas of 8), then ITL, TTFT, tokens/s, KV sequences that fit and the bottleneck per
    concurrency (:class:`~tpu_workbench.serving.plan.ServePlan`).

    Everything is checked before any compile (SpecError naming the value; DoesNotFit naming
    what does not fit and the largest concurrency and length that do). `num_blocks`: the KV
    pages to compile with (default: what vLLM allocates, :func:`plan.vllm_num_blocks`).
    `engine="sglang"` prints SGLang-JAX's command; the programs are still tpu-inference's."""
    import pandas as pd

    r = P.check_plan(model, preset, slice, input_len, output_len, tuple(concurrency),
                     max_num_batched_tokens, max_num_seqs, max_model_len, kv_cache_dtype,
                     engine, tensor_parallel)
    say = on_progress or (lambda _m: None)
    blocks = num_blocks or P.vllm_num_blocks(r)
    request = P.engine_request(r, blocks)
    wanted = P.programs_for(r)
    say(f"compiling {', '.join(p['name'] for p in wanted)} of {r.preset.name} for "
        f"v6e-{r.tp} (tensor parallel {r.tp}, {blocks} KV pages of {r.block_size} tokens)")
    done = compile_programs(request, wanted, f"v6e-{r.tp}", timeout)
    refused = {n: p for n, p in done.items() if isinstance(p, DoesNotFit)}
    if refused:
        raise next(iter(refused.values()))
    programs: dict[str, EngineProgram] = done  # type: ignore[assignment]
    any_program = next(iter(programs.values()))
    engine_info = dict(any_program.engine or {})
    tokens = P.token_buckets(r.max_num_batched_tokens)
    reqs = P.request_buckets(r.max_num_seqs)
    if engine_info.get("token_buckets") != tokens:
        raise RuntimeError(f"the engine pads tokens to {engine_info.get('token_buckets')}, the "
                           f"plan assumed {tokens}: plan.token_buckets needs updating")
    chunk = programs.get(f"prefill-{r.max_num_batched_tokens}") or programs[
        f"decode-{r.max_num_batched_tokens}"]
    rows = []
    for c in r.concurrency:
        cr = r.per_replica(c)
        step = programs[f"decode-{P.pad(tokens, cr)}"]
        logits = programs[f"logits-{P.pad(reqs, cr)}"]
        row = P.predict_row(r, c, step, logits, chunk)
        cap = P.kv_capacity(r, step)
        fits = cr <= cap["kv_sequences_fit"] and step.memory["fits"]
        said = (f"fits: {step.memory['total_bytes'] / 1e9:.2f} GB of "
                f"{step.memory['hbm_bytes'] / 1e9:.2f} GB per chip" if step.memory["fits"]
                else "over HBM") + (
            "" if cr <= cap["kv_sequences_fit"] else
            f"; {cr} sequences of {r.input_len + r.output_len} tokens need more KV pages "
            f"than the {cap['kv_pages_fit']} that fit")
        rows.append({**row, **cap, "replicas": r.replicas, "tp": r.tp, "fits": fits,
                     "compiler_said": said, "provenance": step.label})
    frame = pd.DataFrame(rows)[COLUMNS]
    prog_rows = [{"program": n, "kind": p.compiled["program"],
                  "num_tokens": p.compiled.get("num_tokens"),
                  "num_reqs": p.compiled.get("num_reqs"),
                  "attention_kernels": attention_kernels(p),
                  "all_reduces": int((p.collectives["kind"] == "all-reduce").sum())
                  if len(p.collectives) else 0,
                  "arguments_gb": p.memory["arguments"] / 1e9,
                  "temp_gb": p.memory["temp"] / 1e9,
                  "total_gb": p.memory["total_bytes"] / 1e9,
                  "flops": p.compiled["cost"].get("flops", 0.0),
                  "compile_s": p.compiled["compile_s"], "cached": p.cached,
                  "provenance": p.label} for n, p in programs.items()]
    notes = [f"token buckets {tokens}; request buckets {reqs} (tpu-inference's runner)",
             f"KV page {engine_info.get('block_size')} tokens; "
             f"{engine_info.get('num_blocks')} pages per chip as compiled"]
    if r.engine == "sglang":
        notes.append("the programs are tpu-inference's (vLLM-TPU): SGLang-JAX's own are not "
                     "compiled here")
    return P.ServePlan(r, frame, pd.DataFrame(prog_rows), P.vllm_command(r), engine_info, notes)


def write_plan(plan: P.ServePlan, out: Path) -> list[Path]:
    """serve.csv, programs.csv and command.txt in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "serve.csv", out / "programs.csv", out / "command.txt"]
    plan.frame.to_csv(paths[0], index=False)
    plan.programs.to_csv(paths[1], index=False)
    paths[2].write_text(_commands(plan) + "\n")
    return paths


def _commands(plan: P.ServePlan) -> str:
    r = plan.request
    head = (f"# on each of {r.replicas} replica(s) of v6e-{r.tp}" if r.replicas > 1 else
            f"# on one v6e-{r.tp}")
    bench = " ".join(["vllm bench serve --backend vllm", f"--model {r.preset.hf_name}",
                      "--dataset-name random", f"--random-input-len {r.input_len}",
                      f"--random-output-len {r.output_len}", "--max-concurrency {c}",
                      "--num-prompts {n}"])
    lines = [head, plan.command, "# then, per planned concurrency:"]
    lines += [bench.format(c=r.per_replica(c), n=3 * r.per_replica(c)) for c in r.concurrency]
    return "\n".join(lines)


def commands(plan: P.ServePlan) -> str:
    """The server command and the benchmark commands at the planned concurrencies."""
    return _commands(plan)


def hbm_parts(plan: P.ServePlan) -> Any:
    """What fills one chip's HBM in the plan's decode program (the compiler's memory): weights,
    the KV cache vLLM allocates, the rest, and what is left; one row per part."""
    import pandas as pd

    row = plan.frame.iloc[-1]
    weights = row["compiler_gb_per_chip"] - row["kv_gb_per_chip"]
    kv, total, hbm = row["kv_gb_per_chip"], row["compiler_gb_per_chip"], row["hbm_gb"]
    other = plan.programs.query("kind == 'step'")["temp_gb"].max()
    label = f"{plan.request.preset.name} on v6e-{plan.request.tp}"
    parts = {"weights": weights - other, "KV cache": kv, "temporaries and other": other,
             "free": max(hbm - total, 0.0)}
    return pd.DataFrame([{"plan": label, "part": k, "gb": v} for k, v in parts.items()])
