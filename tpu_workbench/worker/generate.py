"""Greedy generation inside a worker: four decode strategies, timed token by token.

One ``kind="token"`` record per generated token (after waiting for the device; columns in
:data:`tpu_workbench.generation.analysis.TOKEN_COLUMNS`) and, for each XLA compilation, a
``kind="compile"`` record with torch_xla's cause and the shapes that made it new
(:func:`tpu_workbench.generation.analysis.explain`). The strategies
(:data:`~tpu_workbench.generation.analysis. STRATEGIES`):

* ``naive``: the whole sequence again for each token;
* ``dynamic_cache``: a prefill fills a cache that grows by a position per decode step;
* ``static_cache``: a cache preallocated at a fixed length, written at positions passed as a
  tensor (device data, not a constant baked into the program), so every decode step is one
  program whatever the position;
* ``bucketed``: prompts right-padded to their bucket, then the static cache. Causal attention
  keeps the padding out of the real positions, the first token is read at the last real one,
  and the first decode step overwrites the padding's cache entries.

Modes: ``torch_eager`` (the baseline), ``lazy`` (a ``torch_xla.sync()`` per token), ``compile``
(``torch_xla.compile`` of the prefill and of the decode step), ``eager`` (torch_xla's per-op
eager mode), ``tpu_compile`` (``torch.compile(backend="tpu")``, on a chip).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .. import models
from ..environment.runtimes import Runtime
from ..generation import analysis as generation
from ..generation.spec import GenerationSpec
from .backend import Backend

_RUNS_SERVED = 0  # generate runs this worker has started (0: a cold worker)
# Intra-op threads of a plain-PyTorch decode on the CPU. A one-token step of these models is a
# few dozen ops too small to split, and each split op waits for its slowest thread: measured on
# a shared 2-core host (minGPT tiny, 32 tokens, three runs per strategy), one thread gave
# 0.26-0.28 ms medians per token idle and with a busy-looping process beside it; two threads
# gave 0.32-0.40 ms idle but 60-180 ms medians whenever another process held a core, which
# strategy was hit being luck (issue 34's bucketed 1,615 vs static 81 tokens/s).
DECODE_THREADS = 1


class MinGPTLM:
    """minGPT with its own KV cache (:func:`tpu_workbench.models.mingpt.kv_cache`)."""

    def __init__(self, model: torch.nn.Module, cfg: Any, device: torch.device):
        self.model, self.cfg, self.device = model, cfg, device

    def new_cache(self, length: int | None, batch: int) -> Any:
        from ..models.mingpt import kv_cache

        return kv_cache(self.cfg, batch, length, self.device)

    def logits(self, ids: torch.Tensor, pos: torch.Tensor, cache: Any, key_len: int) -> Any:
        return self.model(ids, cache, pos) if cache is not None else self.model(ids)

    def seek(self, cache: Any, length: torch.Tensor) -> None:
        """The cache is written at the positions passed: nothing to move."""

    def cache_shape(self, cache: Any) -> list[int]:
        k = cache[0].k
        return list(k.shape) if k is not None else [0]

    def cache_bytes(self, cache: Any) -> int:
        return sum(layer.nbytes() for layer in cache) if cache is not None else 0


class HFLM:
    """A Transformers causal LM with its DynamicCache or StaticCache. The attention mask is
    passed whole (B, 1, T, keys), additive, so Transformers builds none itself: its own mask
    code reads tensors back in Python (a graph cut on XLA) for packed-sequence checks."""

    def __init__(self, model: torch.nn.Module, cfg: Any, device: torch.device):
        self.hf, self.device = model.hf, device

    def new_cache(self, length: int | None, batch: int) -> Any:
        from transformers import DynamicCache, StaticCache

        config = self.hf.config
        if length is None:
            return DynamicCache(config=config)
        cache = StaticCache(config=config, max_cache_len=length)
        heads = config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // \
            config.num_attention_heads
        # the weights' dtype (options={"dtype": "bfloat16"}), which the keys and values come in
        cache.early_initialization(batch, heads, head_dim, self.hf.dtype, self.device)
        return cache

    def logits(self, ids: torch.Tensor, pos: torch.Tensor, cache: Any, key_len: int) -> Any:
        B, T = ids.shape
        allowed = torch.arange(key_len, device=ids.device)[None, :] <= pos[:, None]
        mask = torch.zeros(allowed.shape, device=ids.device).masked_fill(
            ~allowed, torch.finfo(torch.float32).min)[None, None].expand(B, 1, T, key_len)
        return self.hf(input_ids=ids, attention_mask=mask, position_ids=pos[None].expand(B, T),
                       past_key_values=cache, cache_position=pos,
                       use_cache=cache is not None).logits

    def seek(self, cache: Any, length: torch.Tensor) -> None:
        """Set a StaticCache's write position to `length` (a (1,) device tensor, so no program
        depends on it): StaticLayer.update writes at its own counter, ``cumulative_length``,
        not at ``cache_position``; after a padded prefill (bucketed) or on a new request the
        counter must be the prompt's real length."""
        for layer in getattr(cache, "layers", []):
            counter = getattr(layer, "cumulative_length", None)
            if isinstance(counter, torch.Tensor) and getattr(layer, "keys", None) is not None:
                counter.copy_(length.reshape(counter.shape).to(counter.dtype))

    def cache_shape(self, cache: Any) -> list[int]:
        keys = getattr(cache.layers[0], "keys", None) if cache.layers else None
        return list(keys.shape) if keys is not None and keys.dim() else [0]

    def cache_bytes(self, cache: Any) -> int:
        if cache is None:
            return 0
        return sum(t.numel() * t.element_size() for layer in cache.layers
                   for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                   if isinstance(t, torch.Tensor))


