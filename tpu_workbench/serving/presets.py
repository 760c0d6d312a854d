"""The models a serving plan knows: each a Hugging Face config (the published model's own
``config.json`` values) and the tpu-inference JAX class that serves it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import SpecError


@dataclass(frozen=True)
class ServePreset:
    name: str
    model: str  # the workbench's family name: hf:llama, hf:qwen3
    architecture: str  # tpu-inference's class (models/jax/llama3.py, qwen3.py)
    hf_name: str  # what `vllm serve` is given
    config: dict[str, Any]

    @property
    def layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def head_dim(self) -> int:
        return int(self.config.get("head_dim") or self.config["hidden_size"]
                   // self.config["num_attention_heads"])

    def params(self) -> int:
        """Parameters: embedding, LM head (untied here), attention, MLP and norms."""
        c = self.config
        d, f, v, hd = c["hidden_size"], c["intermediate_size"], c["vocab_size"], self.head_dim
        q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
        attn = d * q + 2 * d * kv + q * d + (2 * hd if self.architecture.startswith("Qwen3")
                                             else 0)  # Qwen3's q/k norms
        return int(2 * v * d + self.layers * (attn + 3 * d * f + 2 * d) + d)


_LLAMA = {"vocab_size": 128256, "head_dim": 128, "rope_theta": 500000.0,
          "max_position_embeddings": 131072, "tie_word_embeddings": False}
# Llama 3.1/3.3's "llama3" rope scaling is left out: it changes the rotary frequencies
# (elementwise work on q and k), not the program's matmuls, KV pages or collectives.
_QWEN3 = {"vocab_size": 151936, "head_dim": 128, "rope_theta": 1000000.0,
          "max_position_embeddings": 40960, "tie_word_embeddings": False}

PRESETS: dict[str, ServePreset] = {p.name: p for p in (
    ServePreset("llama-3.1-8b", "hf:llama", "LlamaForCausalLM",
                "meta-llama/Llama-3.1-8B-Instruct",
                {**_LLAMA, "hidden_size": 4096, "intermediate_size": 14336,
                 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8}),
    ServePreset("llama-3.3-70b", "hf:llama", "LlamaForCausalLM",
                "meta-llama/Llama-3.3-70B-Instruct",
                {**_LLAMA, "hidden_size": 8192, "intermediate_size": 28672,
                 "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8}),
    # Two small layers: what smoke runs, CI and the tests compile (seconds, not minutes).
    ServePreset("tiny-llama", "hf:llama", "LlamaForCausalLM", "(tiny: no published weights)",
                {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
                 "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
                 "vocab_size": 1024, "max_position_embeddings": 4096,
                 "tie_word_embeddings": False}),
    ServePreset("qwen3-8b", "hf:qwen3", "Qwen3ForCausalLM", "Qwen/Qwen3-8B",
                {**_QWEN3, "hidden_size": 4096, "intermediate_size": 12288,
                 "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8}),
    ServePreset("qwen3-32b", "hf:qwen3", "Qwen3ForCausalLM", "Qwen/Qwen3-32B",
                {**_QWEN3, "hidden_size": 5120, "intermediate_size": 25600,
                 "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8}),
)}
MODELS = sorted({p.model for p in PRESETS.values()})


def get_preset(model: str, preset: str) -> ServePreset:
    """The preset `preset` of `model`; SpecError naming the valid ones."""
    if model not in MODELS:
        raise SpecError(f"--model {model!r}: serving plans know {', '.join(MODELS)}")
    valid = sorted(p.name for p in PRESETS.values() if p.model == model)
    if preset not in PRESETS or PRESETS[preset].model != model:
        raise SpecError(f"--preset {preset!r} is not a {model} serving preset: use one of "
                        f"{', '.join(valid)}")
    return PRESETS[preset]
