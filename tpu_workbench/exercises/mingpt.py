"""The mingpt notebook's exercise: GPT-2 small with twice the blocks. The reader predicts the
parameter count from the model's accounting (the presets table and the source on the page):
the blocks repeat, the token and position embeddings do not, so twice the blocks is far less
than twice the parameters."""

from __future__ import annotations

from . import typed_number

PRESET = "gpt2"
LAYERS = 24  # GPT-2 small has 12 blocks
TOLERANCE = 0.01  # 12 d^2 per block (biases and norms left out) is within 0.2 %


def deeper_facts(preset: str = PRESET, layers: int = LAYERS) -> dict:
    """What :func:`judge_deeper` needs, counted on the meta device
    (:func:`tpu_workbench.models.count_params`, each tied weight once): the preset's
    ``base_params`` and ``base_layers``, the count at `layers` blocks (``params``), its width
    ``n_embd``, ``vocab_size`` and ``block_size``."""
    from .. import models

    cfg = models.get_model("mingpt").config(preset)
    return {"preset": preset, "base_layers": cfg.n_layer, "layers": layers,
            "base_params": models.count_params("mingpt", preset),
            "params": models.count_params("mingpt", preset, {"n_layer": layers}),
            "n_embd": cfg.n_embd, "vocab_size": cfg.vocab_size, "block_size": cfg.block_size}


def _worked(f: dict) -> str:
    added = f["layers"] - f["base_layers"]
    per_block = (f["params"] - f["base_params"]) / added
    d = f["n_embd"]
    embeddings = f["vocab_size"] * d + f["block_size"] * d
    return (f"Each block is 12 d² + 13 d = {per_block / 1e6:.2f} M parameters at d = {d} "
            f"(attention 4 d², MLP 8 d², biases and two LayerNorms 13 d); {added} more blocks "
            f"add {added * per_block / 1e6:.1f} M. The token embedding ({f['vocab_size']:,} x "
            f"{d}, shared with the output layer) and the position embedding "
            f"({f['block_size']:,} x {d}), {embeddings / 1e6:.1f} M together, stay as they are: "
            f"{f['base_params'] / 1e6:.1f} + {added * per_block / 1e6:.1f} = "
            f"**{f['params'] / 1e6:.1f} M**, not twice {f['base_params'] / 1e6:.1f} M.")


def judge_deeper(answer: str | None, facts: dict) -> tuple[str, str]:
    """``(callout kind, markdown)`` for `answer` (millions of parameters, as typed) against
    `facts` (:func:`deeper_facts`): right within :data:`TOLERANCE`. Pure: it starts nothing
    and imports nothing."""
    text = str(answer if answer is not None else "").strip()
    said = typed_number(text, "M")
    if said is None:
        return "warn", (f"{text!r} is not a number: enter millions of parameters, such as "
                        "`150` or `150.5`.")
    if not 0 < said < 1e6:
        return "warn", (f"{said:g} is out of range: enter millions of parameters, a number "
                        "above 0 and below 1,000,000.")
    right = facts["params"] / 1e6
    if abs(said - right) <= TOLERANCE * right:
        return "success", f"**Right: {right:.1f} M.** " + _worked(facts)
    base = facts["base_params"] / 1e6
    ratio = facts["layers"] / facts["base_layers"]
    if abs(said - ratio * base) <= TOLERANCE * ratio * base:
        hint = ("That scales every parameter with the depth. Which of the model's weights "
                "are not inside a block (look at `GPT.__init__` in the source)?")
    elif said < right:
        hint = ("Too few: count one block's weights in the source (`CausalSelfAttention` and "
                "`MLP`), in units of d² = n_embd².")
    else:
        hint = "Too many: which weights are made once, whatever the number of blocks?"
    return "warn", f"You said {said:g} M; not quite. {hint}"
