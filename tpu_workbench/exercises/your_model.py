"""The your_model notebook's exercise: the largest global batch of the planned preset that
trains on **one** v6e chip, a slice the fit table leaves out. The reader works it out from the
memory convention and the table's rows: the training state does not shrink on one chip, and
activations and logits grow with the sequences a chip holds."""

from __future__ import annotations

import math

SLICE = "v6e-1"
MAX_BATCH = 1_000_000  # a typed answer above this is a typo, not a batch


def one_chip_facts(model: str, preset: str, seq_len: int, recompute: bool,
                   options: dict | None = None) -> dict:
    """What :func:`judge_batch` needs, from the one memory model of a plan
    (:func:`tpu_workbench.sharding.model_fit_table` on :data:`SLICE`): ``state_gb`` (weights,
    gradients and optimizer state, whole on one chip), ``per_sequence_gb`` (activations and
    logits of one sequence), ``usable_gb``, ``params`` and ``largest`` (the largest global
    batch that fits; 0 when one sequence does not). Raises SpecError where the family has no
    transformer block shape to plan."""
    from .. import sharding

    def plan(batch: int):
        return sharding.model_fit_table(model, preset, batch, seq_len, recompute=recompute,
                                        slices=[SLICE], strategies=["fsdp"],
                                        options=options).iloc[0]

    one = plan(1)
    state = float(one["params_gb"] + one["grads_gb"] + one["optimizer_gb"])
    per_sequence = float(one["activation_gb"] + one["logits_gb"])
    usable = float(one["usable_gb"])
    # Every term is linear in the sequences a chip holds; the estimate is checked against the
    # convention itself on both sides, so rounding can never make it one off.
    largest = max(0, math.floor((usable - state) / per_sequence))
    while largest and not plan(largest)["fits"]:
        largest -= 1
    while plan(largest + 1)["fits"]:
        largest += 1
    return {"model": model, "preset": preset, "seq_len": seq_len, "recompute": recompute,
            "params": int(one["params"]), "state_gb": state, "per_sequence_gb": per_sequence,
            "activation_gb": float(one["activation_gb"]), "logits_gb": float(one["logits_gb"]),
            "usable_gb": usable, "largest": largest}


def _worked(f: dict) -> str:
    head = (f"On one chip nothing splits the training state: {f['params'] / 1e9:,.2f} B "
            f"parameters x 16 bytes = **{f['state_gb']:.2f} GB**. Each sequence of "
            f"{f['seq_len']:,} tokens adds {f['activation_gb']:.2f} GB of activations "
            f"({'recomputed: each block keeps its input' if f['recompute'] else 'kept whole'})"
            f" and {f['logits_gb']:.2f} GB of logits, **{f['per_sequence_gb']:.2f} GB**. ")
    if f["state_gb"] + f["per_sequence_gb"] > f["usable_gb"]:
        return head + (f"{f['state_gb']:.2f} + {f['per_sequence_gb']:.2f} GB is over the "
                       f"{f['usable_gb']:.1f} GB a chip can use, so not even one sequence "
                       "trains: this model needs a slice that splits its state.")
    room = (f["usable_gb"] - f["state_gb"]) / f["per_sequence_gb"]
    return head + (f"({f['usable_gb']:.1f} - {f['state_gb']:.2f}) / "
                   f"{f['per_sequence_gb']:.2f} = {room:.2f}, so **{f['largest']}** "
                   "sequences.")


def judge_batch(answer: str | None, facts: dict | None) -> tuple[str, str]:
    """``(callout kind, markdown)`` for `answer` (a global batch, as typed; 0 for "not even
    one sequence") against `facts` (:func:`one_chip_facts`, None where the model has no plan).
    Pure: it starts nothing and imports nothing."""
    if facts is None:
        return "neutral", ("This exercise needs a fit plan, which needs a transformer family "
                           "(it reads the block's shape): pick an architecture above.")
    text = str(answer if answer is not None else "").strip()
    try:
        said = int(text)
    except ValueError:
        return "warn", (f"{text!r} is not a whole number: enter a number of sequences, such "
                        "as `16` (`0` if not even one fits).")
    if not 0 <= said <= MAX_BATCH:
        return "warn", (f"{said} is out of range: a global batch is a number of sequences "
                        f"from 0 to {MAX_BATCH:,}.")
    right = facts["largest"]
    if said == right:
        return "success", f"**Right: {right}.** " + _worked(facts)
    if said > right:
        hint = ("Too many: add up what one chip must hold at that batch. Which part of the "
                "per-chip figure in the table stays the same whatever the batch, and how big "
                "is it once nothing splits it?")
    else:
        hint = ("Too few: one chip has the usable HBM to itself. How much is left once the "
                "training state is in, and how much does each more sequence take (the "
                "table's activation and logits columns, per sequence a chip holds)?")
    return "warn", f"You said {said}; not quite. {hint}"


def one_chip_hbm() -> tuple[float, float]:
    """The HBM of the question's chip and what the convention lets a step use, in GB."""
    from ..environment.chips import get_chip, get_slice
    from ..sharding.fit import USABLE_FRACTION

    hbm = get_chip(get_slice(SLICE).chip).hbm_gb
    return hbm, USABLE_FRACTION * hbm
