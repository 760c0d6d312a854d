"""Predicted TPU step times (issue 23): the step-time model on hand-computed cases, the slice
table, bad input, and one end-to-end check of the block extrapolation against a whole compile."""

from __future__ import annotations

import math

import pytest

from tpu_workbench import sharding
from tpu_workbench.environment import chips
from tpu_workbench.errors import SpecError
from tpu_workbench.hlo import per_op_cost
from tpu_workbench.models.base import TransformerShape
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


def test_skinny_matmul_is_hbm_bound():
    ops = steptime.op_times(per_op_cost(_dot_module(8, 4096, 4096)), V6E)
    # by hand: bytes (8*4096 + 4096*4096 + 8*4096) * 2 = 33.69 MB / 1638e9 = 20.57 µs; FLOPs
    # 2*8*4096*4096 = 2.68e8 / 918e12 = 0.29 µs
    assert ops.loc[0, "bound"] == "hbm"
    assert ops.loc[0, "time_s"] * 1e6 == pytest.approx(20.57, rel=1e-3)


def test_f32_matmuls_cost_the_bf16_passes_of_torch_xlas_precision():
    """torch_xla.backends.set_mat_mul_precision's documentation: on a TPU "default" downcasts
    f32 to bf16 (one pass), "high" takes three passes, "highest" six; torch_xla 2.9 runs
    "default" unless told otherwise (the workbench used to assume six, with no source)."""
    ops = per_op_cost(_dot_module(4096, 4096, 4096, "f32"))
    default = steptime.op_times(ops, V6E)
    assert default.loc[0, "compute_s"] * 1e6 == pytest.approx(149.72, rel=1e-3)  # as bf16
    highest = steptime.op_times(ops, V6E, precision="highest")
    assert highest.loc[0, "compute_s"] * 1e6 == pytest.approx(6 * 149.72, rel=1e-3)
    with pytest.raises(SpecError, match="precision must be one of default, high, highest"):
        steptime.op_times(ops, V6E, precision="fp32")


def test_step_prediction_overlap_range_mfu_and_bottleneck():
    total = {"compute_s": 1e-3, "hbm_s": 0.5e-3, "flops": 459e9, "bytes": 1.0,
             "ici_s:data": 2e-3, "ici_s:model": 0.5e-3}
    model_flops = 8 * 459e9  # the model's FLOPs per step, all chips together
    p = steptime.predict_step(total, "v6e", chips=8, model_flops=model_flops)
    assert p["predicted_roofline_ms"] == pytest.approx(1.5)
    assert p["predicted_step_max_ms"] == pytest.approx(4.0)  # 1.5 + 2.5, no overlap
    assert p["predicted_step_min_ms"] == pytest.approx(2.5)  # max(1.5, 2.5)
    assert p["bottleneck"] == "ICI (data axis)"
    # 459 GFLOP per chip over 918 TFLOP/s = 0.5 ms: MFU 0.5/4 and 0.5/2.5
    assert (p["predicted_mfu_min"], p["predicted_mfu_max"]) == pytest.approx((0.125, 0.2))
    busy = steptime.predict_step({**total, "ici_s:data": 0.0, "ici_s:model": 0.0}, "v6e", 8,
                                 model_flops)
    assert busy["bottleneck"] == "compute" and busy["predicted_step_min_ms"] == 1.5
    hbm = steptime.predict_step({**total, "hbm_s": 3e-3}, "v6e", 8, model_flops)
    assert hbm["bottleneck"] == "HBM"
    assert p["predicted_step_ms"] == pytest.approx(4.0)  # the program waits on every one