def _prepare(spec: GenerationSpec, backend: Backend) -> Callable[[Callable, str], Callable]:
    """Put `backend` on its device and counters; return how the mode wraps a step function."""
    if backend.runtime.xla:
        import torch_xla

        from .xla import XLACounters

        backend.device = torch_xla.device()
        torch_xla.experimental.eager_mode(spec.mode == "eager")
        backend.counters = XLACounters()
        if spec.mode == "compile":
            return lambda fn, name: torch_xla.compile(fn, name=f"{spec.decode}_{name}")
        if spec.mode == "lazy":
            def lazy(fn: Callable, name: str) -> Callable:
                def synced(*args: Any) -> Any:
                    out = fn(*args)
                    torch_xla.sync()  # cut the graph: one program per token
                    return out
                return synced
            return lazy
        return lambda fn, name: fn
    if backend.runtime is Runtime.TORCH_TPU:
        from .torchtpu import DEVICE_TYPE, CacheCounters

        backend.device = torch.device(DEVICE_TYPE)
        backend.counters = CacheCounters()
        torch.compiler.reset()
        return lambda fn, name: torch.compile(fn, backend=DEVICE_TYPE, dynamic=False)
    cuda = torch.cuda.is_available() and spec.device != "cpu"
    backend.device = torch.device("cuda" if cuda else "cpu")
    return lambda fn, name: fn


def _positions(start: int, length: int, device: torch.device) -> torch.Tensor:
    # Made on the CPU and copied: on XLA a tensor made on the device with Python ints is a
    # constant inside the program (a new program per position); copied, it is an input.
    return torch.arange(start, start + length).to(device)


