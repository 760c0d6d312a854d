"""The sharding notebook's exercise: how many bytes dp's collectives move at twice the batch,
reasoned from what each one carries (a gradient has its weight's shape whatever the batch; the
all-gathers torch_xla's LayerNorm makes carry activations, a row per token of the batch)."""

from __future__ import annotations

import re

import pandas as pd

MB = 1e6


def _dims(shape: str) -> list[int]:
    """The dimensions of an HLO shape text such as ``f32[1,352,128]``."""
    found = re.search(r"\[([\d,]*)\]", str(shape))
    return [int(d) for d in found.group(1).split(",") if d] if found else []


def mb_at_twice_the_batch(collectives: pd.DataFrame, tokens: int) -> float:
    """MB per device per step that `collectives` (one step's, columns ``shape`` and ``bytes``)
    would move with twice the batch: a collective whose shape has an axis of the batch's
    `tokens` (batch x positions) carries activations and moves twice its bytes; every other
    one (a weight's gradient, a scalar) moves the same. tests/test_nb_sharding.py checks this
    rule against a run at twice the batch."""
    scale = [2 if tokens in _dims(s) else 1 for s in collectives["shape"]]
    return float((collectives["bytes"] * scale).sum() / MB)


def judge(answer: float | None, collectives: pd.DataFrame, tokens: int) -> tuple[str, str]:
    """(callout kind, markdown) for `answer` in MB: within 5% of :func:`mb_at_twice_the_batch`
    is right."""
    if answer is None or not answer > 0:
        return "warn", "Enter a positive number of MB, then press **check**."
    now = float(collectives["bytes"].sum() / MB)
    right = mb_at_twice_the_batch(collectives, tokens)
    if abs(answer - right) <= 0.05 * right:
        return "success", (
            f"**Right**: about **{right:.2f} MB** (from {now:.2f} MB). Only the LayerNorms' "
            "all-gathers grow: they move activations, one row per token, so twice the batch "
            "moves twice the bytes. The gradient all-reduces have their weights' shapes, "
            "whatever the batch. (The all-gathers exist because torch_xla lowers "
            "`layer_norm` to a batch norm over a [1, B x T, C] view, whose B x T axis the "
            "partitioner cannot keep split.)")
    if abs(answer - 2 * now) <= 0.05 * 2 * now:
        return "warn", ("That doubles every collective. Does a gradient change shape when the "
                        "batch doubles?")
    if abs(answer - now) <= 0.05 * now:
        return "warn", ("That keeps every collective as it is. Look at the shapes the "
                        "all-gathers move: which axis is B x T?")
    return "warn", ("Not quite. Split dp's bytes by what each collective carries (the table "
                    "of where they come from, with dp picked): which rows grow with the "
                    "batch, and by how much?")
