"""The dlrm notebook's exercise: which strategies let the MLPerf-shaped DLRM train on a v6e-16?
The page shows the tables' sizes and the memory per chip on a v6e-8; the reader scales it to 16
chips and sees that splitting rows divides every table evenly; splitting columns leaves 8 of
128 columns a chip, which a TPU stores padded to 128 lanes (no saving at all); whole tables per
chip (stacked, so padded to the largest table's 40M rows) leave two 40M-row tables on a chip,
with AdamW's state four times their weights. libtpu's compile agrees (notes/dlrm.md)."""

from __future__ import annotations

SLICE = "v6e-16"
PRESET = "mlperf"
CHOICES = ("dp", "table", "row", "column")


def fit_facts(slice_: str = SLICE, preset: str = PRESET) -> dict:
    """What :func:`judge_fit` needs, from :func:`tpu_workbench.sharding.embedding_fit_table`:
    per strategy the ``state_gb`` per chip and ``fits``, and the ``usable_gb`` of a chip."""
    from .. import sharding

    table = sharding.embedding_fit_table("dlrm", preset, slices=(slice_,), strategies=CHOICES)
    return {"slice": slice_, "usable_gb": float(table["usable_gb"].iloc[0]),
            "state_gb": dict(zip(table["strategy"], table["state_gb"].astype(float),
                                 strict=True)),
            "fits": dict(zip(table["strategy"], table["fits"].astype(bool), strict=True))}


def _worked(f: dict) -> str:
    gb = f["state_gb"]
    parts = [f"{s}: {gb[s]:.1f} GB" for s in CHOICES]
    return (f"Training state per chip on a {f['slice']} (fp32 weights, gradients and AdamW's "
            f"two moments, 16 bytes a parameter held): {', '.join(parts)}, against "
            f"{f['usable_gb']:.1f} GB usable. Rows split every table 16 ways: 104.5 GB of "
            "weights become 6.5 GB a chip. Columns split 16 ways leave 8 floats of each row on "
            "a chip, and a TPU lays an fp32 array's last dim out in 128 lanes: the slice takes "
            "as much memory as the whole table. Whole tables: stacked, each of the 26 tables "
            "takes the largest one's 40M rows, and a chip holds 2 of them, 41 GB of weights "
            "before any optimizer state. libtpu's own compile of the step agrees: only row "
            "fits (21.0 GB a chip).")


def judge_fit(answer: object, facts: dict) -> tuple[str, str]:
    """``(callout kind, markdown)`` for `answer` (the strategies picked: a list of names)
    against `facts` (:func:`fit_facts`): right when it is exactly the set that fits. Pure."""
    picked = {str(a) for a in (answer or [])}
    unknown = sorted(picked - set(CHOICES))
    if unknown:
        return "warn", (f"{', '.join(unknown)} is not one of the strategies: pick from "
                        f"{', '.join(CHOICES)}.")
    if not picked:
        return "warn", "Pick at least one strategy (the ones you think fit), then **check**."
    right = {s for s, ok in facts["fits"].items() if ok}
    if picked == right:
        return "success", (f"**Right: {' and '.join(sorted(right))}.** " + _worked(facts))
    if "column" in picked:
        hint = ("A chip holds 8 of each row's 128 columns under column on 16 chips; how does a "
                "TPU store an fp32 array whose last dim is 8 (its lanes are 128 wide)?")
    elif "table" in picked:
        hint = ("Whole tables per chip: how many of the 40M-row tables land on one chip, and "
                "what are their weights, gradients and AdamW moments together?")
    elif "dp" in picked:
        hint = "dp keeps every table on every chip: over 100 GB of weights alone."
    else:
        hint = ("Some strategy that fits is missing: which other one divides every table's "
                "bytes by the chip count?")
    return "warn", f"Not quite. {hint}"
