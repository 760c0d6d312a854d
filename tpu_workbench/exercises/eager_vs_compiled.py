"""The eager-vs-compiled exercise: how many times a training loop compiles when its last batch
is smaller, reasoned from what makes XLA compile (a new input shape is a new program) and what
its cache keeps (a program it compiled before is a hit)."""

from __future__ import annotations

import re

EPOCHS = 3
RIGHT = 2  # one program per distinct batch shape; the cache serves every repeat


def judge(answer: str | None) -> tuple[str, str]:
    """(callout kind, markdown) for the number of compilations of the train step."""
    found = re.fullmatch(r"\s*(\d+)\s*", str(answer or ""))
    if not found:
        return "warn", "Type a whole number of compilations."
    said = int(found.group(1))
    if said == RIGHT:
        return "success", (
            "**Right: 2.** One program for the batches of 32 and one for the last batch of 8, "
            "both compiled in the first epoch; every later step is a cache hit (the warm "
            "worker above took its first step from the cache). `drop_last=True`, or padding "
            "the last batch to 32, makes it 1.")
    if said == 1:
        return "warn", "The last batch has another shape: is that the same program?"
    if said == 2 * EPOCHS or said == EPOCHS:
        return "warn", ("Does the second epoch compile again? Think of what the warm worker "
                        "did with a program it had compiled before.")
    return "warn", ("Not quite. Count distinct programs: what differs from one step to the "
                    "next, and what the compile cache keeps.")
