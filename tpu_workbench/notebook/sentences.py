"""Sentences that compare numbers on a page, computed from those numbers: a lesson written as
fixed prose ("XLA is no speed-up on a CPU") is contradicted the day the table beside it says
otherwise."""

from __future__ import annotations

# Within this factor of each other, two step times are "about as fast": the spread of steady
# steps on a busy 2-core host is about that wide.
SAME_SPEED = 1.15


def xla_against_pytorch(summary, baseline: str = "torch_eager") -> str:
    """Markdown: the fastest XLA mode's steady step against plain PyTorch's `baseline` in
    `summary` (:func:`tpu_workbench.summarize`'s frame: ``mode``, ``steady_median_ms``), as
    the numbers have it: slower, faster or about as fast, by how much. Empty where either side
    did not run."""
    from ..runs.spec import MODES

    steady = summary.dropna(subset=["steady_median_ms"]).set_index("mode")["steady_median_ms"]
    xla = steady[[m for m in steady.index if m in MODES and MODES[m].runtime.xla]]
    if baseline not in steady or xla.empty:
        return ""
    best = str(xla.idxmin())
    ours, theirs = float(xla[best]), float(steady[baseline])
    figures = f"{ours:,.1f} ms a step against {theirs:,.1f} ms"
    if ours > SAME_SPEED * theirs:
        return (f"On this CPU XLA is no speed-up for this model: its fastest mode, `{best}`, "
                f"is {ours / theirs:,.1f}x slower than plain PyTorch's `{baseline}` "
                f"({figures}).")
    if theirs > SAME_SPEED * ours:
        return (f"On this CPU XLA's `{best}` is {theirs / ours:,.1f}x faster than plain "
                f"PyTorch's `{baseline}` ({figures}): one fused program per step beats running "
                "the step op by op.")
    return (f"On this CPU XLA's fastest mode, `{best}`, and plain PyTorch's `{baseline}` are "
            f"about as fast ({figures}).")
