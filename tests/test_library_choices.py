"""Choices the notebooks take from the library instead of writing them down (issue 16): which
modes a comparison starts with, which compile HLO, which tensor a layout picture shows, what a
roofline is drawn against."""

from __future__ import annotations

import pandas as pd
import pytest

import tpu_workbench as wb
from tpu_workbench import sharding as sh


def test_mode_choices_follow_what_runs_here():
    have = wb.available_modes()
    assert wb.comparison_modes() == [m for m in have if m != "inductor"]
    assert "inductor" in have and "inductor" not in wb.comparison_modes()
    assert set(wb.hlo_modes()) == {"eager", "lazy", "compile", "dynamo"}  # torch_xla here
    assert wb.default_modes()[-1] in have


def test_the_layout_picture_shows_the_largest_split_parameter():
    # a 64x64 weight replicated (16 KiB on every device), a 32x16 one split in 8 (4 rows each)
    frame = sh.layout_frame(sh.shard_tensor_spec("big", [64, 64], (None, None), "2x4")
                            + sh.shard_tensor_spec("small", [32, 16], (("data", "model"), None),
                                                   "2x4"))
    assert sh.tensors_by_size(frame) == ["big", "small"]  # 16 KiB vs 4x16x4 = 256 B per device
    assert sh.largest_split_tensor(frame) == "small"
    replicated = frame[frame["tensor"] == "big"]
    assert sh.largest_split_tensor(replicated) == "big"  # nothing split: the largest


def test_roofline_roofs_name_their_source():
    assert wb.roofline_targets() == ["this host (measured)", "v5e", "v6e", "v5p"]
    assert wb.roofline_roof("v6e") == (918e12, 1638e9, "one v6e chip (published)")
    host = wb.host_peak_flops()
    peak, bandwidth, source = wb.roofline_roof("this host (measured)")
    assert (peak, bandwidth) == (host["peak_flops"], host["cache_bandwidth_bytes_per_s"])
    assert wb.roofline_slopes("this host (measured)") == {
        "main memory": host["bandwidth_bytes_per_s"]}
    assert wb.roofline_slopes("v6e") == {}
    assert source.startswith("this host, measured at ")
    with pytest.raises(ValueError, match="unknown TPU chip 'v9'"):
        wb.roofline_roof("v9")


def test_fusion_and_collective_tables_live_with_the_hlo():
    assert not hasattr(wb.charts, "fusion_table") and not hasattr(wb.charts, "collective_table")
    empty = pd.DataFrame(columns=["kind", "name", "replica_groups", "bytes", "group_size",
                                  "num_groups"])
    assert list(wb.hlo.collective_table(empty).columns) == [
        "kind", "replica_groups", "count", "bytes", "group_size", "num_groups"]
