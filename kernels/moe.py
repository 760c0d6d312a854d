"""Mixture-of-experts with static shapes: top-k routing dispatched to experts of fixed capacity
(GShard's einsums), as a Transformers experts implementation.

Transformers' own Mixtral experts loop over the experts a batch hit (``nonzero`` and
``torch.where``: data-dependent shapes, a host read per layer on torch_xla), and its
``batched_mm`` gathers a weight matrix per token. Here every shape is known when the step is
traced, so it compiles once and partitions like any einsum:

* tokens are cut into groups (:func:`group_size`: :data:`GROUP_TOKENS` of a sequence, or the
  whole sequence where it is shorter or they do not divide it); in each group an expert takes
  at most ``capacity = ceil(CAPACITY_FACTOR * group * top_k / experts)`` tokens, in token
  order (the rest are dropped: their expert output is zero, the residual carries them);
* ``dispatch`` (group, token, expert, slot) is one-hot; ``x = einsum(dispatch, tokens)`` gives
  each expert its slots, the experts' SwiGLU runs as batched matmuls over (expert, slot), and
  ``combine`` (dispatch times the router's weights) sums them back per token.

With the experts' weights split over a mesh axis (expert parallelism,
``expert_axis="model"``), the slots are split the same way: GSPMD moves tokens to their
experts and back with an all-to-all on that axis. Cost beside the experts' own matmuls: the
dispatch and combine einsums, ``4 * tokens * experts * capacity * hidden`` FLOPs per layer
(about 6% of Mixtral-8x7B's expert matmuls at 1024-token groups).

Importing this module imports neither torch_xla nor transformers.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn import functional as F

IMPLEMENTATION = "static_capacity"
CAPACITY_FACTOR = 1.25  # slots per expert over a perfectly even share (GShard, Switch: 1.0-2.0)
GROUP_TOKENS = 1024  # tokens routed together; a sequence shorter than this is one group


def register() -> str:
    """Add :func:`experts_forward` to Transformers' experts implementations (idempotent)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION, experts_forward)
    return IMPLEMENTATION


def capacity(group: int, top_k: int, experts: int) -> int:
    """Slots per expert in a group of `group` tokens."""
    return max(1, math.ceil(CAPACITY_FACTOR * group * top_k / experts))


def group_size(seq_len: int) -> int:
    """The routing group of a `seq_len`-token sequence: :data:`GROUP_TOKENS` where they divide
    it, else the whole sequence. Groups never straddle two sequences, so they split with the
    batch (each chip routes its own)."""
    return GROUP_TOKENS if seq_len % GROUP_TOKENS == 0 else seq_len



def group_of(tokens: int, sequence_group: int | None) -> int:
    """The group size for `tokens` tokens: the model's `sequence_group` (:func:`group_size` of
    the sequences it trains on) where it divides them, else :data:`GROUP_TOKENS` where that
    does (a traced step's sequences of another length: 8192 tokens, not the task's 8191),
    else all of them, which is never meant for a large batch: a group's routing tensors grow
    with its square (Mixtral-8x7B's traced step, its whole batch one group, asked the TPU
    compiler for 62 GB of temporaries per chip at one sequence per chip of a v6e-64)."""
    for g in (sequence_group, GROUP_TOKENS):
        if g and tokens % g == 0:
            return g
    return tokens


def experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """Transformers' experts call: `hidden_states` (tokens, hidden), `top_k_index` and
    `top_k_weights` (tokens, top_k) -> (tokens, hidden). `self` holds ``gate_up_proj``
    (experts, 2 * inner, hidden) and ``down_proj`` (experts, hidden, inner)."""
    tokens, hidden = hidden_states.shape
    top_k = top_k_index.shape[-1]
    experts = self.gate_up_proj.shape[0]
    g = group_of(tokens, getattr(self, "group_tokens", None))
    slots = capacity(g, top_k, experts)
    choice = F.one_hot(top_k_index, experts).to(hidden_states.dtype)  # (tokens, k, experts)
    choice = choice.reshape(tokens // g, g * top_k, experts)  # token-major within a group
    # Each (token, choice)'s place in its expert's queue; beyond capacity it is dropped.
    place = (torch.cumsum(choice, dim=1) - 1) * choice
    kept = choice * (place < slots).to(choice.dtype)
    onehot = F.one_hot(place.to(torch.int64).clamp(0, slots - 1), slots).to(choice.dtype)
    route = (kept.unsqueeze(-1) * onehot).reshape(tokens // g, g, top_k, experts, slots)
    weights = top_k_weights.to(route.dtype).reshape(tokens // g, g, top_k, 1, 1)
    dispatch = route.sum(dim=2)  # (groups, g, experts, slots)
    combine = (route * weights).sum(dim=2)
    x = torch.einsum("gtes,gtd->gesd", dispatch, hidden_states.reshape(tokens // g, g, hidden))
    x = _constrain(self, x)
    gate, up = torch.einsum("gesd,efd->gesf", x, self.gate_up_proj).chunk(2, dim=-1)
    y = torch.einsum("gesf,edf->gesd", F.silu(gate) * up, self.down_proj)
    y = _constrain(self, y)
    out = torch.einsum("gtes,gesd->gtd", combine, y)
    return out.reshape(tokens, hidden).to(hidden_states.dtype)


def _constrain(module: Any, x: torch.Tensor) -> torch.Tensor:
    """On torch_xla SPMD, the slots (groups, experts, slots, hidden) split as the worker says:
    the groups over ``module.group_axes`` (as the batch is split: without this GSPMD kept
    every chip's copy of all groups, 326 GB of temporaries for Mixtral-8x7B at one sequence
    per chip of a v6e-64), the experts over ``module.expert_axis`` (ep: the partitioner then
    moves tokens to their experts with an all-to-all)."""
    axis = getattr(module, "expert_axis", None)
    groups = tuple(getattr(module, "group_axes", ()))
    if not (axis or groups) or x.device.type != "xla":
        return x
    import torch_xla.distributed.spmd as xs

    mesh = xs.get_global_mesh()
    if mesh is None or not set(groups) | {axis} - {None} <= set(mesh.axis_names):
        return x
    xs.mark_sharding(x, mesh, (groups[0] if len(groups) == 1 else groups or None, axis,
                               None, None))
    return x
