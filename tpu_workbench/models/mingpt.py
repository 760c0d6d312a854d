"""minGPT: a small decoder-only transformer (after Karpathy's minGPT), learning to sort digits.

Task (minGPT's sorting demo): a sequence of ``length`` random digits in ``range(n_digits)`` is
followed by its sorted version, e.g. ``2 0 1 1 0 2 | 0 0 1 1 2 2``. The model reads the sequence
without its last token and predicts the next token at every position; only predictions of the
sorted half are scored (the targets of the other positions are -1, ignored).

The model is short on purpose (a notebook shows this source). Its Linear layers have GPT-2's
names (``attn.c_attn``, ``attn.c_proj``, ``mlp.c_fc``, ``mlp.c_proj``) so tensor-parallel sharding
rules can find them, and ``lm_head`` shares its weight with the token embedding ``transformer.wte``
as in GPT-2, so the ``gpt2`` preset has GPT-2 small's 124,439,808 parameters.

This module holds the task and the family and imports no torch at import (checking a spec needs
none); the configuration is in :mod:`.mingpt_config`, the network in :mod:`.mingpt_net`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import SpecError
from .base import Batch, ModelFamily, TransformerShape
from .mingpt_config import ATTENTION_IMPLS, GPTConfig

if TYPE_CHECKING:
    import torch
    from torch import nn


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

    def transformer_shape(self, cfg: GPTConfig) -> TransformerShape:
        return TransformerShape(hidden=cfg.n_embd, layers=cfg.n_layer, heads=cfg.n_head,
                                kv_heads=cfg.n_head, head_dim=cfg.n_embd // cfg.n_head,
                                intermediate=4 * cfg.n_embd, vocab=cfg.vocab_size, mlp="gelu",
                                layers_option="n_layer")

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
        from .mingpt_net import GPT

        return GPT(cfg)

    def make_batch(self, cfg: GPTConfig, batch_size: int, generator: torch.Generator) -> Batch:
        import torch

        digits = torch.randint(cfg.n_digits, (batch_size, cfg.length), generator=generator)
        seq = torch.cat([digits, digits.sort(dim=1).values], dim=1)
        x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
        y[:, : cfg.length - 1] = -1  # score only the predictions of the sorted half
        return {"x": x, "y": y}

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        import torch.nn.functional as F

        logits = model(batch["x"])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch["y"].reshape(-1),
                               ignore_index=-1)

    def evaluate(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Accuracy of the sorted half's tokens, each predicted from the true prefix."""
        y = batch["y"]
        scored = y != -1
        correct = (model(batch["x"]).argmax(dim=-1) == y) & scored
        return correct.sum().float() / scored.sum().float()

    def sort_examples(self, model: nn.Module, cfg: GPTConfig, n: int,
                      generator: torch.Generator) -> list[dict[str, object]]:
        """Let `model` sort `n` random digit sequences by greedy decoding (its own outputs
        feed back in, unlike `evaluate`'s teacher forcing): input, expected, predicted, ok."""
        import torch

        digits = torch.randint(cfg.n_digits, (n, cfg.length), generator=generator)
        seq = digits
        with torch.no_grad():
            for _ in range(cfg.length):
                logits = model(seq)[:, -1, : cfg.n_digits]
                seq = torch.cat([seq, logits.argmax(dim=-1, keepdim=True)], dim=1)
        expected = digits.sort(dim=1).values
        predicted = seq[:, cfg.length:]
        return [{"input": d.tolist(), "expected": e.tolist(), "predicted": p.tolist(),
                 "ok": bool((e == p).all())}
                for d, e, p in zip(digits, expected, predicted, strict=True)]

    def task_prompts(self, cfg: GPTConfig, length: int, batch_size: int,
                     generator: torch.Generator) -> torch.Tensor:
        """`batch_size` prompts (B, `length`) of the sorting task, for generation: ``cfg.length``
        random digits, then the first ``length - cfg.length`` of their sorted version (an answer
        begun, which the model is to finish). Shorter than ``cfg.length``: random digits, which
        the task gives no answer for (:meth:`task_answer` says None), as for the random digits
        that follow a finished answer in prompts longer than ``2 * cfg.length``."""
        import torch

        digits = torch.randint(cfg.n_digits, (batch_size, max(length, 2 * cfg.length)),
                               generator=generator)
        seq = torch.cat([digits[:, : cfg.length], digits[:, : cfg.length].sort(dim=1).values,
                         digits[:, 2 * cfg.length:]], dim=1)
        return seq[:, :length].clone()

    def task_answer(self, cfg: GPTConfig, prompt: list[int]) -> list[int] | None:
        """The tokens the sorting task says follow `prompt`: the rest of the sorted digits
        (``2 0 1 1 0 2 0 0`` -> ``1 1 2 2``). None where `prompt` is not the start of a task
        sequence (shorter than ``cfg.length`` digits, a digit out of range, or a begun answer
        that is not the sorted digits)."""
        if len(prompt) < cfg.length or any(not 0 <= t < cfg.n_digits for t in prompt):
            return None
        ordered = sorted(prompt[: cfg.length])
        begun = list(prompt[cfg.length:])
        if len(begun) > cfg.length or ordered[: len(begun)] != begun:
            return None
        return ordered[len(begun):]

    def items_per_batch(self, cfg: GPTConfig, batch_size: int) -> int:
        return batch_size * (2 * cfg.length - 1)

    def forward_matmul_flops(self, cfg: GPTConfig, batch_size: int) -> float:
        return forward_matmul_flops(cfg, batch_size)

    def flops_per_step(self, cfg: GPTConfig, batch_size: int) -> float:
        """3 x forward_matmul_flops: the backward pass does two matmuls for each forward one."""
        return 3 * forward_matmul_flops(cfg, batch_size)


# The network lives in mingpt_net (torch); its names are importable from here too.
_NET = ("CausalSelfAttention", "MLP", "Block", "GPT", "KVCache", "kv_cache")


def __getattr__(name: str) -> Any:
    if name in _NET:
        from . import mingpt_net

        return getattr(mingpt_net, name)
    raise AttributeError(name)
