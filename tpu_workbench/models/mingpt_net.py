"""minGPT's network: attention, MLP, blocks and the GPT module, and its KV cache for generation.

The configuration is in :mod:`.mingpt_config`; the sorting task and the family the runner uses
are in :mod:`.mingpt`, which imports this module (and torch) only when a model is built, so
checking a spec needs no torch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .mingpt_config import GPTConfig


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
