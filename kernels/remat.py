"""Activation checkpointing (remat) of whole blocks: a block's forward keeps only its inputs and
runs again in the backward.

On torch_xla tensors it is ``torch_xla.utils.checkpoint.checkpoint``, as torchprime uses it: it
puts an ``opt-barrier`` before the recomputation, without which XLA's CSE merges the recomputed
forward with the original and nothing is saved (``torch.utils.checkpoint`` has no barrier). On
other tensors it is ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``. Importing this
module does not import torch_xla.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MethodType
from typing import Any

import torch
from torch import nn


def checkpoint_blocks(blocks: Iterable[nn.Module]) -> None:
    """Checkpoint each module of `blocks` (a model's decoder layers) in place: its ``forward``
    becomes a checkpointed call of the original; parameter names do not change."""
    for block in blocks:
        if "_unchecked_forward" not in block.__dict__:
            block._unchecked_forward = block.forward
            block._positional_forward = MethodType(_positional_forward, block)
            block.forward = MethodType(_checkpointed_forward, block)


def _checkpointed_forward(block: nn.Module, *args: Any, **kwargs: Any) -> Any:
    tensors = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
        return block._unchecked_forward(*args, **kwargs)  # nothing to recompute for
    if tensors[0].device.type != "xla":
        return torch.utils.checkpoint.checkpoint(block._unchecked_forward, *args,
                                                 use_reentrant=False, **kwargs)
    from torch_xla.utils.checkpoint import checkpoint

    # torch_xla's checkpoint takes positional arguments only: pass the keywords' names and
    # values after them (as torch_xla.distributed.fsdp.checkpoint_module does). A bound method
    # of the block, so the barrier also covers its weights.
    return checkpoint(block._positional_forward, len(args), len(kwargs), *args, *kwargs,
                      *kwargs.values())


def _positional_forward(block: nn.Module, n_args: int, n_kwargs: int, *packed: Any) -> Any:
    args, names, values = (packed[:n_args], packed[n_args:n_args + n_kwargs],
                           packed[n_args + n_kwargs:])
    return block._unchecked_forward(*args, **dict(zip(names, values, strict=True)))
