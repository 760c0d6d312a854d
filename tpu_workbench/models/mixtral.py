"""Mixtral (``hf:mixtral``): Transformers' Mixtral by config, its experts on static capacity
(:mod:`kernels.moe`), from random weights. The task, presets and options work as every
:mod:`.hf` family's."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from ..errors import SpecError
from .hf import _TINY, HFConfig, HFFamily


class MixtralFamily(HFFamily):
    """Mixtral: Llama's attention, and a sparse MLP of ``num_local_experts`` SwiGLU experts of
    which a router picks ``num_experts_per_tok`` per token. The experts run
    :mod:`kernels.moe` (static capacity, GShard's dispatch einsums: one compile, all-to-all
    under expert parallelism), not Transformers' loop over the experts a batch hit (a host
    read per layer on torch_xla)."""

    name = "hf:mixtral"
    model_type = "mixtral"
    moe_fields: ClassVar[tuple[str, str]] = ("num_local_experts", "num_experts_per_tok")
    size_fields = (*HFFamily.size_fields, *moe_fields)
    presets = {
        # 4 experts, top-2: tensor or expert parallelism splits them over a model axis of 4.
        "tiny": HFConfig(dict(_TINY, num_local_experts=4, num_experts_per_tok=2)),
        # mistralai/Mixtral-8x7B-v0.1: 46,702,792,704 parameters (12.9 B active per token).
        "mixtral-8x7b": HFConfig(dict(
            vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
            num_experts_per_tok=2, max_position_embeddings=32768, rms_norm_eps=1e-5,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), batch_size=8),
        # mistralai/Mixtral-8x22B-v0.1: 141 B parameters published (140,630,071,296 here).
        "mixtral-8x22b": HFConfig(dict(
            vocab_size=32768, hidden_size=6144, intermediate_size=16384, num_hidden_layers=56,
            num_attention_heads=48, num_key_value_heads=8, num_local_experts=8,
            num_experts_per_tok=2, max_position_embeddings=65536, rms_norm_eps=1e-5,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), batch_size=8),
    }

    def expert_count(self, cfg: HFConfig) -> int:
        return int(self.hf_config(cfg).num_local_experts)

    def check_config(self, cfg: HFConfig) -> None:
        super().check_config(cfg)
        hf_cfg = self.hf_config(cfg)
        if hf_cfg.num_experts_per_tok > hf_cfg.num_local_experts:
            raise SpecError(f"{self.name} num_experts_per_tok={hf_cfg.num_experts_per_tok} "
                            f"exceeds num_local_experts={hf_cfg.num_local_experts}")

    def hf_config(self, cfg: HFConfig) -> Any:
        from kernels.moe import IMPLEMENTATION, register

        register()
        hf_cfg = super().hf_config(cfg)
        hf_cfg._experts_implementation = IMPLEMENTATION
        hf_cfg.router_jitter_noise = 0.0  # no noise: XLA and plain PyTorch compute the same
        return hf_cfg

    def build(self, cfg: HFConfig) -> nn.Module:
        from kernels.moe import group_size

        net = super().build(cfg)
        for module in net.modules():  # the experts route groups of one sequence's tokens
            if hasattr(module, "gate_up_proj"):
                module.group_tokens = group_size(2 * cfg.length - 1)
        return net

    def layer_matmul_params(self, hf_cfg: Any) -> int:
        """The weights one token meets in a layer: attention, the router and its top-k experts
        (the ones it is not routed to do no work for it)."""
        d, heads, kv = hf_cfg.hidden_size, hf_cfg.num_attention_heads, hf_cfg.num_key_value_heads
        head_dim = getattr(hf_cfg, "head_dim", None) or d // heads
        return (2 * d * heads * head_dim + 2 * d * kv * head_dim
                + hf_cfg.num_experts_per_tok * 3 * d * hf_cfg.intermediate_size
                + d * hf_cfg.num_local_experts)