def generate(ctx: Any, spec_dict: dict[str, Any], backend: Backend) -> dict[str, Any]:
    """Generate per `spec_dict` (a GenerationSpec as a dict), streaming a record per token."""
    global _RUNS_SERVED
    spec = GenerationSpec.from_dict(spec_dict)
    runs_before, _RUNS_SERVED = _RUNS_SERVED, _RUNS_SERVED + 1
    family = models.get_model(spec.model)
    cfg = family.config(spec.preset, **spec.options)
    torch.manual_seed(spec.seed)
    model = family.build(cfg).eval()
    if spec.weights is not None:  # a training run's checkpoint (validated: the same model)
        model.load_state_dict(torch.load(Path(spec.weights) / "model.pt", map_location="cpu"))
    wrap = _prepare(spec, backend)
    device = backend.device
    model.to(device)
    lm = (MinGPTLM if spec.model == "mingpt" else HFLM)(model, cfg, device)
    gen = torch.Generator().manual_seed(spec.seed)
    # The task's own prompts (digits, then a sorted answer begun) so a trained model's
    # continuations can be checked against the task's answer.
    if hasattr(family, "task_prompts"):
        prompts = [family.task_prompts(cfg, p, spec.batch, gen) for p in spec.prompts]
    else:  # a model of your own: random tokens of a small vocabulary
        prompts = [torch.randint(2, (spec.batch, p), generator=gen) for p in spec.prompts]
    threads, on_cpu = torch.get_num_threads(), backend.device.type == "cpu"
    if on_cpu:  # plain PyTorch on the CPU (XLA:CPU runs its own thread pool)
        torch.set_num_threads(DECODE_THREADS)
    try:
        outputs, static = _decode(ctx, spec, backend, lm, wrap, prompts)
    finally:
        decode_threads = torch.get_num_threads() if on_cpu else None
        torch.set_num_threads(threads)  # a warm worker's next (training) run gets them back
    return {
        "model": spec.model, "preset": spec.preset, "mode": spec.mode,
        "strategy": spec.decode, "prompts": list(spec.prompts), "new_tokens": spec.new_tokens,
        "batch_size": spec.batch, "cache_len": static, "buckets": list(spec.buckets),
        "n_params": models.n_params(model), "weights": spec.weights,
        "prompt_tokens": [p.tolist() for p in prompts], "tokens": outputs,
        "device": str(device), "threads": decode_threads, "memory": backend.memory_info(),
        "cache": backend.cache_info(runs_before),
    }


def _decode(ctx: Any, spec: GenerationSpec, backend: Backend, lm: Any, wrap: Any,
            prompts: list[torch.Tensor]) -> tuple[list[list[list[int]]], int | None]:
    """Every request of the run, one after another: (tokens per request and batch row, the
    static cache's length or None)."""
    with torch.no_grad():
        static = spec.cache_positions
        shared = lm.new_cache(static, spec.batch) if static is not None else None
        loop = _Loop(ctx, spec, backend, lm, wrap, shared)
        placed = [loop.place(r, p) for r, p in enumerate(prompts)]
        if spec.mode != "torch_eager" and backend.runtime.xla:
            import torch_xla

            torch_xla.sync()  # weights, prompts and the static cache on the device first
        if "hlo" in spec.capture and backend.runtime.xla:  # after set-up's own sync
            from .xla import HLOCapture

            backend.capture = HLOCapture()
        backend.start_counting()
        backend.after_evaluation()  # set-up's own compilations are nobody's token
        outputs = [loop.request(r, ids) for r, ids in enumerate(placed)]
    return outputs, static


