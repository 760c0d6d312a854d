"""The sharding notebook's exercise: which of dp's collectives grow with the batch, reasoned
from what each one moves (gradients are the size of the parameters; the all-gathers torch_xla's
LayerNorm makes move activations, the size of the batch)."""

from __future__ import annotations

CHOICES = {
    "grads": "the gradient all-reduces",
    "layernorm": "the all-gathers at the LayerNorms",
    "both": "both",
    "neither": "neither",
}
RIGHT = "layernorm"


def judge(choice: str | None) -> tuple[str, str]:
    """(callout kind, markdown) for one of :data:`CHOICES`' keys."""
    if choice not in CHOICES:
        return "warn", "Pick one of the answers, then press **check**."
    if choice == RIGHT:
        return "success", (
            "**Right.** A gradient has its parameter's shape, whatever the batch: the "
            "all-reduces stay the same size. The LayerNorm all-gathers move activations, "
            "one row per token of the batch, so twice the batch moves twice the bytes. (They "
            "exist because torch_xla lowers `layer_norm` to a batch norm over a [1, B x T, C] "
            "view, whose B x T axis the partitioner cannot keep split.)")
    if choice in ("grads", "both"):
        return "warn", ("What shape does a gradient have? It matches its parameter, and the "
                        "parameters do not change with the batch.")
    return "warn", ("Look at what the all-gathers move in the table: shape [1, B x T, C] "
                    "activations. What happens to B x T?")