def test_asynchronous_collectives_hide_behind_compute_as_far_as_it_goes():
    """1.5 ms of ops; a collective the program waits on adds its time, an asynchronous one only
    what the ops cannot hide; compute runs at the efficiency asked for."""
    base = {"compute_s": 1e-3, "hbm_s": 0.5e-3, "flops": 1.0, "bytes": 1.0}
    hidden = steptime.predict_step({**base, "ici_async_s:data": 1e-3}, "v6e", 8, 1.0)
    assert hidden["predicted_step_ms"] == pytest.approx(1.5)
    assert (hidden["predicted_step_min_ms"], hidden["predicted_step_max_ms"]) == \
        pytest.approx((1.5, 2.5))
    longer = steptime.predict_step({**base, "ici_async_s:data": 2e-3}, "v6e", 8, 1.0)
    assert longer["predicted_step_ms"] == pytest.approx(2.0)
    mixed = steptime.predict_step({**base, "ici_s:data": 0.25e-3, "ici_async_s:data": 1e-3},
                                  "v6e", 8, 1.0, efficiency=0.5)
    assert mixed["predicted_compute_ms"] == pytest.approx(2.0)
    assert mixed["predicted_step_ms"] == pytest.approx(2.0 + 0.5 + 0.25)
    with pytest.raises(SpecError, match="efficiency"):
        steptime.predict_step(base, "v6e", 8, 1.0, efficiency=0)


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
    assert sharding.MESHES["v6e-32"] == (4, 8)
    # 1e9 params, fsdp on 16 chips: 16 B each / 16 = 1 GB per chip either way; v5e's 16 GB
    # HBM leaves 14.4 GB usable, v6e's 32 GB 28.8
    shape = TransformerShape(512, 2, 8, 8, 64, 2048, 1000, "gelu", "n_layer")
    t = sharding.fit_table(shape, 10**9, 16, 128, slices=["v5e-16", "v6e-16"],
                           strategies=["fsdp"])
    assert list(t["usable_gb"]) == pytest.approx([14.4, 28.8])
    assert list(t["params_gb"] + t["grads_gb"] + t["optimizer_gb"]) == pytest.approx([1, 1])


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
    # dp_tp's model axis of 4 does not divide 2 heads: refused before fsdp's compile starts
    with pytest.raises(SpecError, match="'dp_tp' splits hf:llama's num_attention_heads"):
        predict("hf:llama", "tiny", slices=["v6e-8"], strategies=["fsdp", "dp_tp"],
                seq_len=64, batch_size=8, pool=_NoPool(),
                options={"num_attention_heads": 2, "num_key_value_heads": 2})
    # Llama-3-8B on one v6e chip: 16 bytes per parameter (fp32 weights, grads and moments) is
    # 128 GB before any activation; nothing fits, nothing is traced
    with pytest.raises(SpecError, match=r"no plan fits, nothing to predict: .*alone.* v6e-1 "
                       r"fsdp: 128\.5 GB > 28\.8 GB"):
        predict("hf:llama", "llama-3-8b", slices=["v6e-1"], strategies=["fsdp"],
                batch_size=1, pool=_NoPool())


def test_gpt2_by_blocks_names_its_own_layers_field():
    """hf:gpt2's config calls its depth n_layer: the blocks path used to set num_hidden_layers,
    an unknown option. Validated, it reaches the compile (here a pool that refuses)."""
    from tpu_workbench.planning.predict import predict

    with pytest.raises(AssertionError, match="a worker was asked for"):
        predict("hf:gpt2", "gpt2", slices=["v6e-8"], strategies=["fsdp"], batch_size=8,
                seq_len=64, whole=False, pool=_NoPool())


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


def test_a_batch_the_compiler_refuses_is_timed_from_1_and_2_sequences_per_shard(
        pool, monkeypatch):
    """gpt-mini, fsdp on a v6e-4 at batch 32 (8 sequences per chip): with the compiler made to
    refuse anything above 2 per chip, the step is compiled at 1 and 2 and extrapolated. Its
    FLOPs and roofline are within 10% of the real batch-32 compile's, and the row keeps the
    refusal (fits False, no memory figure of ours). Its collectives are those the compiler
    scheduled for the small batch (here they are most of the step, and less of them hides)."""
    from tpu_workbench.planning import predict as plan
    from tpu_workbench.tpu_compile import DoesNotFit

    real = plan.tpu_compile

    def refusing(model, preset, slice, strategy, seq_len, batch_size, *a, **kw):
        if batch_size > 8:
            raise DoesNotFit(f"needs more HBM than a chip has (batch {batch_size})")
        return real(model, preset, slice, strategy, seq_len, batch_size, *a, **kw)

    kw = dict(slices=["v6e-4"], strategies=["fsdp"], seq_len=16, batch_size=32, whole=True,
              pool=pool)
    exact = plan.predict("mingpt", "gpt-mini", **kw).iloc[0]
    monkeypatch.setattr(plan, "tpu_compile", refusing)
    guess = plan.predict("mingpt", "gpt-mini", **kw).iloc[0]
    assert not guess["fits"] and "extrapolated from 1 and 2 sequences" in guess["reason"]
    assert math.isnan(guess["compiler_memory_gb"])
    for col in ("flops_per_device", "predicted_roofline_ms"):
        assert guess[col] == pytest.approx(exact[col], rel=0.10), col
    assert guess["predicted_step_ms"] >= guess["predicted_roofline_ms"]


def test_mfu_counts_the_models_flops_not_the_replicas(pool):
    """tp on a v6e-4 (mesh 2x2) leaves the batch whole: both rows of the mesh compute the same
    step, so XLA's FLOPs over all chips are about twice the model's. MFU counts the model's
    FLOPs (its analytic count), so tp's replicated work is not useful work."""
    from tpu_workbench.models import get_model
    from tpu_workbench.planning.predict import predict

    row = predict("mingpt", "gpt-mini", slices=["v6e-4"], strategies=["tp"], seq_len=16,
                  batch_size=8, whole=True, pool=pool).iloc[0]
    family = get_model("mingpt")
    model_flops = family.flops_per_step(family.config("gpt-mini", length=8, block_size=16), 8)
    assert row["predicted_mfu_max"] == pytest.approx(
        model_flops / (4 * V6E.peak_flops * row["predicted_step_min_ms"] / 1e3), rel=1e-6)
    assert 1.6 < row["flops_per_device"] * 4 / model_flops < 2.4  # two replicas of the work


