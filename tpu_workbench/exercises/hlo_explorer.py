"""The HLO explorer's exercise: the FLOPs of one matmul kernel, reasoned from the model's shapes
before it is opened on the page."""

from __future__ import annotations

import math


def mlp_matmul_flops(batch: int, positions: int, width: int, hidden: int) -> float:
    """FLOPs of the forward ``c_fc`` matmul: [batch x positions, width] @ [width, hidden] is
    one multiply and one add per (row, output column, inner index)."""
    return 2.0 * batch * positions * width * hidden


def judge(answer: float | None, flops: float) -> tuple[str, str]:
    """(callout kind, markdown) for an answer in MFLOP against the matmul's `flops`; within 5%
    is right (rounding on the way is fine)."""
    if answer is None or not math.isfinite(answer) or answer <= 0:
        return "warn", "Enter a positive number of MFLOP (millions of floating-point operations)."
    want = flops / 1e6
    if abs(answer - want) <= 0.05 * want:
        return "success", (f"**Right**: {want:,.1f} MFLOP. Each of the {int(flops // 2):,} "
                           "multiply-adds is two FLOPs; XLA's cost analysis counts the same.")
    if abs(answer - want / 2) <= 0.05 * want / 2:
        return "warn", ("That is the number of multiply-adds: a multiply-add is **two** "
                        "floating-point operations.")
    if abs(answer - want * 3) <= 0.05 * want * 3:
        return "warn", ("That is forward plus backward (the backward pass does the work "
                        "twice more): the question asks for the forward matmul alone.")
    return "warn", ("Not quite. Write the matmul as [rows, width] @ [width, hidden]: how many "
                    "rows does it see when every position of every sequence goes through it?")
