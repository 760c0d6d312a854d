"""The serve-a-model exercise: the concurrency at which decoding Llama-3.3-70B on a v6e-8 stops
being bound by reading its weights, reasoned from the figures the page shows (weights per chip,
the KV bytes a token keeps on a chip), before any plan is read."""

from __future__ import annotations

import math

from ..serving import plan as P
from ..serving.presets import PRESETS


def crossover(preset: str = "llama-3.3-70b", tp: int = 8, input_len: int = 1000,
              output_len: int = 1000) -> float:
    """Running sequences at which a decode step reads as many KV bytes as weight bytes on a
    chip: weights per chip over the KV one sequence keeps at its mean context (the prompt and
    half the answer)."""
    p = PRESETS[preset]
    context = input_len + output_len / 2
    return P.weight_bytes_per_chip(p, tp) / (context * P.kv_bytes_per_token(p, tp, 2))


def judge(answer: float | None, preset: str = "llama-3.3-70b", tp: int = 8,
          input_len: int = 1000, output_len: int = 1000) -> tuple[str, str]:
    """(callout kind, markdown) for an answer in sequences: within 10% of the crossover."""
    if answer is None or not math.isfinite(answer) or answer <= 0:
        return "warn", "Enter a positive number of concurrent sequences."
    want = crossover(preset, tp, input_len, output_len)
    full = want * (input_len + output_len / 2) / (input_len + output_len)
    if abs(answer - want) <= 0.1 * want:
        return "success", (
            f"**Right**: about {want:,.0f} sequences. Below that each decode step spends more "
            "time reading weights than KV pages, so more concurrency is nearly free; above it "
            "the KV pages dominate and ITL grows with every sequence added.")
    if abs(answer - full) <= 0.1 * full:
        return "warn", ("Close: a sequence does not hold all its tokens for the whole decode. "
                        "On average it has its prompt and half its answer.")
    if abs(answer * tp - want) <= 0.1 * want or abs(answer / tp - want) <= 0.1 * want:
        return "warn", ("Check the chips: the weights and the KV heads are both split over the "
                        "tensor-parallel chips; compare the two on one chip.")
    return "warn", ("Not quite: weight bytes on a chip, divided by the KV bytes one sequence "
                    "keeps on that chip.")