def test_calibration_compares_a_measurement_with_the_range():
    row = {"predicted_step_min_ms": 2.0, "predicted_step_max_ms": 4.0, "bottleneck": "HBM"}
    inside = steptime.calibration(row, 3.0)
    assert inside["in_range"] and inside["error"] == pytest.approx(-0.25)
    slower = steptime.calibration(row, 6.0)
    assert not slower["in_range"] and slower["error"] == pytest.approx(0.5)
    with pytest.raises(SpecError, match="measured_ms"):
        steptime.calibration(row, 0)


def test_flash_above_64_chips_is_planned_as_its_per_chip_equivalent():
    from tpu_workbench.tpu_compile.compile import equivalent_slice

    assert equivalent_slice("v6e-256", 768) == ("v6e-64", 192)  # 3 sequences per chip
    assert equivalent_slice("v6e-32", 96) == ("v6e-32", 96)  # small enough: itself
    with pytest.raises(SpecError, match=r"v6e-128 at batch_size=100: no per-chip equivalent.*"
                                        r"a multiple of 128"):
        equivalent_slice("v6e-128", 100)


def test_collectives_over_every_chip_or_the_data_axis_are_retimed_on_the_larger_torus():
    import pandas as pd

    from tpu_workbench.sharding.ici import collective_time_us

    frame = pd.DataFrame({"kind": ["all-gather", "collective-permute"],
                          "buffer_bytes": [1e9, 1e6], "group_size": [64, 2],
                          "axis": ["data", "other"], "estimated_us": [1.0, 2.0]})
    wide = steptime.widen_collectives(frame, "v6e", (64,), (256,), (16, 16))
    assert wide["estimated_us"][0] == collective_time_us("all-gather", 1e9, None, (16, 16))
    assert wide["group_size"].tolist() == [256, 2] and wide["estimated_us"][1] == 2.0
    assert frame["estimated_us"][0] == 1.0  # the input is left alone
    # 2-D, (16, 4) for (64, 4): the data axis's ring grows to 64 chips, the model axis's not.
    frame = pd.DataFrame({"kind": ["all-gather", "all-reduce", "all-reduce"],
                          "buffer_bytes": [1e9, 1e8, 1e8], "group_size": [16, 4, 64],
                          "axis": ["data", "model", "all"], "estimated_us": [1.0, 2.0, 3.0]})
    wide = steptime.widen_collectives(frame, "v6e", (16, 4), (64, 4), (16, 16))
    assert wide["group_size"].tolist() == [64, 4, 256]
    assert wide["estimated_us"][0] == collective_time_us("all-gather", 1e9,
                                                         list(range(0, 256, 4)), (16, 16))
    assert wide["estimated_us"][1] == 2.0
    assert wide["estimated_us"][2] == collective_time_us("all-reduce", 1e8, None, (16, 16))


def test_a_2d_plan_with_flash_on_v6e_128_reuses_the_v6e_64_program_with_its_model_axis(pool):
    """Traced once (64 virtual devices, mesh 16x4, batch 64): fsdp_tp on v6e-128 (mesh 32x4)
    at batch 128 is that program on twice the chips. Per chip the compute is the same; the
    data axis's collectives run on longer rings and the weight and Adam shards are half as
    large."""
    from tpu_workbench.planning.predict import predict

    kw = dict(strategies=["fsdp_tp"], seq_len=128, attention="flash", whole=True, pool=pool,
              model_axis=4, options={"max_position_embeddings": 128})
    big = predict("hf:llama", "tiny", slices=["v6e-128"], batch_size=128, **kw).iloc[0]
    small = predict("hf:llama", "tiny", slices=["v6e-64"], batch_size=64, **kw).iloc[0]
    assert big["mesh"] == "32x4" and small["mesh"] == "16x4"
    assert big["compiled_as"].startswith("v6e-64 on mesh 16x4 at batch 64 (the same 4 "
                                         "sequences per data shard)")
    assert big["compiled_for"] == small["compiled_for"] == "v6e:8x8"
    assert small["compiled_as"] == ""
    assert big["predicted_roofline_ms"] == pytest.approx(small["predicted_roofline_ms"])
    assert big["predicted_ici_ms"] > small["predicted_ici_ms"]  # longer data-axis rings
    assert big["compiler_memory_gb"] < small["compiler_memory_gb"]
    assert big["predicted_mfu"] > 0 and big["fits"]


def test_a_model_axis_that_does_not_divide_is_refused_before_anything_compiles():
    from tpu_workbench.planning.predict import predict

    with pytest.raises(SpecError, match=r"model_axis=3 must be a positive int dividing "
                                        r"v6e-16's 16 chips"):
        predict("hf:llama", "tiny", slices=["v6e-16"], strategies=["tp"], model_axis=3,
                seq_len=64)
    with pytest.raises(SpecError, match=r"model_axis=128 on v6e-256: the per-chip equivalent "
                                        r"on 64 chips needs a model axis that divides 64"):
        predict("hf:llama", "tiny", slices=["v6e-256"], strategies=["tp"], model_axis=128,
                batch_size=256, seq_len=64)
