"""minGPT: a small decoder-only transformer (after Karpathy's minGPT), learning to sort digits.

Task (minGPT's sorting demo): a sequence of ``length`` random digits in ``range(n_digits)`` is
followed by its sorted version, e.g. ``2 0 1 1 0 2 | 0 0 1 1 2 2``. The model reads the sequence
without its last token and predicts the next token at every position; only predictions of the
sorted half are scored (the targets of the other positions are -1, ignored).

The model is short on purpose (a notebook shows this source). Its Linear layers have GPT-2's
names (``attn.c_attn``, ``attn.c_proj``, ``mlp.c_fc``, ``mlp.c_proj``) so tensor-parallel sharding
rules can find them, and ``lm_head`` shares its weight with the token embedding ``transformer.wte``
as in GPT-2, so the ``gpt2`` preset has GPT-2 small's 124,439,808 parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SpecError
from .base import Batch, ModelFamily


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    vocab_size: int = 3  # at least n_digits
    block_size: int = 11  # longest sequence the position embedding covers: >= 2 * length - 1
    length: int = 6  # digits to sort
    n_digits: int = 3  # digits are 0 .. n_digits - 1
    batch_size: int = 32
    # "xla": the attention math below, compiled by XLA. "pallas": the Pallas flash-attention
    # kernel in kernels/ (kernels.torch_bridge): compiled on a TPU; Pallas' TPU interpret mode on
    # plain-PyTorch CPU tensors (slow: small shapes only); a clear error on XLA:CPU.
    attention: str = "xla"


ATTENTION_IMPLS = ("xla", "pallas")


class KVCache:
    """One layer's keys and values of the tokens seen so far, (B, n_head, length, head_dim).

    ``static``: preallocated at `length` and written in place at the tokens' positions, so every
    decode step has the same shapes (one XLA program); keys past the newest position hold
    stale values, which the attention mask hides. Not static: the tensors grow by one position
    per token, a new shape (and on XLA a new program) every step, like HF's DynamicCache."""

    def __init__(self, static: bool, shape: tuple[int, ...] = (),
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.static = static
        self.k = torch.zeros(shape, dtype=dtype, device=device) if static else None
        self.v = torch.zeros(shape, dtype=dtype, device=device) if static else None

    def update(self, k: torch.Tensor, v: torch.Tensor,
               pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `k`, `v` (B, H, T, D) at positions `pos` (T,); return every cached key, value."""
        if self.static:
            self.k.index_copy_(2, pos, k)  # pos is a tensor: the program does not depend on it
            self.v.index_copy_(2, pos, v)
        else:
            self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
            self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)


def kv_cache(cfg: GPTConfig, batch_size: int, length: int | None = None,
             device: torch.device | str = "cpu") -> list[KVCache]:
    """A cache per layer: static of `length` positions, or growing when `length` is None."""
    shape = (batch_size, cfg.n_head, length or 0, cfg.n_embd // cfg.n_head)
    return [KVCache(length is not None, shape, device=device) for _ in range(cfg.n_layer)]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.attention = cfg.attention
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)  # q, k, v for all heads at once
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, cfg.block_size, cfg.block_size),
                             persistent=False)

    def forward(self, x: torch.Tensor, kv: KVCache | None = None,
                pos: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if kv is not None:  # generation: attend to every cached key up to each query's position
            k, v = kv.update(k, v, pos)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            allowed = torch.arange(k.size(2), device=x.device)[None, :] <= pos[:, None]
            y = F.softmax(att.masked_fill(~allowed, float("-inf")), dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        if self.attention == "pallas":  # online softmax over key blocks, in one Pallas kernel
            from kernels.torch_bridge import flash_attention

            y = flash_attention(q, k, v, causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        # Explicit attention math rather than F.scaled_dot_product_attention: on torch_xla 2.9
        # (XLA:CPU) both run with no CPU fallback in lazy mode, torch_xla.compile and
        # torch.compile(backend="openxla"), and SDPA lowers to this same math anyway (plus extra
        # isneginf/all/where ops). Written out, the QK^T and AV dots are plain to see in the HLO.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, kv: KVCache | None = None,
                pos: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), kv, pos)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
            ln_f=nn.LayerNorm(cfg.n_embd),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in GPT-2
        # GPT-2 init: N(0, 0.02), residual projections scaled down by sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def _apply(self, fn, *args, **kwargs):
        # Module.to() replaces each parameter separately when the tensor type changes (CPU ->
        # XLA, meta -> CPU with to_empty), which would untie lm_head from wte: tie them again.
        super()._apply(fn, *args, **kwargs)
        self.lm_head.weight = self.transformer.wte.weight
        return self

    def forward(self, idx: torch.Tensor, cache: list[KVCache] | None = None,
                pos: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, vocab_size) of the next token at each position of `idx` (B, T).

        Generation passes a `cache` (one :class:`KVCache` per layer, see :func:`kv_cache`) and
        `pos`, the positions (T,) of `idx`'s tokens in the sequence: each layer then appends
        its keys and values to the cache and attends to everything cached so far."""
        if pos is None:
            pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for i, block in enumerate(self.transformer.h):
            x = block(x) if cache is None else block(x, cache[i], pos)
        return self.lm_head(self.transformer.ln_f(x))


def forward_matmul_flops(cfg: GPTConfig, batch_size: int) -> float:
    """FLOPs (2*M*N*K) of every matmul in one forward pass over a batch of the sorting task.

    With tokens N = batch_size * T (T = 2 * length - 1 positions), width d and vocab V, per layer:
    c_attn 2*N*d*3d, QK^T 2*N*T*d, AV 2*N*T*d, attn.c_proj 2*N*d*d, mlp.c_fc 2*N*d*4d,
    mlp.c_proj 2*N*4d*d, i.e. 24*N*d^2 + 4*N*T*d; plus lm_head 2*N*d*V. The full T x T score
    matrix is counted (the causal mask does not skip any work). Embedding lookups, LayerNorm,
    softmax and GELU are not matmuls and are left out.
    """
    d, T = cfg.n_embd, 2 * cfg.length - 1
    n_tokens = batch_size * T
    per_layer = 24 * n_tokens * d * d + 4 * n_tokens * T * d
    return float(cfg.n_layer * per_layer + 2 * n_tokens * d * cfg.vocab_size)


class MinGPTFamily(ModelFamily):
    name = "mingpt"
    presets = {
        "tiny": GPTConfig(),
        "gpt-mini": GPTConfig(n_layer=6, n_head=6, n_embd=192),  # minGPT's gpt-mini, 2.7 M
        "gpt2": GPTConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, block_size=1024,
                          batch_size=8),  # GPT-2 small, 124 M
    }
    item_unit = "tokens"
    sequence_dim = 1
    default_lr = 5e-4  # minGPT's sorting demo

    def model_axis_widths(self, cfg: GPTConfig) -> dict[str, int]:
        return {"n_head": cfg.n_head, "n_embd": cfg.n_embd}  # heads and widths split evenly

    positions_field = "block_size"  # the option that sets how many positions generation has

    def positions(self, cfg: GPTConfig) -> int:
        """The longest sequence the position embedding covers."""
        return cfg.block_size

    def check_config(self, cfg: GPTConfig) -> None:
        for key in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size", "length",
                    "n_digits", "batch_size"):
            value = getattr(cfg, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SpecError(f"mingpt {key} must be a positive int, got {value!r}")
        if cfg.attention not in ATTENTION_IMPLS:
            raise SpecError(f"mingpt attention={cfg.attention!r} is not one of {ATTENTION_IMPLS} "
                            "('pallas' runs the kernel in kernels/: compiled on a TPU, interpret "
                            "mode on plain-PyTorch CPU)")
        if cfg.n_embd % cfg.n_head:
            raise SpecError(f"mingpt n_head={cfg.n_head} must divide n_embd={cfg.n_embd}")
        if cfg.n_digits < 2:
            raise SpecError(f"mingpt n_digits must be at least 2, got {cfg.n_digits}")
        if cfg.vocab_size < cfg.n_digits:
            raise SpecError(f"mingpt vocab_size={cfg.vocab_size} is smaller than "
                            f"n_digits={cfg.n_digits}; it must be at least n_digits")
        if cfg.block_size < 2 * cfg.length - 1:
            raise SpecError(f"mingpt block_size={cfg.block_size} is shorter than the task's "
                            f"sequence (2 * length - 1 = {2 * cfg.length - 1} for "
                            f"length={cfg.length}); it must be at least that")

    def build(self, cfg: GPTConfig) -> nn.Module:
        return GPT(cfg)

    def make_batch(self, cfg: GPTConfig, batch_size: int, generator: torch.Generator) -> Batch:
        digits = torch.randint(cfg.n_digits, (batch_size, cfg.length), generator=generator)
        seq = torch.cat([digits, digits.sort(dim=1).values], dim=1)
        x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
        y[:, : cfg.length - 1] = -1  # score only the predictions of the sorted half
        return {"x": x, "y": y}

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        logits = model(batch["x"])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch["y"].reshape(-1),
                               ignore_index=-1)

    def evaluate(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Accuracy of the sorted half's tokens, each predicted from the true prefix."""
        y = batch["y"]
        scored = y != -1
        correct = (model(batch["x"]).argmax(dim=-1) == y) & scored
        return correct.sum().float() / scored.sum().float()

    @torch.no_grad()
    def sort_examples(self, model: nn.Module, cfg: GPTConfig, n: int,
                      generator: torch.Generator) -> list[dict[str, object]]:
        """Let `model` sort `n` random digit sequences by greedy decoding (its own outputs
        feed back in, unlike `evaluate`'s teacher forcing): input, expected, predicted, ok."""
        digits = torch.randint(cfg.n_digits, (n, cfg.length), generator=generator)
        seq = digits
        for _ in range(cfg.length):
            logits = model(seq)[:, -1, : cfg.n_digits]
            seq = torch.cat([seq, logits.argmax(dim=-1, keepdim=True)], dim=1)
        expected = digits.sort(dim=1).values
        predicted = seq[:, cfg.length:]
        return [{"input": d.tolist(), "expected": e.tolist(), "predicted": p.tolist(),
                 "ok": bool((e == p).all())}
                for d, e, p in zip(digits, expected, predicted, strict=True)]

    def items_per_batch(self, cfg: GPTConfig, batch_size: int) -> int:
        return batch_size * (2 * cfg.length - 1)

    def forward_matmul_flops(self, cfg: GPTConfig, batch_size: int) -> float:
        return forward_matmul_flops(cfg, batch_size)

    def flops_per_step(self, cfg: GPTConfig, batch_size: int) -> float:
        """3 x forward_matmul_flops: the backward pass does two matmuls for each forward one."""
        return 3 * forward_matmul_flops(cfg, batch_size)
