"""A serving plan: vLLM-TPU's own programs for a model on a v6e slice, compiled by libtpu (never
run), and what they predict per concurrency: inter-token latency, time to first token, output
tokens/s, the KV sequences that fit, the bottleneck, the ``vllm serve`` command.

How a step is timed (one replica of ``tp`` chips, per chip; each figure labelled so):

- weights read: the decode program's arguments as the compiler assigned them, less the KV
  cache and the embedding table (a decode step gathers a row per token), plus the LM head
  program's arguments: read once per step at the chip's HBM bandwidth;
- KV pages read: the ragged paged attention kernel reads every page of every running
  sequence (``cost_analysis`` counts nothing inside a Pallas kernel), so it is costed from the
  pages: sequences x pages per sequence x the bytes of a page on a chip x layers;
- all-reduces: the collectives of the compiled programs on the ICI model
  (:mod:`tpu_workbench.sharding.ici`), in series with compute, as decode's are;
- compute: the compiled FLOPs (kernel's attention added) at the chip's peak;
- a fixed engine overhead per step and the prefill's MXU efficiency: the only two constants,
  both fitted on ONE published row (:data:`FIT_ROW`) and judged on the others
  (``scripts/bench_serve.py``).

Mean ITL adds the prefill chunks that share the decode steps (each step carries, on average,
``c x input/output`` prompt tokens); TTFT is the published runs' closed loop: a new request
waits for the prompts of the ``c`` requests in flight (``c x input`` tokens at the prefill
chunk's rate) and one step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..environment.chips import get_chip, get_slice
from ..errors import SpecError
from ..tpu_compile.compile import DoesNotFit
from ..tpu_compile.results import usable_hbm_bytes
from .presets import ServePreset, get_preset

ENGINES = ("vllm", "sglang")
KV_DTYPES = {"bf16": ("auto", 2), "fp8": ("fp8", 1)}  # flag -> (engine's name, bytes)
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization
MIN_TOKEN_BUCKET, MIN_NUM_SEQS = 16, 8  # tpu-inference's runner (envs.MIN_TOKEN_BUCKET)
TP_SIZES = (1, 4, 8, 16)  # v6e-1, v6e-4, v6e-8 (one host), v6e-16 (4x4, multi-host)
TP_TOPOLOGY = {1: ("v6e:1x1", [1, 1, 1]), 4: ("v6e:2x2", None), 8: ("v6e:2x4", None),
               16: ("v6e:4x4", None)}
# Fitted on ONE published row (serving_runs.csv, run Q8-V-8: vLLM, Qwen3-8B on a v6e-4 at
# concurrency 8, 1024/1024 tokens) by scripts/bench_serve.py --fit; judged on the rest.
FIT_ROW = "Q8-V-8"
STEP_OVERHEAD_MS = 5.328
PREFILL_MXU_EFFICIENCY = 0.232


@dataclass(frozen=True)
class ServeRequest:
    """A validated serving plan's inputs (:func:`check_plan`)."""

    preset: ServePreset
    slice: str
    chips: int
    tp: int
    replicas: int
    input_len: int
    output_len: int
    concurrency: tuple[int, ...]
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    kv_cache_dtype: str
    engine: str
    gpu_memory_utilization: float

    @property
    def block_size(self) -> int:
        """vLLM-TPU's page size for this max-model-len (engine_main.page_size, the engine's
        PallasAttentionBackend rule)."""
        from .engine_main import page_size

        return page_size(self.max_model_len, self.max_num_seqs)

    def per_replica(self, concurrency: int) -> int:
        return -(-concurrency // self.replicas)


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecError(f"{name} must be a positive int, got {value!r}")
    return value


def token_buckets(max_num_batched_tokens: int) -> list[int]:
    """The token paddings tpu-inference's runner compiles (runner_utils.build_token_paddings,
    padding gap 0): powers of two from 16, capped at the budget, and the budget."""
    budget = -(-max_num_batched_tokens // MIN_TOKEN_BUCKET) * MIN_TOKEN_BUCKET
    out, n = [], MIN_TOKEN_BUCKET
    while n < budget:
        out.append(n)
        n *= 2
    return sorted(set(out) | {budget})


def request_buckets(max_num_seqs: int) -> list[int]:
    """The request paddings of its sampling and LM-head programs (runner_utils.get_req_paddings)."""
    out, n = [], MIN_NUM_SEQS
    while n < max_num_seqs:
        out.append(n)
        n *= 2
    return sorted(set(out) | {max_num_seqs})


def pad(buckets: list[int], n: int) -> int:
    return next(b for b in buckets if b >= n)


def weight_bytes_per_chip(preset: ServePreset, tp: int) -> float:
    """bf16 weights on one chip, every matrix split over the tensor-parallel chips (the
    analytic figure that sizes the KV cache before compiling; the compiler's replaces it)."""
    return preset.params() * 2 / tp


def kv_bytes_per_token(preset: ServePreset, tp: int, kv_bytes: int) -> float:
    """KV bytes one token keeps on one chip, every layer: K and V of its KV heads (padded to
    the tensor-parallel size as tpu-inference pads them)."""
    heads = max(preset.config["num_key_value_heads"], tp)
    return 2 * heads * preset.head_dim * kv_bytes * preset.layers / tp


def check_plan(model: str, preset: str, slice: str = "v6e-8", input_len: int = 1000,
               output_len: int = 1000, concurrency: tuple[int, ...] | list[int] = (1, 8, 64),
               max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
               max_model_len: int | None = None, kv_cache_dtype: str = "bf16",
               engine: str = "vllm", tensor_parallel: int | None = None,
               gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION) -> ServeRequest:
    """Every check a serving plan makes before compiling anything: SpecError naming the value
    and what is valid, or :class:`DoesNotFit` naming what does not fit (weights, or the KV cache
    at this concurrency and length) and the largest concurrency and length that do, by vLLM's
    own memory rule on the analytic weights."""
    p = get_preset(model, preset)
    try:
        sl = get_slice(slice)
    except (ValueError, KeyError) as exc:
        raise SpecError(f"--slice {slice!r}: {exc}") from None
    if sl.chip != "v6e":
        raise SpecError(f"--slice {slice!r}: serving plans compile for v6e slices only "
                        "(tpu-inference's tuned kernels), e.g. v6e-1, v6e-4, v6e-8, v6e-16")
    input_len, output_len = _positive("--input-len", input_len), _positive("--output-len",
                                                                          output_len)
    if not concurrency:
        raise SpecError("--concurrency needs at least one value, e.g. 1,8,64")
    conc = tuple(_positive("--concurrency", c) for c in concurrency)
    if engine not in ENGINES:
        raise SpecError(f"--engine {engine!r}: use one of {', '.join(ENGINES)}")
    if kv_cache_dtype not in KV_DTYPES:
        raise SpecError(f"--kv-cache-dtype {kv_cache_dtype!r}: use one of "
                        f"{', '.join(KV_DTYPES)}")
    if not 0 < gpu_memory_utilization <= 1:
        raise SpecError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    kv_heads = p.config["num_key_value_heads"]
    if tensor_parallel is None:
        tensor_parallel = min(sl.chips, 8)
    if tensor_parallel not in TP_SIZES or sl.chips % tensor_parallel or (
            kv_heads % tensor_parallel and tensor_parallel % kv_heads):
        raise SpecError(f"tensor parallel {tensor_parallel} on {sl.name} ({sl.chips} chips): "
                        f"use one of {[t for t in TP_SIZES if sl.chips % t == 0]} that divides "
                        f"or is a multiple of {p.name}'s {kv_heads} KV heads")
    replicas = sl.chips // tensor_parallel
    need = input_len + output_len
    max_model_len = _positive("--max-model-len", max_model_len or need)
    positions = p.config["max_position_embeddings"]
    if max_model_len < need or max_model_len > positions:
        raise SpecError(f"--max-model-len {max_model_len}: must hold --input-len + --output-len "
                        f"= {need} and be at most {p.name}'s {positions} positions")
    per_replica = -(-max(conc) // replicas)
    max_num_seqs = _positive("--max-num-seqs", max_num_seqs or max(
        MIN_NUM_SEQS, 1 << (per_replica - 1).bit_length()))
    if per_replica > max_num_seqs:
        raise SpecError(f"--concurrency {max(conc)} puts {per_replica} requests on each of "
                        f"{replicas} replica(s), more than --max-num-seqs {max_num_seqs}: raise "
                        f"--max-num-seqs to {per_replica} or more")
    max_num_batched_tokens = _positive("--max-num-batched-tokens",
                                       max_num_batched_tokens or 2048)
    if max_num_batched_tokens < max(MIN_TOKEN_BUCKET, max_num_seqs):
        raise SpecError(f"--max-num-batched-tokens {max_num_batched_tokens}: at least "
                        f"--max-num-seqs ({max_num_seqs}) and {MIN_TOKEN_BUCKET}, so a decode "
                        "step of every running request fits one step")
    request = ServeRequest(p, sl.name, sl.chips, tensor_parallel, replicas, input_len,
                           output_len, conc, max_num_seqs, max_num_batched_tokens,
                           max_model_len, kv_cache_dtype, engine, gpu_memory_utilization)
    _check_fit(request)
    return request


def _check_fit(r: ServeRequest) -> None:
    hbm = usable_hbm_bytes("v6e")
    weights = weight_bytes_per_chip(r.preset, r.tp)
    budget = r.gpu_memory_utilization * hbm
    if weights >= budget:
        least = next((t for t in TP_SIZES if weight_bytes_per_chip(r.preset, t) < budget),
                     None)
        raise DoesNotFit(
            f"{r.preset.name}'s weights do not fit tensor parallel {r.tp}: "
            f"{weights / 1e9:.1f} GB per chip against {budget / 1e9:.1f} GB "
            f"({r.gpu_memory_utilization:.0%} of a v6e chip's {hbm / 1e9:.1f} GB; analytic, "
            "before compiling)" + (f"; tensor parallel {least} (v6e-{least}) holds them"
                                   if least else ""))
    per_seq = kv_per_sequence_bytes(r, r.input_len + r.output_len)
    seqs = int((budget - weights) // per_seq)
    worst = r.per_replica(max(r.concurrency))
    if worst > seqs:
        longest = int((budget - weights) // (worst * kv_bytes_per_token(
            r.preset, r.tp, KV_DTYPES[r.kv_cache_dtype][1])))
        raise DoesNotFit(
            f"the KV cache of {worst} sequences of {r.input_len + r.output_len} tokens per "
            f"replica does not fit {r.slice} with tensor parallel {r.tp}: "
            f"{worst * per_seq / 1e9:.1f} GB per chip beside {weights / 1e9:.1f} GB of "
            f"weights in {budget / 1e9:.1f} GB (vLLM's rule, analytic, before compiling). "
            f"Largest that fits: concurrency {seqs * r.replicas} at this length, or "
            f"{longest} tokens per sequence at concurrency {max(r.concurrency)}")


def kv_per_sequence_bytes(r: ServeRequest, tokens: int) -> float:
    """KV bytes one sequence of `tokens` holds on a chip: whole pages, as vLLM allocates."""
    pages = -(-tokens // r.block_size)
    return pages * r.block_size * kv_bytes_per_token(r.preset, r.tp, KV_DTYPES[
        r.kv_cache_dtype][1])


def vllm_num_blocks(r: ServeRequest, weights_per_chip: float | None = None) -> int:
    """The KV pages vLLM-TPU allocates: (utilization x HBM - weights) over a page's bytes on a
    chip, every layer (tpu_worker.determine_available_memory)."""
    weights = weight_bytes_per_chip(r.preset, r.tp) if weights_per_chip is None \
        else weights_per_chip
    page = r.block_size * kv_bytes_per_token(r.preset, r.tp, KV_DTYPES[r.kv_cache_dtype][1])
    return max(int((r.gpu_memory_utilization * usable_hbm_bytes("v6e") - weights) // page), 1)


def engine_request(r: ServeRequest, num_blocks: int) -> dict[str, Any]:
    """What :mod:`engine_main` builds: the model, one replica's topology, the engine's limits."""
    topology, bounds = TP_TOPOLOGY[r.tp]
    return {"architecture": r.preset.architecture, "hf_config": r.preset.config,
            "topology": topology, "host_bounds": bounds, "tp": r.tp, "dtype": "bfloat16",
            "kv_cache_dtype": KV_DTYPES[r.kv_cache_dtype][0], "max_model_len": r.max_model_len,
            "max_num_seqs": r.max_num_seqs, "max_num_batched_tokens": r.max_num_batched_tokens,
            "num_blocks": int(num_blocks)}


def programs_for(r: ServeRequest) -> list[dict[str, Any]]:
    """The programs a plan compiles: the decode step at each token bucket its concurrencies
    pad to, the prefill chunk at max-num-batched-tokens, the LM head at each request bucket."""
    tokens, reqs = token_buckets(r.max_num_batched_tokens), request_buckets(r.max_num_seqs)
    decode = sorted({pad(tokens, r.per_replica(c)) for c in r.concurrency})
    heads = sorted({pad(reqs, r.per_replica(c)) for c in r.concurrency})
    out = [{"name": f"decode-{t}", "kind": "step", "num_tokens": t} for t in decode]
    if r.max_num_batched_tokens not in decode:
        out.append({"name": f"prefill-{r.max_num_batched_tokens}", "kind": "step",
                    "num_tokens": r.max_num_batched_tokens})
    return out + [{"name": f"logits-{n}", "kind": "logits", "num_reqs": n} for n in heads]


@dataclass
class StepTime:
    """One decode (or prefill) step on one chip, in ms, and what made it."""

    weights_ms: float
    kv_ms: float
    compute_ms: float
    allreduce_ms: float
    overhead_ms: float

    @property
    def total_ms(self) -> float:
        return max(self.weights_ms + self.kv_ms, self.compute_ms) + self.allreduce_ms \
            + self.overhead_ms

    @property
    def bottleneck(self) -> str:
        parts = {"weights read": self.weights_ms, "KV pages read": self.kv_ms,
                 "compute": self.compute_ms, "all-reduce latency": self.allreduce_ms,
                 "engine overhead": self.overhead_ms}
        return max(parts, key=parts.get)


def _collective_ms(program) -> float:
    frame = program.collectives
    return float(frame["estimated_us"].sum()) / 1e3 if len(frame) else 0.0


def decode_time(r: ServeRequest, step, logits, c: int, context: float,
                overhead_ms: float | None = None) -> StepTime:
    """One decode step of `c` running requests of `context` tokens each on one replica."""
    chip = get_chip("v6e")
    engine = step.engine
    embed = r.preset.config["vocab_size"] * r.preset.config["hidden_size"] * 2 / r.tp
    weights = (step.memory["arguments"] - engine["kv_bytes_per_chip"] - embed
               + logits.memory["arguments"])
    pages = math.ceil(context / engine["block_size"])
    kv = c * pages * engine["kv_page_bytes_per_layer"] * engine["layers"]
    c_heads = r.preset.config["num_attention_heads"]
    attn_flops = 4 * c * context * c_heads * r.preset.head_dim * r.preset.layers / r.tp
    flops = step.compiled["cost"].get("flops", 0.0) + logits.compiled["cost"].get(
        "flops", 0.0) + attn_flops
    bw = chip.hbm_gbps * 1e9
    return StepTime(weights / bw * 1e3, kv / bw * 1e3, flops / chip.peak_flops * 1e3,
                    _collective_ms(step) + _collective_ms(logits),
                    STEP_OVERHEAD_MS if overhead_ms is None else overhead_ms)


def prefill_token_ms(r: ServeRequest, chunk, efficiency: float | None = None) -> float:
    """ms per prompt token in a prefill chunk of max-num-batched-tokens on one replica."""
    chip = get_chip("v6e")
    eff = PREFILL_MXU_EFFICIENCY if efficiency is None else efficiency
    tokens = chunk.compiled["num_tokens"]
    context = r.input_len / 2  # a chunk's tokens attend, on average, to half the prompt
    attn = 4 * tokens * context * r.preset.config["num_attention_heads"] * r.preset.head_dim \
        * r.preset.layers / r.tp
    compute = (chunk.compiled["cost"].get("flops", 0.0) + attn) / (chip.peak_flops * eff)
    weights = chunk.memory["arguments"] - chunk.engine["kv_bytes_per_chip"]
    memory = weights / (chip.hbm_gbps * 1e9)
    return (max(compute, memory) + _collective_ms(chunk) / 1e3) * 1e3 / tokens


def rule_of_thumb_itl_ms(r: ServeRequest, c: int, context: float) -> float:
    """The rule of thumb: (weights + the KV bytes of `c` sequences of `context` tokens) on one
    chip over its HBM bandwidth; nothing compiled."""
    kv = c * context * kv_bytes_per_token(r.preset, r.tp, KV_DTYPES[r.kv_cache_dtype][1])
    return (weight_bytes_per_chip(r.preset, r.tp) + kv) / (get_chip("v6e").hbm_gbps * 1e9) * 1e3


def predict_row(r: ServeRequest, c: int, step, logits, chunk,
                overhead_ms: float | None = None,
                efficiency: float | None = None) -> dict[str, Any]:
    """The serve.csv row of concurrency `c` from the compiled programs (see the module doc)."""
    cr = r.per_replica(c)
    context = r.input_len + r.output_len / 2
    t = decode_time(r, step, logits, cr, context, overhead_ms)
    tok = prefill_token_ms(r, chunk, efficiency)
    itl_mean = t.total_ms + cr * r.input_len / r.output_len * tok
    ttft = cr * r.input_len * tok + t.total_ms
    per_replica = cr * r.output_len / (ttft + r.output_len * itl_mean) * 1e3
    total = per_replica * min(r.replicas, -(-c // cr))
    return {"concurrency": c, "per_replica": cr, "decode_bucket": step.compiled["num_tokens"],
            "itl_median_ms": t.total_ms, "itl_mean_ms": itl_mean, "ttft_ms": ttft,
            "output_tokens_per_s": total, "output_tokens_per_s_per_chip": total / r.chips,
            "bottleneck": t.bottleneck, "weights_read_ms": t.weights_ms, "kv_read_ms": t.kv_ms,
            "compute_ms": t.compute_ms, "allreduce_ms": t.allreduce_ms,
            "overhead_ms": t.overhead_ms, "prefill_ms_per_token": tok,
            "rule_of_thumb_itl_ms": rule_of_thumb_itl_ms(r, cr, context)}


def kv_capacity(r: ServeRequest, step) -> dict[str, Any]:
    """KV pages and sequences of input+output tokens that fit one chip by the compiler's memory
    of the decode program: usable HBM less everything but the KV cache (weights, temporaries,
    outputs not aliased), over a page's bytes on the chip."""
    mem, engine = step.memory, step.engine
    page = engine["kv_bytes_per_chip"] / engine["num_blocks"]
    other = mem["total_bytes"] - engine["kv_bytes_per_chip"]
    pages = int((mem["hbm_bytes"] - other) // page)
    per_seq = -(-(r.input_len + r.output_len) // engine["block_size"])
    return {"kv_pages_fit": pages, "kv_sequences_fit": pages // per_seq,
            "kv_pages_vllm": engine["num_blocks"],
            "kv_sequences_vllm": engine["num_blocks"] // per_seq,
            "kv_gb_per_chip": engine["kv_bytes_per_chip"] / 1e9,
            "weights_gb_per_chip": (mem["arguments"] - engine["kv_bytes_per_chip"]) / 1e9,
            "compiler_gb_per_chip": mem["total_bytes"] / 1e9, "hbm_gb": mem["hbm_bytes"] / 1e9}


def vllm_command(r: ServeRequest) -> str:
    """The server command the plan implies (one per replica)."""
    if r.engine == "sglang":
        cmd = (f"python3 -m sgl_jax.launch_server --model-path {r.preset.hf_name} --device tpu "
               f"--tp-size {r.tp} --max-running-requests {r.max_num_seqs} "
               f"--chunked-prefill-size {r.max_num_batched_tokens} "
               f"--context-length {r.max_model_len} --page-size {r.block_size} "
               f"--dtype bfloat16")
    else:
        cmd = (f"vllm serve {r.preset.hf_name} --tensor-parallel-size {r.tp} "
               f"--max-num-seqs {r.max_num_seqs} "
               f"--max-num-batched-tokens {r.max_num_batched_tokens} "
               f"--max-model-len {r.max_model_len} "
               f"--gpu-memory-utilization {r.gpu_memory_utilization}"
               + (" --kv-cache-dtype fp8" if r.kv_cache_dtype == "fp8" else "")
               + f" --block-size {r.block_size}")
    return cmd


@dataclass
class ServePlan:
    """A serving plan (:func:`tpu_workbench.serving.serve_plan`): ``frame`` (serve.csv, one
    row per concurrency), ``programs`` (one row per compiled program), ``command``."""

    request: ServeRequest
    frame: Any
    programs: Any
    command: str
    engine: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        e = self.engine
        return (f"predicted from vLLM-TPU's programs (tpu-inference {e.get('tpu_inference')}) "
                f"compiled for {self.request.replicas} x v6e-{self.request.tp} by libtpu "
                f"{e.get('libtpu')} (not run)")
