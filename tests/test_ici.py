"""The ICI cost model of collectives, against hand computations (no formula recomputed here).

v6e figures used by hand: one ICI link carries 100 GB/s = 1e11 B/s in each direction
(jax-ml/scaling-book: 1e11 one-way, 2e11 bidirectional per link); a v6e-8 is a 2x4 slice, and
v6e axes shorter than 16 chips have no wrap-around link, so a ring along an axis of a chips is a
line: one direction of one link, a-1 hops of 1 µs each. An all-reduce of V bytes over n chips is
a reduce-scatter plus an all-gather: 2 (n-1)/n x V / bandwidth + 2 x hops x 1 µs.

1 MB (1e6 B) all-reduce on a v6e-8 (2x4):
- over 2 chips (the axis of 2): 2 x 1/2 x 1e6 / 1e11 s = 10 µs, + 2 x 1 hop = 12 µs;
- over 4 chips (the axis of 4): 2 x 3/4 x 1e6 / 1e11 s = 15 µs, + 2 x 3 hops = 21 µs.
The old model (800 GB/s per chip, no latency) gave 1.25 µs and 1.875 µs: 10x too optimistic.
"""

from __future__ import annotations

import pytest

import tpu_workbench as wb
from tpu_workbench import sharding as sh


def test_one_megabyte_all_reduce_on_a_v6e_8():
    assert sh.collective_time_us("all-reduce", 1e6, (2,), "v6e") == pytest.approx(12.0)
    assert sh.collective_time_us("all-reduce", 1e6, (4,), "v6e") == pytest.approx(21.0)


def test_other_collectives_by_hand():
    # all-gather of 1 MB along 4 v6e chips (a line): 3/4 x 1e6 / 1e11 s = 7.5 µs + 3 hops
    assert sh.collective_time_us("all-gather", 1e6, (4,), "v6e") == pytest.approx(10.5)
    # over both axes of a 2x4 mesh: two lines at once, 2e11 B/s; 7/8 x 1e6 / 2e11 = 4.375 µs,
    # hops 1 + 3
    assert sh.collective_time_us("all-gather", 1e6, (2, 4), "v6e") == pytest.approx(8.375)
    # a ring of 16 v6e chips wraps around: both directions, 2e11 B/s, 8 hops
    # 2 x 15/16 x 1e6 / 2e11 = 9.375 µs, + 2 x 8 hops
    assert sh.collective_time_us("all-reduce", 1e6, (16,), "v6e") == pytest.approx(25.375)
    # v5e links are half as fast: 5e10 B/s; 2 x 1/2 x 1e6 / 5e10 = 20 µs + 2 hops
    assert sh.collective_time_us("all-reduce", 1e6, (2,), "v5e") == pytest.approx(22.0)
    # collective-permute: 1 MB over one link, one direction: 10 µs + 1 hop
    assert sh.collective_time_us("collective-permute", 1e6, (2,), "v6e") == pytest.approx(11.0)
    assert sh.collective_time_us("all-reduce", 1e6, (1,), "v6e") == 0.0  # nothing to exchange


def test_latency_dominates_small_arrays():
    # 1 kB: 2 x 3/4 x 1e3 / 1e11 s = 0.015 µs of bandwidth against 6 µs of hops
    small = sh.collective_time_us("all-reduce", 1e3, (4,), "v6e")
    assert small == pytest.approx(6.015)


def test_one_ici_convention_for_every_chip():
    # Published per-chip totals: v5e 400 GB/s and v6e 800 GB/s (both directions, 4 links);
    # v5p 4800 Gbps = 600 GB/s (one direction, 6 links) = 1200 GB/s both ways.
    assert wb.get_chip("v5e").ici_total_gbps == 400
    assert wb.get_chip("v6e").ici_total_gbps == 800
    assert wb.get_chip("v5p").ici_total_gbps == 1200
    assert wb.get_chip("v5p").ici_links * wb.get_chip("v5p").ici_link_gbps * 8 == 4800


def test_assumptions_are_stated():
    text = sh.ici_assumptions("v6e")
    for words in ("Estimated", "ring model", "100 GB/s", "16 chips", "1 µs per hop"):
        assert words in text, words
