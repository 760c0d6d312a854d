"""TorchTitan overrides the workbench's CPU runs activate (``--override.imports``).

TorchTitan 0.3.0's Llama 3 attends with FlexAttention, which has no backward pass on a CPU
(torch 2.13: "FlexAttention does not support backward on CPU"), and its SDPA module cannot take
the per-document masks. :func:`causal_sdpa` swaps every FlexAttention for causal scaled
dot-product attention (documents packed in one sequence then see the earlier documents of that
sequence, as nanoGPT's do). Under tensor parallelism its inputs are DTensors sharded over
heads, and PyTorch has no sharding rule for the CPU's fused SDPA kernel: each rank attends
over its own heads (exactly what a head-sharded attention computes) and hands the result back
as a DTensor of the same layout. Activated through TorchTitan's own override mechanism, so
the command a run records reproduces it outside the workbench.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.tensor import DTensor, Replicate, Shard
from torchtitan.config import override
from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention

HEAD_DIM = 2  # (batch, length, heads, head_dim): the layout TorchTitan's attention takes


class HeadLocalSDPA(ScaledDotProductAttention):
    """Causal SDPA on each rank's own heads (plain tensors pass straight through)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ScaledDotProductAttention.Config):
        pass

    def forward(self, q, k, v, **kwargs):
        if not isinstance(q, DTensor):
            return super().forward(q, k, v, **kwargs)
        for t in (q, k, v):
            if any(not (isinstance(p, Replicate) or isinstance(p, Shard) and p.dim == HEAD_DIM)
                   for p in t.placements):
                raise ValueError(f"attention on this rank's own heads needs q, k and v "
                                 f"sharded over heads or replicated, got {t.placements}")
        out = super().forward(q.to_local(), k.to_local(), v.to_local(), **kwargs)
        return DTensor.from_local(out, q.device_mesh, q.placements, run_check=False)


@override(target=FlexAttention.Config,
          description="causal SDPA on each rank's heads: FlexAttention has no CPU backward")
def causal_sdpa(cfg: FlexAttention.Config) -> HeadLocalSDPA.Config:
    return HeadLocalSDPA.Config()
