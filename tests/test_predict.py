"""Predicted TPU step times (issue 23): the step-time model on hand-computed cases, the slice
table, bad input, and one end-to-end check of the block extrapolation against a whole compile."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tpu_workbench import sharding
from tpu_workbench.environment import chips
from tpu_workbench.errors import SpecError
from tpu_workbench.hlo import per_op_cost
from tpu_workbench.planning import steptime

V6E = chips.get_chip("v6e")  # 918 TFLOP/s bf16, 1638 GB/s HBM, 100 GB/s per ICI link and way


def _dot_module(m: int, k: int, n: int, dtype: str = "bf16") -> str:
    a, b, c = f"{dtype}[{m},{k}]", f"{dtype}[{k},{n}]", f"{dtype}[{m},{n}]"
    return (f"HloModule dot\n\nENTRY %main (a: {a}, b: {b}) -> {c} {{\n"
            f"  %a = {a}{{1,0}} parameter(0)\n  %b = {b}{{1,0}} parameter(1)\n"
            f"  ROOT %d = {c}{{1,0}} dot(%a, %b), lhs_contracting_dims={{1}}, "
            "rhs_contracting_dims={0}\n}\n")


def test_square_bf16_matmul_is_compute_bound():
    ops = steptime.op_times(per_op_cost(_dot_module(4096, 4096, 4096)), V6E)
    assert len(ops) == 1
    # by hand: 2 * 4096^3 = 1.374e11 FLOPs / 918e12 = 149.7 µs; 3 * 4096^2 * 2 B = 100.7 MB /
    # 1638e9 = 61.4 µs
    assert ops.loc[0, "bound"] == "compute"
    assert ops.loc[0, "time_s"] * 1e6 == pytest.approx(149.72, rel=1e-3)
    assert ops.loc[0, "hbm_s"] * 1e6 == pytest.approx(61.45, rel=1e-3)


def test_skinny_matmul_is_hbm_bound_and_f32_is_derated():
    ops = steptime.op_times(per_op_cost(_dot_module(8, 4096, 4096)), V6E)
    # by hand: bytes (8*4096 + 4096*4096 + 8*4096) * 2 = 33.69 MB / 1638e9 = 20.57 µs; FLOPs
    # 2*8*4096*4096 = 2.68e8 / 918e12 = 0.29 µs
    assert ops.loc[0, "bound"] == "hbm"
    assert ops.loc[0, "time_s"] * 1e6 == pytest.approx(20.57, rel=1e-3)
    f32 = steptime.op_times(per_op_cost(_dot_module(4096, 4096, 4096, "f32")), V6E)
    # the same FLOPs at 1/6 of the peak: 6 * 149.72 µs
    assert f32.loc[0, "compute_s"] * 1e6 == pytest.approx(898.3, rel=1e-3)


def _all_reduce_module(n_values: int, groups: str, partitions: int) -> str:
    shape = f"f32[{n_values}]"
    return (f"HloModule ar, num_partitions={partitions}\n\n"
            "%add (x: f32[], y: f32[]) -> f32[] {\n  %x = f32[] parameter(0)\n"
            "  %y = f32[] parameter(1)\n  ROOT %s = f32[] add(%x, %y)\n}\n\n"
            f"ENTRY %main (p: {shape}) -> {shape} {{\n  %p = {shape}{{0}} parameter(0)\n"
            f"  ROOT %ar = {shape}{{0}} all-reduce(%p), replica_groups={groups}, "
            "to_apply=%add\n}\n")


def _timed(hlo_text: str, mesh: tuple[int, ...], slice_name: str) -> pd.DataFrame:
    sl = chips.get_slice(slice_name)
    frame = sharding.collectives_frame(None, sl.chip, hlo_text=hlo_text, mesh_shape=mesh)
    return steptime.collective_times(frame, mesh, sl.topology, sl.chip)


def test_all_reduce_on_a_1d_mesh_without_and_with_wraparound():
    # 64 MB over all 8 chips of a v6e-8 (2x4, no wrap-around): two lines at once, one way,
    # 2 x 100 GB/s; 1 + 3 hops. By hand: 2 * 7/8 * 64e6 / 200e9 = 560 µs + 2 * 4 µs = 568 µs.
    t = _timed(_all_reduce_module(16_000_000, "{{0,1,2,3,4,5,6,7}}", 8), (8,), "v6e-8")
    assert t.loc[0, "ici_axis"] == "data" and t.loc[0, "physical_axes"] == "2x4"
    assert t.loc[0, "ici_s"] * 1e6 == pytest.approx(568.0, rel=1e-6)
    # v6e-256 (16x16): both axes are rings, both ways: 4 x 100 GB/s; 8 + 8 hops.
    # By hand: 2 * 255/256 * 64e6 / 400e9 = 318.75 µs + 2 * 16 µs = 350.75 µs.
    groups = "{{" + ",".join(map(str, range(256))) + "}}"
    t = _timed(_all_reduce_module(16_000_000, groups, 256), (256,), "v6e-256")
    assert t.loc[0, "ici_s"] * 1e6 == pytest.approx(350.75, rel=1e-6)


def test_all_reduce_on_a_2d_mesh_along_one_axis():
    # v6e-16 dp_tp: mesh 4x4, the model axis (groups of 4 neighbours) on one physical axis of
    # 4, a line: 100 GB/s, 3 hops. 8 MB: 2 * 3/4 * 8e6 / 100e9 = 120 µs + 6 µs.
    model_groups = "{{0,1,2,3},{4,5,6,7},{8,9,10,11},{12,13,14,15}}"
    t = _timed(_all_reduce_module(2_000_000, model_groups, 16), (4, 4), "v6e-16")
    assert t.loc[0, "ici_axis"] == "model" and t.loc[0, "physical_axes"] == "4"
    assert t.loc[0, "ici_s"] * 1e6 == pytest.approx(126.0, rel=1e-6)
    data_groups = "{{0,4,8,12},{1,5,9,13},{2,6,10,14},{3,7,11,15}}"
    t = _timed(_all_reduce_module(2_000_000, data_groups, 16), (4, 4), "v6e-16")
    assert t.loc[0, "ici_axis"] == "data" and t.loc[0, "ici_s"] * 1e6 == pytest.approx(126.0)
    # v6e-256 dp_tp: mesh 16x16, a model axis of 16 wraps around: 200 GB/s, 8 hops.
    # 2 * 15/16 * 8e6 / 200e9 = 75 µs + 16 µs.
    rows = ",".join("{" + ",".join(str(16 * r + c) for c in range(16)) + "}" for r in range(16))
    t = _timed(_all_reduce_module(2_000_000, "{" + rows + "}", 256), (16, 16), "v6e-256")
    assert t.loc[0, "ici_axis"] == "model" and t.loc[0, "ici_s"] * 1e6 == pytest.approx(91.0)


def test_step_prediction_overlap_range_mfu_and_bottleneck():
    total = {"compute_s": 1e-3, "hbm_s": 0.5e-3, "flops": 459e9, "bytes": 1.0,
             "ici_s:data": 2e-3, "ici_s:model": 0.5e-3}
    p = steptime.predict_step(total, "v6e", chips=8)
    assert p["predicted_roofline_ms"] == pytest.approx(1.5)
    assert p["predicted_step_max_ms"] == pytest.approx(4.0)  # 1.5 + 2.5, no overlap
    assert p["predicted_step_min_ms"] == pytest.approx(2.5)  # max(1.5, 2.5)
    assert p["bottleneck"] == "ICI (data axis)"
    # 459 GFLOP per chip over 918 TFLOP/s = 0.5 ms: MFU 0.5/4 and 0.5/2.5
    assert (p["predicted_mfu_min"], p["predicted_mfu_max"]) == pytest.approx((0.125, 0.2))
    busy = steptime.predict_step({**total, "ici_s:data": 0.0, "ici_s:model": 0.0}, "v6e", 8)
    assert busy["bottleneck"] == "compute" and busy["predicted_step_min_ms"] == 1.5
    hbm = steptime.predict_step({**total, "hbm_s": 3e-3}, "v6e", 8)
    assert hbm["bottleneck"] == "HBM"


def test_extrapolate_adds_what_one_block_adds():
    one = {"flops": 10.0, "ici_s:data": 1.0}
    two = {"flops": 13.0, "ici_s:data": 1.5, "ici_s:model": 0.25}
    assert steptime.extrapolate(one, two, 32) == {"flops": 10 + 31 * 3, "ici_s:data": 16.5,
                                                  "ici_s:model": 31 * 0.25}
    with pytest.raises(SpecError, match="layers"):
        steptime.extrapolate(one, two, 0)


def test_slice_table_and_fit_table_use_it():
    s = chips.get_slice("v6e-16")
    assert (s.chips, s.hosts, s.chips_per_host, s.topology) == (16, 4, 4, (4, 4))
    assert chips.get_slice("v5litepod-32").topology == (4, 8)
    assert chips.get_slice("v6e-8").hosts == 1 and chips.get_slice("v5p-32").chips == 16
    with pytest.raises(SpecError, match="v6e-12.*known slices: v6e-1"):
        chips.get_slice("v6e-12")
    with pytest.raises(SpecError, match="v5e slice, not v6e"):
        chips.get_slice("v5e-16", "v6e")
    assert sharding.SLICES["v6e-32"] == (4, 8)
    # 1e9 params, fsdp on 16 chips: 16 B each / 16 = 1 GB per chip either way; v5e's 16 GB
    # HBM leaves 14.4 GB usable, v6e's 32 GB 28.8
    t = sharding.fit_table(10**9, 16, 128, 512, 2, 8, slices=["v5e-16", "v6e-16"],
                           strategies=["fsdp"])
    assert list(t["usable_gb"]) == pytest.approx([14.4, 28.8])


class _NoPool:
    """A pool that fails if anything asks it for a worker: bad input must not reach one."""

    def worker(self, config):  # noqa: ANN001
        raise AssertionError("a worker was asked for")


def test_bad_input_is_refused_before_anything_compiles():
    from tpu_workbench.planning.predict import predict

    with pytest.raises(SpecError, match="unknown TPU slice 'v6e-12'"):
        predict("mingpt", "gpt-mini", slices=["v6e-12"], pool=_NoPool())
    with pytest.raises(SpecError, match="batch_size=12 does not split over 8"):
        predict("mingpt", "gpt-mini", slices=["v6e-8"], batch_size=12, seq_len=16,
                pool=_NoPool())
    with pytest.raises(SpecError, match="even int"):
        predict("mingpt", "gpt-mini", slices=["v6e-8"], batch_size=8, seq_len=15,
                pool=_NoPool())
    with pytest.raises(SpecError, match="seq_len=4096 is longer than hf:gpt2 gpt2's "
                       "n_positions=1024"):
        predict("hf:gpt2", "gpt2", slices=["v6e-8"], batch_size=8, seq_len=4096,
                pool=_NoPool())
    # Llama-3-8B on one v6e chip: 64 GB of bf16 weights, grads and moments; nothing fits
    with pytest.raises(SpecError, match="no plan fits, nothing to predict: v6e-1 fsdp"):
        predict("hf:llama", "llama-3-8b", slices=["v6e-1"], strategies=["fsdp"],
                batch_size=1, pool=_NoPool())


@pytest.fixture(scope="module")
def pool():
    from tpu_workbench.runs.workers import WorkerPool

    p = WorkerPool(max_workers=1)
    yield p
    p.shutdown()


def test_block_extrapolation_matches_a_whole_compile(pool):
    """gpt-mini (6 blocks), fsdp on a v6e-4: one and two blocks compiled and extrapolated are
    within 5% of the cost analysis of the whole model, and nothing was executed."""
    from tpu_workbench.planning.predict import predict

    kw = dict(slices=["v6e-4"], strategies=["fsdp"], seq_len=16, batch_size=8, pool=pool)
    whole = predict("mingpt", "gpt-mini", whole=True, **kw).iloc[0]
    blocks = predict("mingpt", "gpt-mini", whole=False, **kw).iloc[0]
    assert (whole["method"], blocks["method"]) == ("whole", "blocks")
    assert whole["executions"] == 0 and blocks["executions"] == 0
    for col in ("flops_per_device", "bytes_per_device", "collective_bytes_per_device",
                "predicted_roofline_ms", "predicted_ici_ms", "predicted_step_ms"):
        assert blocks[col] == pytest.approx(whole[col], rel=0.05), col
    assert whole["flops_per_device"] > 0 and whole["predicted_ici_ms"] > 0
    assert whole["bottleneck"] and not math.isnan(whole["predicted_mfu_max"])


def test_calibration_compares_a_measurement_with_the_range():
    row = {"predicted_step_min_ms": 2.0, "predicted_step_max_ms": 4.0, "bottleneck": "HBM"}
    inside = steptime.calibration(row, 3.0)
    assert inside["in_range"] and inside["error"] == pytest.approx(-0.25)
    slower = steptime.calibration(row, 6.0)
    assert not slower["in_range"] and slower["error"] == pytest.approx(0.5)
    with pytest.raises(SpecError, match="measured_ms"):
        steptime.calibration(row, 0)
