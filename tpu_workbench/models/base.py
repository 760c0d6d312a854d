"""The small interface every model family offers the runner.

A family knows its size presets, builds a randomly initialised model, generates batches of its
synthetic task, computes the training loss and an evaluation metric, and counts the analytic
FLOPs of a training step. Execution modes, HLO capture, sharding and profiling use only this
interface, so they work on every model with no special cases.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import SpecError

if TYPE_CHECKING:  # a family's presets and checks need no torch; its models and batches do
    import torch
    from torch import nn

Batch = dict[str, "torch.Tensor"]


@dataclasses.dataclass(frozen=True)
class TransformerShape:
    """What planning needs to know of a decoder-only transformer, declared by its family: the
    memory of its activations and logits, the widths tensor parallelism splits, and the option
    that sets how many blocks it has (one and two blocks are compiled, then extrapolated)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int  # fewer than heads under grouped-query attention
    head_dim: int
    intermediate: int  # the MLP's inner width
    vocab: int
    mlp: str  # "gelu": two matrices (GPT); "gated": gate, up and down (SwiGLU, GeGLU)
    layers_option: str  # the config field that sets `layers` (n_layer, num_hidden_layers)


@dataclasses.dataclass(frozen=True)
class EmbeddingTables:
    """Embedding tables held in one parameter, declared by their family so that the embedding
    strategies (``table``, ``row``, ``column``) split them with no model-specific code."""

    param: str  # the parameter's name, e.g. ``embedding.weight``
    axes: tuple[str, ...]  # each dim's role: ("table", "row", "column") or ("row", "column")
    rows: tuple[int, ...]  # each table's rows as allocated (padding included)
    dim: int  # the embedding width (the "column" dim)


def n_params(model: nn.Module) -> int:
    """Parameters of `model`, each tied weight counted once (``parameters()`` skips repeats)."""
    return sum(p.numel() for p in model.parameters())


class ModelFamily:
    """Base class of a model family (``mingpt``, ``resnet``, ``unet``, ``mlp``).

    Subclasses set ``name``, ``presets`` (preset name -> config dataclass instance),
    ``item_unit`` ("tokens", "images", "samples") and ``default_lr``, and implement the methods.
    """

    name: ClassVar[str]
    presets: ClassVar[dict[str, Any]]
    item_unit: ClassVar[str] = "samples"
    default_lr: ClassVar[float] = 1e-3
    # Which metric `evaluate` returns and its value for a model that guesses.
    metric_name: ClassVar[str] = "accuracy"
    # Held-out items the metric is measured on after training (in batches of the run's size):
    # 512 keeps an accuracy's sampling noise near 2 points (sqrt(p(1-p)/n)).
    eval_items: ClassVar[int] = 512
    # The batch tensors' sequence axis (None: fixed-size inputs such as images).
    sequence_dim: ClassVar[int | None] = None

    def config(self, preset: str, **overrides: Any) -> Any:
        """The config of `preset` with `overrides` applied, validated (raises SpecError)."""
        if preset not in self.presets:
            raise SpecError(f"unknown preset {preset!r} for model {self.name!r}; valid presets: "
                            f"{', '.join(self.presets)}")
        base = self.presets[preset]
        fields = {f.name for f in dataclasses.fields(base)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise SpecError(f"unknown option(s) {unknown} for model {self.name!r}; valid options: "
                            f"{', '.join(sorted(fields))}")
        cfg = dataclasses.replace(base, **overrides)
        self.check_config(cfg)
        return cfg

    def check_config(self, cfg: Any) -> None:
        """Raise SpecError for a config that cannot be built (called before building)."""

    def build(self, cfg: Any) -> nn.Module:
        """A randomly initialised model (the caller seeds torch first)."""
        raise NotImplementedError

    def make_batch(self, cfg: Any, batch_size: int, generator: torch.Generator) -> Batch:
        """One batch of the synthetic task as CPU tensors, deterministic given `generator`."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Scalar training loss of `model` on `batch`."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Scalar evaluation metric (a tensor, so it stays on the device until read)."""
        raise NotImplementedError

    def evaluate_batches(self, model: nn.Module, batches: list[Batch]) -> torch.Tensor:
        """The metric over the whole held-out set: the mean of :meth:`evaluate` per batch (equal
        sizes); a family whose metric is no mean (an AUC) pools the batches itself."""
        import torch

        return torch.stack([self.evaluate(model, b).to("cpu") for b in batches]).mean()

    # The dtype a real-size preset is planned in (memory, collectives, the compiled step).
    planning_dtype: ClassVar[str] = "float32"

    def transformer_shape(self, cfg: Any) -> TransformerShape | None:
        """Widths and kinds of a decoder-only transformer's blocks (None: not one)."""
        return None

    def block_shape(self, cfg: Any) -> TransformerShape:
        """:meth:`transformer_shape`, or a SpecError where the family is no transformer: a
        plan (memory, collectives, a compiled block) needs it."""
        shape = self.transformer_shape(cfg)
        if shape is None:
            raise SpecError(f"model {self.name!r} is not a decoder-only transformer (hf:*, "
                            "mingpt): a plan needs its block shape")
        return shape

    def batch_shapes(self, cfg: Any,
                     batch_size: int) -> dict[str, tuple[tuple[int, ...], str]] | None:
        """Each batch tensor's shape and dtype name, for a step traced with placeholders
        (:mod:`tpu_workbench.tpu_compile`), where a family is no sequence model; None: the
        traced step is a transformer's (token ids of the step's sequence length)."""
        return None

    def embedding_tables(self, cfg: Any) -> list[EmbeddingTables] | None:
        """The parameters that hold embedding tables (None: no tables, so no embedding
        strategy applies)."""
        return None

    def expert_count(self, cfg: Any) -> int:
        """Experts per mixture-of-experts layer, which expert parallelism splits (0: none)."""
        return 0

    def model_axis_widths(self, cfg: Any) -> dict[str, int]:
        """Widths that tensor parallelism splits over a mesh's model axis and that must divide
        by its size (minGPT: heads and embedding width); empty where a strategy splits only
        whole Linear layers that can be padded."""
        return {}

    def default_batch_size(self, cfg: Any) -> int:
        return getattr(cfg, "batch_size", 8)

    def items_per_batch(self, cfg: Any, batch_size: int) -> int:
        """Items (tokens, images...) one batch holds, for throughput."""
        return batch_size

    def flops_per_step(self, cfg: Any, batch_size: int) -> float:
        """Analytic FLOPs of one training step (forward + backward ~ 3x forward matmuls)."""
        raise NotImplementedError
