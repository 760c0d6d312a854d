"""The quickstart's exercise: predict how much of a weight each device holds under a strategy
the page did not draw, from the strategy's rule and the weight's shape."""

from __future__ import annotations

import math
from collections.abc import Sequence

RULES = {
    "dp": "dp keeps every parameter whole on every device",
    "fsdp": "fsdp splits a parameter over every device of the mesh, along its first "
            "dimension that divides",
    "tp": "tp splits a Linear's weight over the model axis only (its output features, or "
          "its input features for the layers after attention and the MLP)",
}


def asked_strategy(shown: str) -> str:
    """The strategy the question asks about: one the page did not draw."""
    return "fsdp" if shown != "fsdp" else "tp"


def held_kb(model: str, tensor: str, mesh: Sequence[int], strategy: str) -> float:
    """KB of `tensor` one device holds under `strategy` (the plan of the workbench's rules,
    built on the meta device; imports torch)."""
    from .. import sharding

    plan = sharding.plan(model, "tiny", tuple(mesh), strategy).set_index("tensor")
    return float(plan.loc[tensor, "bytes_per_device"]) / 1e3


def judge(answer: float | None, kb: float, whole_kb: float, strategy: str,
          devices: int) -> tuple[str, str]:
    """(callout kind, markdown) for an answer in KB: within 2% of `kb` is right."""
    if answer is None or not math.isfinite(answer) or answer <= 0:
        return "warn", "Enter a positive number of KB (1 KB = 1,000 bytes)."
    if abs(answer - kb) <= 0.02 * kb:
        return "success", (f"**Right**: {kb:,.1f} KB of the {whole_kb:,.1f} KB weight: "
                           f"{RULES.get(strategy, strategy)}.")
    if abs(answer - whole_kb) <= 0.02 * whole_kb:
        return "warn", (f"That is the whole weight. {RULES.get(strategy, strategy)}: how "
                        "many pieces does that make here?")
    if abs(answer * 1.024 - kb) <= 0.02 * kb or abs(answer / 1.024 - kb) <= 0.02 * kb:
        return "warn", "Nearly: count 1 KB as 1,000 bytes (not 1,024)."
    return "warn", (f"Not quite. {RULES.get(strategy, strategy)}; the mesh has {devices} "
                    "devices, and a float32 element is 4 bytes.")