class _Loop:
    """The decode loop of one run: the mode's wrapped step functions, one request at a time."""

    def __init__(self, ctx: Any, spec: GenerationSpec, backend: Backend, lm: Any, wrap: Any,
                 shared: Any):
        self.ctx, self.spec, self.backend, self.lm, self.shared = ctx, spec, backend, lm, shared
        self.step = 0  # tokens generated in the run so far
        self.earlier: list[dict[str, Any]] = []  # the shapes of every step so far
        self.cache: Any = None

        def naive(seq: torch.Tensor) -> Any:
            pos = torch.arange(seq.size(1), device=seq.device)  # a new length anyway
            logits = lm.logits(seq, pos, None, seq.size(1))
            top, nxt = logits[:, -1].max(-1, keepdim=True)
            return torch.cat([seq, nxt], dim=1), nxt, top

        # Each step returns the greedy token and its logit (B, 1): the logits show a wrong
        # mask or position even where a random model's argmax happens to agree.
        def prefill(ids: torch.Tensor, pos: torch.Tensor, last: torch.Tensor) -> Any:
            if self.spec.cache_positions is not None:  # a static cache: write from position 0
                lm.seek(self.cache, torch.zeros_like(last))
            logits = lm.logits(ids, pos, self.cache, self._key_len(ids, pos))
            if self.spec.cache_positions is not None:  # decode writes after the real prompt
                lm.seek(self.cache, last + 1)
            return logits.index_select(1, last)[:, 0].max(-1, keepdim=True)[::-1]

        def decode(tok: torch.Tensor, pos: torch.Tensor) -> Any:
            logits = lm.logits(tok, pos, self.cache, self._key_len(tok, pos))
            return logits[:, -1].max(-1, keepdim=True)[::-1]

        self.naive, self.prefill, self.decode = (wrap(naive, "naive"), wrap(prefill, "prefill"),
                                                 wrap(decode, "decode"))

    def _key_len(self, ids: torch.Tensor, pos: torch.Tensor) -> int:
        if self.spec.cache_positions is not None:
            return self.spec.cache_positions
        return self.pos_end  # a growing cache holds every position so far

    def place(self, r: int, prompt: torch.Tensor) -> dict[str, Any]:
        """One request's inputs on the device (bucketed: right-padded to its bucket)."""
        p, dev, n = prompt.size(1), self.backend.device, self.spec.new_tokens
        if self.spec.decode == "bucketed":
            prompt = F.pad(prompt, (0, generation.bucket_for(p, self.spec.buckets) - p))
        return {"ids": prompt.to(dev), "pos": _positions(0, prompt.size(1), dev),
                "last": torch.tensor([p - 1]).to(dev), "len": p,
                "decode_pos": [_positions(p + i - 1, 1, dev) for i in range(1, n)]}

    def request(self, r: int, req: dict[str, Any]) -> list[list[int]]:
        """Generate the request's new tokens; return them per batch row."""
        spec, p = self.spec, req["len"]
        strategy = spec.decode
        self.cache = self.shared if self.shared is not None else (
            self.lm.new_cache(None, spec.batch) if strategy == "dynamic_cache" else None)
        seq, tok, out = req["ids"], None, []
        for i in range(spec.new_tokens):
            self.ctx.check_cancel()
            phase = "prefill" if i == 0 else "decode"
            if strategy == "naive":
                shapes = {"input_ids": list(seq.shape)}
            else:
                fed = req["ids"] if i == 0 else tok
                shapes = {"input_ids": list(fed.shape), "cache": self.lm.cache_shape(self.cache)}
            self.pos_end = p + i if i else req["ids"].size(1)
            t0 = time.perf_counter()
            if strategy == "naive":
                seq, tok, top = self.naive(seq)
            elif i == 0:
                tok, top = self.prefill(req["ids"], req["pos"], req["last"])
            else:
                tok, top = self.decode(tok, req["decode_pos"][i - 1])
            self.backend.wait(tok)
            wall_ms = (time.perf_counter() - t0) * 1e3
            counts = self.backend.step_counts()
            ids = tok.to("cpu")[:, 0].tolist()
            out.append(ids)
            seq_len = shapes["input_ids"][1]
            cache_len = (spec.cache_positions or (p + i if strategy == "dynamic_cache" else 0))
            self.ctx.emit({"kind": "token", "strategy": strategy, "request": r,
                           "prompt_len": p, "token": i, "phase": phase, "seq_len": seq_len,
                           "cache_len": cache_len, "wall_ms": wall_ms, **counts,
                           "cache_bytes": self.lm.cache_bytes(self.cache),
                           "token_id": ids[0], "top_logit": float(top.to("cpu")[0, 0])})
            for record in self.backend.compile_records(self.step, counts, ""):
                record.update(strategy=strategy, request=r, token=i, phase=phase,
                              explanation=generation.explain(strategy, phase, shapes,
                                                             self.earlier))
                self.ctx.emit(record)
            if counts.get("compiles") and self.backend.capture is not None:
                self.backend.capture.collect(self.ctx.out_dir / "hlo" / f"r{r}_t{i}_{phase}")
            self.earlier.append({"phase": phase, "shapes": shapes})
            self.step += 1
        return [list(row) for row in zip(*out, strict=True)]
