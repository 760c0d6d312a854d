"""Hugging Face causal LMs by config: GPT-2, Llama, Qwen2 and Gemma-2 from Transformers' own code.

A family per Transformers ``model_type`` (``hf:gpt2``, ``hf:llama``, ``hf:qwen2``,
``hf:gemma2``). The model is built from the Transformers config class with random weights
(``AutoModelForCausalLM.from_config``): nothing is ever downloaded. A preset is the config fields
it sets; ``options={...}`` overrides any field of the config class (checked against its
``__init__``) or of the task. ``tiny`` trains in seconds on XLA:CPU; the other presets are the
published shapes of real models, for planning on the meta device (their parameter counts equal
the published figures).

Task: minGPT's sorting (see :mod:`.mingpt`), the same batches, loss and accuracy: ``length``
digits in ``range(n_digits)`` (tokens of the vocab) followed by their sorted version.

Attention runs Transformers' ``eager`` implementation: plain matmuls and a softmax, which lower
to XLA with no CPU fallback in lazy and compile modes (checked for all four, torch_xla 2.9).
``attn_implementation="sdpa"`` is an option, but Transformers then asks whether the mask is all
ones (``padding_mask.all()`` in Python): one ``aten::_local_scalar_dense`` per step, which cuts
a lazy step in two. ``attn_implementation="flash"`` is torch_xla's Pallas flash attention
(:mod:`kernels.xla_flash`; forward and backward kernels, partitioned over the global SPMD mesh):
it runs on a TPU only; on XLA:CPU a step can only be traced for the TPU compiler, inside
``kernels.xla_flash.tpu_lowering()``; elsewhere the first forward raises SpecError. The kernel
has no logit soft-capping (Gemma 2) and no sliding window: such configs are refused.

``remat=True`` checkpoints each decoder layer (:mod:`kernels.remat`): torch_xla's checkpoint
on XLA devices (its ``opt-barrier`` keeps XLA from merging the recomputation away), torch's on
plain PyTorch.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import SpecError
from .base import ModelFamily, TransformerShape
from .mingpt import MinGPTFamily


@dataclass(frozen=True)
class HFConfig:
    """The Transformers config fields a preset (and the options) set, and the sorting task."""

    hf: dict[str, Any] = field(default_factory=dict)  # fields of the Transformers config class
    length: int = 6  # digits to sort
    n_digits: int = 10  # digits are tokens 0 .. n_digits - 1 of the vocab
    batch_size: int = 16
    attn_implementation: str = "eager"
    remat: bool = False  # activation checkpointing of each decoder layer


TASK_FIELDS = tuple(f.name for f in dataclasses.fields(HFConfig) if f.name != "hf")
ATTENTION_IMPLS = ("eager", "sdpa", "flash")


@functools.cache
def config_class(model_type: str) -> type:
    """Transformers' config class of `model_type` (``LlamaConfig`` for ``"llama"``)."""
    from transformers import AutoConfig

    return type(AutoConfig.for_model(model_type))


