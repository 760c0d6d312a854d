"""The generation notebook's exercise: predict how many programs a server's decode loop compiles
for a sequence of requests the page did not run, under three strategies, from the shapes each
strategy feeds XLA. Judged with the workbench's own count
(:func:`tpu_workbench.generation.analysis.programs`), which the page's measured runs confirm."""

from __future__ import annotations

import math
from typing import Any

# The requests the question asks about: prompt lengths in arrival order (one repeats), tokens
# generated per request, and the buckets of the bucketed strategy.
PROMPTS = (3, 12, 5, 12, 9)
NEW_TOKENS = 4
BUCKETS = (8, 16)
ASKED = ("dynamic_cache", "static_cache", "bucketed")

HINTS = {
    "dynamic_cache": "one prefill per prompt length, then one program per cache length a decode "
                     "step sees (at decode step i the cache holds the prompt plus i - 1 "
                     "positions); a length two requests share is one program",
    "static_cache": "one prefill per prompt length (a length seen before is a program already "
                    "compiled) and one decode step, whose cache has one length for every request",
    "bucketed": "one prefill per bucket used (which bucket does each prompt land in?) and the "
                "same one decode step",
}


def expected() -> dict[str, int]:
    """The programs each asked strategy compiles for the question's requests on a fresh
    worker."""
    from ..generation import analysis

    return {s: analysis.programs(s, PROMPTS, NEW_TOKENS, BUCKETS) for s in ASKED}


def _whole(value: Any) -> int | None:
    """`value` as a non-negative whole number, or None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    if not math.isfinite(number) or number < 0 or number != int(number):
        return None
    return int(number)


def judge(answer: dict[str, Any] | None,
          measured: dict[str, tuple[int, int]] | None = None) -> tuple[str, str]:
    """(callout kind, markdown) for `answer`, the programs the reader predicts per strategy of
    :data:`ASKED`. `measured`: strategy -> (compilations the page's own XLA run measured, the
    count the same rule gives for that run's requests), quoted once the answer is right as
    evidence that the rule is what XLA does here; None where no XLA run was made."""
    if answer is None:
        return "neutral", "Enter a number for each strategy and press **check**."
    said = {s: _whole(answer.get(s)) for s in ASKED}
    missing = [s for s, n in said.items() if n is None]
    if missing:
        return "warn", ("Enter a whole number of programs (0 or more) for "
                        + ", ".join(f"`{s}`" for s in missing) + ".")
    right = expected()
    wrong = [s for s in ASKED if said[s] != right[s]]
    if wrong:
        good = [f"`{s}`" for s in ASKED if s not in wrong]
        lines = [f"- `{s}` ({said[s]}): count {HINTS[s]}." for s in wrong]
        head = (f"{', '.join(good)} right; not yet " if good else "Not yet: ") + \
            ", ".join(f"`{s}`" for s in wrong) + "."
        return "warn", head + "\n\n" + "\n".join(lines)
    from ..generation import analysis

    buckets = [analysis.bucket_for(p, BUCKETS) for p in PROMPTS]
    lengths = sorted({p + i - 1 for p in PROMPTS for i in range(1, NEW_TOKENS)})
    again = sorted({p for p in PROMPTS if PROMPTS.count(p) > 1})
    repeat = (f" ({', '.join(map(str, again))} comes again: a prefill compiled before)"
              if again else "")
    text = (f"**Right**: {right['dynamic_cache']}, {right['static_cache']} and "
            f"{right['bucketed']}.\n\n"
            f"- `dynamic_cache`: {len(set(PROMPTS))} prefills{repeat} and {len(lengths)} "
            f"decode programs, one per cache length ({', '.join(map(str, lengths))}).\n"
            f"- `static_cache`: {len(set(PROMPTS))} prefills and 1 decode step.\n"
            f"- `bucketed`: the prompts land in buckets {', '.join(map(str, buckets))}, so "
            f"{len(set(buckets))} prefills, and 1 decode step. Serving more prompt lengths adds "
            "no program once every bucket has been used.")
    if measured:
        seen = ", ".join(f"`{s}` {got} (counted {want})" for s, (got, want) in measured.items())
        text += (f"\n\nThe page's own XLA run compiled {seen}: the same counting, measured "
                 "here.")
    return "success", text
