"""The ICI time of a collective: one model, asked by every view, checked against published
figures rather than its own equation.

Sources the expected values come from (none of them is the code's formula):
- Cloud TPU documentation, system architecture pages: v6e 800 GB/s of bidirectional ICI per
  chip over 4 ports; v5e 400 GB/s over 4; v5p 1,200 GB/s over 6 ports. One port carries half
  of its share in each direction.
- jax-ml/scaling-book, sharding.md, pop quiz 2: an AllGather over the 4-chip axis of a TPU v5e
  mesh {'X': 8, 'Y': 4} of a bf16[2048, 8192] array was profiled at 680 µs (the book's own
  estimate for that axis without wrap-around: 560 µs); of a bf16[256, 256] array, "closer to
  8 µs" (latency-bound, 3 hops). tpus.md: "a 2x2x4 won't have any wraparounds ... only available
  on a full cube"; "A TPU v5e 8x16 will have a wraparound on the longer axis".
"""

from __future__ import annotations

import pandas as pd
import pytest

import tpu_workbench as wb
from tpu_workbench import sharding
from tpu_workbench.planning import slice_plan, steptime
from tpu_workbench.runs import gang


def test_link_bandwidths_are_the_published_per_chip_figures():
    for chip, per_chip_bidirectional, ports in (("v6e", 800, 4), ("v5e", 400, 4),
                                                 ("v5p", 1200, 6)):
        c = wb.get_chip(chip)
        assert c.ici_links == ports
        assert c.ici_link_gbps == per_chip_bidirectional / ports / 2  # one port, one way


def test_wraparound_follows_the_published_rules():
    v5e, v5p = wb.get_chip("v5e"), wb.get_chip("v5p")
    assert v5e.wraps((8, 16), 1) and not v5e.wraps((8, 16), 0)  # v5e 8x16: the long axis only
    assert not v5e.wraps((4, 4), 0)
    assert not any(v5p.wraps((2, 2, 4), a) for a in range(3))  # not a whole cube: none
    assert all(v5p.wraps((4, 4, 8), a) for a in range(3))  # whole cubes: every axis


def test_a_profiled_all_gather_on_v5e_is_matched_from_below():
    """The model is a bandwidth-and-hop bound: at or under what was measured, and close."""
    big = 2048 * 8192 * 2  # bf16[2048, 8192], gathered along the 4-chip axis of a v5e 4x8
    column = [0, 8, 16, 24]  # four chips along the first axis of a 4x8 torus
    t = sharding.collective_time_us("all-gather", big, column, (4, 8), "v5e")
    assert 0.65 * 680 < t < 680  # the profile: 680 µs; the hardware's full rate is not reached
    small = 256 * 256 * 2
    t = sharding.collective_time_us("all-gather", small, column, (4, 8), "v5e")
    assert 3 <= t <= 8  # latency-bound: 3 hops of about 1 µs; profiled "closer to 8 µs"


def test_two_chips_exchange_halves_over_one_link():
    """By hand from the v6e figure: a 64 MB all-reduce between the two chips of a data-axis
    pair sends half the buffer each way (reduce), then half again (gather), over one port:
    2 x 32e6 B / 100e9 B/s = 640 µs, plus a hop each way."""
    t = sharding.collective_time_us("all-reduce", 64e6, [0, 4], (2, 4), "v6e")
    assert t == pytest.approx(640 + 2, rel=1e-9)


def _all_reduce_hlo(values: int, groups: str, partitions: int) -> str:
    shape = f"f32[{values}]"
    return (f"HloModule ar, num_partitions={partitions}\n\n"
            "%add (x: f32[], y: f32[]) -> f32[] {\n  %x = f32[] parameter(0)\n"
            "  %y = f32[] parameter(1)\n  ROOT %s = f32[] add(%x, %y)\n}\n\n"
            f"ENTRY %main (p: {shape}) -> {shape} {{\n  %p = {shape}{{0}} parameter(0)\n"
            f"  ROOT %ar = {shape}{{0}} all-reduce(%p), replica_groups={groups}, "
            "to_apply=%add\n}\n")


def _every_view(mesh: tuple[int, ...], groups: list[list[int]]) -> list:
    """One 64 MB gradient all-reduce (dp) on a v6e-8, timed by the sharding table of an XLA
    run, a gang's CommDebugMode table, the slice plan and predict's totals."""
    n = 16_000_000  # f32 values: 64 MB
    text = "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"
    xla = sharding.collectives_frame(None, "v6e", hlo_text=_all_reduce_hlo(n, text, 8),
                                     mesh_shape=mesh)
    records = [{"kind": "collective", "collective": "all-reduce", "module": "", "op":
                "c10d.allreduce", "phase": "backward", "bytes": 4 * n, "group": groups[0]}]
    ranks = gang.collectives_frame(records, "v6e", mesh_shape=mesh)
    (plan,) = slice_plan.step_collectives(n, 128, 2, "v6e-8", "dp", 8, 16, mesh=mesh)
    no_ops = pd.DataFrame({"opcode": [], "bound": [], "time_s": [], "flops": [], "bytes": []})
    totals = steptime.totals(no_ops, xla)
    return [(xla.loc[0, "estimated_us"], xla.loc[0, "physical_axes"]),
            (ranks.loc[0, "estimated_us"], ranks.loc[0, "physical_axes"]),
            (plan["estimated_us"], plan["physical_axes"]),
            (totals["ici_s:data"] * 1e6, xla.loc[0, "physical_axes"])]


def test_every_view_gives_the_same_time_for_the_same_collective():
    # mesh (8,): the eight chips of a v6e-8 are a 2x4 torus, not a line of eight (the sharding
    # and gang tables timed it as one, 1134 µs): two lines at once, one way each,
    # 2 x 7/8 x 64e6 / 200e9 = 560 µs, plus 2 x (1 + 3) hops
    for t, axes in _every_view((8,), [list(range(8))]):
        assert (t, axes) == (pytest.approx(568.0, rel=1e-9), "2x4")
    # mesh (2, 4), over the data axis: the pairs {0, 4}... are the torus' axis of 2 (by hand
    # above: 642 µs)
    data = [[0, 4], [1, 5], [2, 6], [3, 7]]
    for t, axes in _every_view((2, 4), data):
        assert (t, axes) == (pytest.approx(642.0, rel=1e-9), "2")


def test_a_group_off_the_torus_axes_is_one_line():
    # devices 0, 2, 4, 6 of a 2x4 torus: no sub-grid; timed as one line of four chips
    assert sharding.physical_span([0, 2, 4, 6], (2, 4)) is None
    assert sharding.span_text([0, 2, 4, 6], (2, 4)) == "irregular"
    assert sharding.collective_time_us("all-gather", 1e6, [0, 2, 4, 6], (2, 4)) == \
        sharding.collective_time_us("all-gather", 1e6, [0, 1, 2, 3], (4,))


def test_assumptions_are_stated():
    text = sharding.ici_assumptions("v6e")
    for words in ("Estimated", "ring model", "100 GB/s", "16 chips", "1 µs per hop",
                  "row-major"):
        assert words in text, words
    assert "4x4x4 cubes" in sharding.ici_assumptions("v5p")