@functools.cache
def config_fields(model_type: str) -> dict[str, Any]:
    """Every field the config class takes, with its default (``inspect.Parameter.empty`` for
    none)."""
    params = inspect.signature(config_class(model_type).__init__).parameters
    return {name: p.default for name, p in params.items()
            if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


class CausalLM(nn.Module):
    """A Transformers causal LM that maps token ids (B, T) to logits (B, T, vocab), as minGPT's
    ``GPT`` does, so the sorting task's loss and accuracy apply unchanged."""

    def __init__(self, hf_model: nn.Module, flash: bool = False):
        super().__init__()
        self.hf = hf_model
        self.tied = bool(getattr(hf_model.config, "tie_word_embeddings", False))
        self.flash = flash
        # A 4-D causal mask built from triu instead of Transformers' mask from the 2-D one:
        # the TPU compile's trace sets it (tpu_workbench.worker.tpu_trace). Transformers turns
        # the 2-D mask into a gather of a boolean table by (row, column) index pairs, on which
        # libtpu 0.0.21 aborts, and 0.0.51 now and then (windowing_util.cc check, an
        # uninitialised bound). Sliding-window layers (Gemma-2) get no window this way.
        self.dense_causal_mask = False

    def _apply(self, fn, *args, **kwargs):
        # Module.to() replaces each parameter separately when the tensor type changes (CPU ->
        # XLA, meta -> CPU), which unties lm_head from the token embedding (checked: after
        # .to("meta") they are two tensors): tie them again, as minGPT's GPT does.
        super()._apply(fn, *args, **kwargs)
        if self.tied:
            self.hf.get_output_embeddings().weight = self.hf.get_input_embeddings().weight
        return self

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        # An explicit all-ones attention mask: without one, Transformers checks the position ids
        # for packed sequences with a Python `if` on a tensor (`.all()`), which on torch_xla is
        # a `.item()` (aten::_local_scalar_dense, counted as a CPU fallback): it cut every lazy
        # step into two graphs. With the mask, eager attention reads no tensor back.
        if self.flash and not torch.compiler.is_compiling():
            from kernels.xla_flash import unavailable

            reason = unavailable(idx.device)
            if reason:
                raise SpecError(f"attn_implementation='flash': {reason}")
        if self.dense_causal_mask:
            t = idx.shape[1]
            mask = torch.full((t, t), torch.finfo(torch.float32).min, device=idx.device)
            return self.hf(input_ids=idx, attention_mask=mask.triu(1)[None, None],
                           use_cache=False).logits
        return self.hf(input_ids=idx, attention_mask=torch.ones_like(idx),
                       use_cache=False).logits


class HFFamily(ModelFamily):
    """A Transformers causal LM family: subclasses set the ``model_type``, presets and which
    config fields hold the widths tensor parallelism splits."""

    model_type: ClassVar[str]
    # Config fields that tensor parallelism splits over the model axis (each device holds whole
    # heads; with GQA whole KV heads too), and the longest sequence the positions cover.
    head_fields: ClassVar[tuple[str, ...]] = ("num_attention_heads", "num_key_value_heads")
    positions_field: ClassVar[str] = "max_position_embeddings"
    size_fields: ClassVar[tuple[str, ...]] = (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads")
    item_unit = "tokens"
    sequence_dim = 1
    default_lr = 1e-3
    planning_dtype = "bfloat16"  # real-size presets are planned as they train: in bf16
    mlp: ClassVar[str] = "gated"  # SwiGLU (Llama, Qwen2), GeGLU (Gemma 2); GPT-2: "gelu"
    layers_field: ClassVar[str] = "num_hidden_layers"
    blocks_field: ClassVar[str] = "layers"  # the decoder layers in the base model (remat)

    # minGPT's sorting task: batches, cross entropy on the sorted half, its accuracy, decoding.
    make_batch = MinGPTFamily.make_batch
    loss = MinGPTFamily.loss
    evaluate = MinGPTFamily.evaluate
    sort_examples = MinGPTFamily.sort_examples
    task_prompts = MinGPTFamily.task_prompts
    task_answer = MinGPTFamily.task_answer

    # ---- config ---------------------------------------------------------------------------
    def config(self, preset: str, **overrides: Any) -> HFConfig:
        if preset not in self.presets:
            raise SpecError(f"unknown preset {preset!r} for model {self.name!r}; valid presets: "
                            f"{', '.join(self.presets)}")
        base: HFConfig = self.presets[preset]
        valid = config_fields(self.model_type)
        unknown = sorted(k for k in overrides if k not in valid and k not in TASK_FIELDS)
        if unknown:
            raise SpecError(
                f"unknown option(s) {unknown} for model {self.name!r}: not a field of "
                f"transformers.{config_class(self.model_type).__name__} nor of the task; valid "
                f"options: task fields {', '.join(TASK_FIELDS)}; config fields "
                f"{', '.join(sorted(valid))}")
        hf = dict(base.hf)
        for key, value in overrides.items():
            if key in TASK_FIELDS:
                continue
            current = hf.get(key, valid[key])
            _check_type(self.name, key, value, current)
            hf[key] = value
        task = {k: v for k, v in overrides.items() if k in TASK_FIELDS}
        cfg = dataclasses.replace(base, hf=hf, **task)
        self.check_config(cfg)
        return cfg

    def hf_config(self, cfg: HFConfig) -> Any:
        """The Transformers config object of `cfg` (raises SpecError where Transformers does)."""
        try:  # a copy: the config class edits dicts in place (rope_parameters gains keys)
            hf_cfg = config_class(self.model_type)(**copy.deepcopy(cfg.hf))
        except (TypeError, ValueError) as e:
            raise SpecError(f"{self.name}: transformers rejects the config "
                            f"{cfg.hf}: {e}") from e
        hf_cfg._attn_implementation = _attention_name(cfg.attn_implementation)
        return hf_cfg

    def check_config(self, cfg: HFConfig) -> None:
        for key in ("length", "n_digits", "batch_size"):
            value = getattr(cfg, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SpecError(f"{self.name} {key} must be a positive int, got {value!r}")
        if cfg.attn_implementation not in ATTENTION_IMPLS:
            raise SpecError(f"{self.name} attn_implementation={cfg.attn_implementation!r} is "
                            f"not one of {ATTENTION_IMPLS}")
        if not isinstance(cfg.remat, bool):
            raise SpecError(f"{self.name} remat must be True or False, got {cfg.remat!r}")
        if cfg.n_digits < 2:
            raise SpecError(f"{self.name} n_digits must be at least 2, got {cfg.n_digits}")
        hf_cfg = self.hf_config(cfg)
        for key in self.size_fields:  # Transformers builds a model of 0 or -1 layers silently
            value = getattr(hf_cfg, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SpecError(f"{self.name} {key} must be a positive int, got {value!r}")
        if hf_cfg.vocab_size < cfg.n_digits:
            raise SpecError(f"{self.name} vocab_size={hf_cfg.vocab_size} is smaller than "
                            f"n_digits={cfg.n_digits}; it must be at least n_digits")
        positions = getattr(hf_cfg, self.positions_field)
        if positions < 2 * cfg.length - 1:
            raise SpecError(f"{self.name} {self.positions_field}={positions} is shorter than the "
                            f"task's sequence (2 * length - 1 = {2 * cfg.length - 1}); it must "
                            "be at least that")
        if len(self.head_fields) == 2:  # grouped-query attention: query heads per KV head
            heads, kv_heads = (getattr(hf_cfg, f) for f in self.head_fields)
            if heads % kv_heads:
                raise SpecError(f"{self.name} {self.head_fields[1]}={kv_heads} must divide "
                                f"{self.head_fields[0]}={heads}")
        if cfg.attn_implementation == "flash":
            self._check_flash(hf_cfg)

    def _check_flash(self, hf_cfg: Any) -> None:
        """What the Pallas kernel cannot do, named before anything is built."""
        from kernels.xla_flash import head_dim_problem

        problem = head_dim_problem(self.transformer_shape_of(hf_cfg).head_dim)
        softcap = getattr(hf_cfg, "attn_logit_softcapping", None)
        window = getattr(hf_cfg, "sliding_window", None)
        if softcap is not None:
            problem = (f"attn_logit_softcapping={softcap}: the Pallas kernel has no "
                       "soft-capping")
        elif window is not None and "sliding_attention" in (getattr(hf_cfg, "layer_types", None)
                                                            or ()):
            problem = (f"sliding_window={window}: the Pallas kernel is causal over the whole "
                       "sequence, with no window")
        if problem:
            raise SpecError(f"{self.name} attn_implementation='flash': {problem}; use eager or "
                            "sdpa")

    # ---- model ----------------------------------------------------------------------------
    def build(self, cfg: HFConfig) -> nn.Module:
        from transformers import AutoModelForCausalLM

        hf_cfg = self.hf_config(cfg)
        if cfg.attn_implementation == "flash":
            from kernels.xla_flash import register

            register()
        hf_model = AutoModelForCausalLM.from_config(
            hf_cfg, attn_implementation=hf_cfg._attn_implementation)
        if cfg.remat:
            from kernels.remat import checkpoint_blocks

            checkpoint_blocks(getattr(hf_model.base_model, self.blocks_field))
        return CausalLM(hf_model, flash=cfg.attn_implementation == "flash")

    def model_axis_widths(self, cfg: HFConfig) -> dict[str, int]:
        hf_cfg = self.hf_config(cfg)
        return {f: getattr(hf_cfg, f) for f in self.head_fields}

    def transformer_shape(self, cfg: HFConfig) -> TransformerShape:
        return self.transformer_shape_of(self.hf_config(cfg))

    def transformer_shape_of(self, hf: Any) -> TransformerShape:
        """The shape of a Transformers config object (GPT-2's n_embd, n_layer... answer to the
        common names too)."""
        heads = hf.num_attention_heads
        hidden = hf.hidden_size
        inner = getattr(hf, "intermediate_size", None) or getattr(hf, "n_inner", None)
        return TransformerShape(
            hidden=hidden, layers=hf.num_hidden_layers, heads=heads,
            kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf, "head_dim", None) or hidden // heads,
            intermediate=inner or 4 * hidden, vocab=hf.vocab_size, mlp=self.mlp,
            layers_option=self.layers_field)

    def editable_fields(self, cfg: HFConfig) -> dict[str, int]:
        """The widths and depth of `cfg` a notebook offers for editing, under this config
        class's own field names (GPT-2's n_layer, n_embd, n_head), so an edit is a valid
        option: the common names answer on the config object but are no fields of GPT-2's."""
        hf = self.hf_config(cfg)
        names = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "intermediate_size")
        fields = config_fields(self.model_type)
        own = {hf.attribute_map.get(n, n) for n in names}
        return {k: int(getattr(hf, k)) for k in sorted(own, key=str) if k in fields
                and isinstance(getattr(hf, k, None), int)}

    def positions(self, cfg: HFConfig) -> int:
        """The longest sequence the positions cover (``max_position_embeddings``, GPT-2's
        ``n_positions``)."""
        return int(getattr(self.hf_config(cfg), self.positions_field))

    # ---- accounting -----------------------------------------------------------------------
    def items_per_batch(self, cfg: HFConfig, batch_size: int) -> int:
        return batch_size * (2 * cfg.length - 1)

    def layer_matmul_params(self, hf_cfg: Any) -> int:
        """Weights of one layer's matmuls: q, k, v, o and the gated MLP's gate, up, down."""
        d, heads, kv = hf_cfg.hidden_size, hf_cfg.num_attention_heads, hf_cfg.num_key_value_heads
        head_dim = getattr(hf_cfg, "head_dim", None) or d // heads
        return 2 * d * heads * head_dim + 2 * d * kv * head_dim + 3 * d * hf_cfg.intermediate_size

    def forward_matmul_flops(self, cfg: HFConfig, batch_size: int) -> float:
        """FLOPs (2*M*N*K) of every matmul in one forward pass over a batch of the task.

        With tokens N = batch_size * T (T = 2 * length - 1): per layer 2 * N * (its matmul
        weights) plus the attention scores QK^T and AV, 2 * 2 * N * T * (heads * head_dim) (the
        full T x T, as minGPT counts it); plus lm_head 2 * N * d * V. Embedding lookups, norms,
        softmax and activations are not matmuls and are left out.
        """
        hf_cfg = self.hf_config(cfg)
        T = 2 * cfg.length - 1
        n_tokens = batch_size * T
        d, heads = hf_cfg.hidden_size, hf_cfg.num_attention_heads
        head_dim = getattr(hf_cfg, "head_dim", None) or d // heads
        per_layer = 2 * n_tokens * self.layer_matmul_params(hf_cfg) \
            + 4 * n_tokens * T * heads * head_dim
        return float(hf_cfg.num_hidden_layers * per_layer
                     + 2 * n_tokens * d * hf_cfg.vocab_size)

    def flops_per_step(self, cfg: HFConfig, batch_size: int) -> float:
        """3 x forward_matmul_flops: the backward pass does two matmuls for each forward one."""
        return 3 * self.forward_matmul_flops(cfg, batch_size)

    def describe(self, cfg: HFConfig) -> dict[str, Any]:
        """The config as flat columns (the preset table): task fields, then the HF fields."""
        return {**{k: getattr(cfg, k) for k in TASK_FIELDS if k != "batch_size"}, **cfg.hf}


def _attention_name(impl: str) -> str:
    """Transformers' name of an ``attn_implementation``: flash is registered as
    ``kernels.xla_flash.IMPLEMENTATION`` (a name without "flash", which Transformers reserves)."""
    if impl != "flash":
        return impl
    from kernels.xla_flash import IMPLEMENTATION

    return IMPLEMENTATION


def _check_type(model: str, key: str, value: Any, current: Any) -> None:
    """An option has the type of the value it replaces (True is no int, 2.0 no int)."""
    if current is None or current is inspect.Parameter.empty:
        return  # no default to compare with: Transformers checks it
    if isinstance(current, bool):
        ok, want = isinstance(value, bool), "True or False"
    elif isinstance(current, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an int"
    elif isinstance(current, float):
        ok, want = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    elif isinstance(current, str):
        ok, want = isinstance(value, str), "a string"
    else:
        return
    if not ok:
        raise SpecError(f"{model} option {key} must be {want} (it is {current!r}), got {value!r}")


# Tiny presets: 2 layers, a small vocab (the sorting task needs n_digits tokens), 4 KV heads so
# tensor parallelism splits them over a 2x4 mesh's model axis of 4. Real presets: the published
# configs' shapes (config.json of each model on the Hugging Face Hub); dropout is off everywhere
# so XLA and plain PyTorch see the same computation.
_TINY = dict(vocab_size=16, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64,
             tie_word_embeddings=True)
_NO_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # GPT-2's default is 0.1
_LLAMA3 = dict(vocab_size=128256, rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=128001)
_LLAMA31 = dict(max_position_embeddings=131072, rope_parameters=dict(
    rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
    high_freq_factor=4.0, original_max_position_embeddings=8192))


class GPT2Family(HFFamily):
    """Transformers' GPT-2: its Linear layers are ``Conv1D`` (weight stored [in, out]), named as
    minGPT's (``attn.c_attn``, ``attn.c_proj``, ``mlp.c_fc``, ``mlp.c_proj``)."""

    name = "hf:gpt2"
    model_type = "gpt2"
    mlp = "gelu"
    layers_field = "n_layer"
    blocks_field = "h"
    head_fields = ("n_head",)
    positions_field = "n_positions"
    size_fields = ("vocab_size", "n_embd", "n_layer", "n_head")
    presets = {
        "tiny": HFConfig(dict(vocab_size=16, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                              bos_token_id=0, eos_token_id=0, **_NO_DROPOUT)),
        # GPT-2 small (openai-community/gpt2): 124,439,808 parameters, lm_head tied to wte.
        "gpt2": HFConfig(dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12,
                              n_head=12, **_NO_DROPOUT), batch_size=8),
        # GPT-3 175B's shape (Brown et al. 2020, table 2.1; MaxText's gpt3-175b): 96 layers of
        # width 12288, 96 heads, 2048 positions; GPT-2's vocabulary. 174,604,259,328 parameters.
        "gpt3-175b": HFConfig(dict(vocab_size=50257, n_positions=2048, n_embd=12288, n_layer=96,
                                   n_head=96, **_NO_DROPOUT), batch_size=8),
    }

    def check_config(self, cfg: HFConfig) -> None:
        super().check_config(cfg)
        hf_cfg = self.hf_config(cfg)
        if hf_cfg.n_embd % hf_cfg.n_head:
            raise SpecError(f"{self.name} n_head={hf_cfg.n_head} must divide "
                            f"n_embd={hf_cfg.n_embd}")

    def model_axis_widths(self, cfg: HFConfig) -> dict[str, int]:
        hf_cfg = self.hf_config(cfg)
        return {"n_head": hf_cfg.n_head, "n_embd": hf_cfg.n_embd}  # as minGPT

    def layer_matmul_params(self, hf_cfg: Any) -> int:
        d = hf_cfg.n_embd
        inner = hf_cfg.n_inner or 4 * d
        return 4 * d * d + 2 * d * inner  # c_attn (3 d^2), attn.c_proj, mlp.c_fc, mlp.c_proj

    def forward_matmul_flops(self, cfg: HFConfig, batch_size: int) -> float:
        hf_cfg = self.hf_config(cfg)
        T = 2 * cfg.length - 1
        n_tokens = batch_size * T
        d = hf_cfg.n_embd
        per_layer = 2 * n_tokens * self.layer_matmul_params(hf_cfg) + 4 * n_tokens * T * d
        return float(hf_cfg.n_layer * per_layer + 2 * n_tokens * d * hf_cfg.vocab_size)


class LlamaFamily(HFFamily):
    name = "hf:llama"
    model_type = "llama"
    presets = {
        "tiny": HFConfig(dict(_TINY)),
        # meta-llama/Llama-3.2-1B: 1,235,814,400 parameters (lm_head tied to embed_tokens).
        "llama-3.2-1b": HFConfig(dict(
            _LLAMA3, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, head_dim=64,
            max_position_embeddings=131072, tie_word_embeddings=True,
            rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0,
                                 low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=8192)), batch_size=8),
        # meta-llama/Meta-Llama-3-8B: 8,030,261,248 parameters.
        "llama-3-8b": HFConfig(dict(
            _LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
            rope_parameters=dict(rope_type="default", rope_theta=500000.0)), batch_size=8),
        # meta-llama/Llama-3.1-8B: 8,030,261,248 parameters (Llama 3's shapes, 128K positions).
        "llama-3.1-8b": HFConfig(dict(
            _LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, **_LLAMA31), batch_size=8),
        # meta-llama/Llama-3.1-70B: 70,553,706,496 parameters.
        "llama-3.1-70b": HFConfig(dict(
            _LLAMA3, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
            num_attention_heads=64, num_key_value_heads=8, **_LLAMA31), batch_size=8),
        # mistralai/Mistral-7B-v0.1 as MaxText's mistral-7b trains it: Llama's architecture
        # (full attention, no sliding window), 32K vocabulary, RoPE theta 1e6. 7,241,732,096
        # parameters.
        "mistral-7b": HFConfig(dict(
            vocab_size=32000, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
            hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), batch_size=8),
        # meta-llama/Llama-3.1-405B: 405,853,388,800 parameters.
        "llama-3.1-405b": HFConfig(dict(
            _LLAMA3, hidden_size=16384, intermediate_size=53248, num_hidden_layers=126,
            num_attention_heads=128, num_key_value_heads=8, **_LLAMA31), batch_size=8),
    }


class Qwen2Family(HFFamily):
    name = "hf:qwen2"
    model_type = "qwen2"
    presets = {
        "tiny": HFConfig(dict(_TINY)),
        # Qwen/Qwen2.5-7B: 7,615,616,512 parameters (q, k, v have biases).
        "qwen2.5-7b": HFConfig(dict(
            vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
            num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072,
            rms_norm_eps=1e-6, bos_token_id=151643, eos_token_id=151643,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), batch_size=8),
    }


class Gemma2Family(HFFamily):
    """Gemma 2: logit soft-capping and sliding-window layers, which need the eager attention."""

    name = "hf:gemma2"
    model_type = "gemma2"
    presets = {
        # sliding_window 8 < the task's 11 tokens: every other layer sees a local window.
        "tiny": HFConfig(dict(_TINY, head_dim=16, query_pre_attn_scalar=16, sliding_window=8)),
        # google/gemma-2-9b: 9,241,705,984 parameters (lm_head tied to embed_tokens).
        "gemma-2-9b": HFConfig(dict(
            vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
            num_attention_heads=16, num_key_value_heads=8, head_dim=256,
            query_pre_attn_scalar=256, sliding_window=4096, max_position_embeddings=8192,
            final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
            batch_size=8),
        # google/gemma-2-2b: 2,614,341,888 parameters.
        "gemma-2-2b": HFConfig(dict(
            vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
            num_attention_heads=8, num_key_value_heads=4, head_dim=256,
            query_pre_attn_scalar=256, sliding_window=4096, max_position_embeddings=8192,
            final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
            batch_size=8),
        # google/gemma-2-27b: 27,227,128,320 parameters (queries scaled by 144 = 4608 / 32).
        "gemma-2-27b": HFConfig(dict(
            vocab_size=256000, hidden_size=4608, intermediate_size=36864, num_hidden_layers=46,
            num_attention_heads=32, num_key_value_heads=16, head_dim=128,
            query_pre_attn_scalar=144, sliding_window=4096, max_position_embeddings=8192,
            final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
            batch_size=8),
    }

