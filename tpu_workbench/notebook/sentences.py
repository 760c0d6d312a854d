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


def compiles_by_phase_text(by_phase) -> str:
    """Markdown: what each run compiled, counted from `by_phase`
    (:func:`tpu_workbench.generation.compiles_by_phase`: ``mode``, ``strategy``, ``phase``,
    ``compiles``), one line per mode and strategy: "`lazy` `static_cache`: 3 prefill and 1
    decode programs"."""
    counts = by_phase.pivot_table(index=["mode", "strategy"], columns="phase",
                                  values="compiles", aggfunc="sum", fill_value=0)
    lines = []
    for (mode, strategy), row in counts.iterrows():
        parts = [f"{int(row[phase])} {phase}" for phase in ("prefill", "decode")
                 if phase in row.index]
        total = int(row.sum())
        lines.append(f"- `{mode}` `{strategy}`: {' and '.join(parts)} "
                     f"program{'s' if total != 1 else ''} compiled")
    return "**Counted in these runs:**\n\n" + "\n".join(lines)


def confusion_text(held_out) -> str:
    """Markdown: what a confusion matrix of `held_out` (columns ``true``, ``predicted``) shows,
    counted from it: its largest mix-up, and the answer the model gives far more often than
    its share of the images, if there is one."""
    total = len(held_out)
    if not total:
        return ""
    wrong = held_out[held_out["true"] != held_out["predicted"]]
    if not len(wrong):
        return f"All {total} images were called right."
    (true, predicted), count = next(iter(
        wrong.groupby(["true", "predicted"]).size().sort_values(ascending=False).items()))
    seen = int((held_out["true"] == true).sum())
    text = (f"Its largest mix-up: **{count} of the {seen} {true}s were called {predicted}**.")
    called = held_out["predicted"].value_counts()
    classes = held_out["true"].nunique()
    top, times = str(called.index[0]), int(called.iloc[0])
    if times > 1.5 * total / classes:
        text += (f" It answers **{top}** for {times} of the {total} images ({times / total:.0%}, "
                 f"where each of the {classes} shapes is about {1 / classes:.0%} of them): the "
                 f"column under {top} holds the shapes it cannot tell apart yet.")
    return text
