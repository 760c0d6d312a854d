"""The exercises' judges (tpu_workbench/exercises/): right, wrong and malformed answers, each
against a value worked out here by hand."""

from __future__ import annotations

from tpu_workbench.exercises import hlo_explorer


def test_hlo_explorer_matmul_flops():
    flops = hlo_explorer.mlp_matmul_flops(batch=32, positions=11, width=128, hidden=512)
    assert flops == 2 * 352 * 128 * 512  # 46,137,344 by hand
    assert hlo_explorer.judge(46.1, flops)[0] == "success"
    kind, text = hlo_explorer.judge(23.07, flops)  # multiply-adds, not FLOPs
    assert kind == "warn" and "two" in text
    assert "backward" in hlo_explorer.judge(138.4, flops)[1]
    assert hlo_explorer.judge(10.0, flops)[0] == "warn"
    assert "positive" in hlo_explorer.judge(None, flops)[1]
    assert "positive" in hlo_explorer.judge(-3.0, flops)[1]
