"""minGPT's configuration (no torch: checking a spec reads it; :mod:`.mingpt` has the rest)."""

from __future__ import annotations

from dataclasses import dataclass


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
