"""The exercises' judges (tpu_workbench/exercises/): right, wrong and malformed answers, each
against a value worked out here by hand."""

from __future__ import annotations

import math

import pytest

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


def test_profiling_compile_share():
    import pandas as pd

    from tpu_workbench.exercises import profiling

    steps = pd.DataFrame({"step": [0, 1, 2, 3], "compile_us": [900_000.0, 0, 0, 0],
                          "execute_us": [1000.0, 8000, 9000, 10_000],
                          "transfer_us": [0.0, 500, 500, 500], "host_us": [0.0, 500, 500, 500],
                          "idle_us": [0.0, 1000, 0, 1000]})
    ratio = profiling.compile_in_steps(steps)
    assert ratio == 900_000 / 10_000  # steady steps of 10,000, 10,000 and 12,000 us: median
    # by hand: every 50 steps, one 900 ms compile and 50 steps of 10 ms: 900 / 1400 = 64.3%
    share = profiling.compile_share(steps, every=50)
    assert share == pytest.approx(900 / 1400)
    assert profiling.judge(64, share)[0] == "success"
    assert profiling.judge(60, share)[0] == "success"
    kind, text = profiling.judge(180, share)
    assert kind == "warn" and "between 0 and 100" in text
    kind, text = profiling.judge(10, share)
    assert kind == "warn" and "fraction" in text
    cheap = steps.assign(compile_us=[400_000.0, 0, 0, 0])  # 40 steps' worth: 40 / 90 = 44%
    kind, text = profiling.judge(80, profiling.compile_share(cheap))  # 40 / 50: no total
    assert kind == "warn" and "whole" in text
    assert profiling.judge(None, share)[0] == "warn"
    no_compile = steps.assign(compile_us=0.0).iloc[1:]
    assert profiling.judge(3, profiling.compile_share(no_compile))[0] == "neutral"


def test_quickstart_fsdp_share_by_hand():
    from tpu_workbench.exercises import quickstart

    assert quickstart.asked_strategy("dp_tp") == "fsdp" and quickstart.asked_strategy(
        "fsdp") == "tp"
    # minGPT tiny's c_fc weight is [512, 128] float32: 262.144 KB; fsdp over 8 devices
    kb = quickstart.held_kb("mingpt", "transformer.h.0.mlp.c_fc.weight", (2, 4), "fsdp")
    assert kb == 512 * 128 * 4 / 8 / 1e3
    tp = quickstart.held_kb("mingpt", "transformer.h.0.mlp.c_fc.weight", (2, 4), "tp")
    assert tp == 512 * 128 * 4 / 4 / 1e3  # the model axis only
    assert quickstart.judge(32.8, kb, 262.144, "fsdp", 8)[0] == "success"
    assert "whole weight" in quickstart.judge(262.1, kb, 262.144, "fsdp", 8)[1]
    assert "1,000" in quickstart.judge(32.0, kb, 262.144, "fsdp", 8)[1]
    assert quickstart.judge(None, kb, 262.144, "fsdp", 8)[0] == "warn"


def test_plan_a_run_state_per_chip_by_hand():
    from tpu_workbench.exercises import plan_a_run

    # 2.7e9 parameters x 16 bytes = 43.2 GB; fsdp over 8 chips: 5.4 GB each
    assert plan_a_run.state_gb(2.7e9, "fsdp", "v6e-8") == pytest.approx(5.4)
    kind, text = plan_a_run.judge(5.4, 2.7e9)
    assert kind == "success" and "43.2 GB" in text and "over" in text
    assert "whole state" in plan_a_run.judge(43.2, 2.7e9)[1]
    assert "16 bytes" in plan_a_run.judge(1.35, 2.7e9)[1]
    assert plan_a_run.judge(None, 2.7e9)[0] == "warn"


def test_scale_out_processes_by_hand():
    from tpu_workbench.exercises import scale_out

    # a v6e-32 is 8 hosts of 4 chips (Cloud TPU's slice table)
    assert scale_out.processes("v6e-32", "torch_xla") == 8
    assert scale_out.processes("v6e-32", "torch_tpu") == 32
    assert scale_out.judge("8, 32", "v6e-32")[0] == "success"
    # v5p-64: 64 TensorCores, 32 chips on 8 hosts of 4 (the slice table)
    assert scale_out.processes("v5p-64", "torch_xla") == 8
    assert scale_out.processes("v5p-64", "torch_tpu") == 32
    assert "swapped" in scale_out.judge("32 8", "v6e-32")[1]
    assert "per **host**" in scale_out.judge("32, 32", "v6e-32")[1]
    assert "two whole numbers" in scale_out.judge("eight", "v6e-32")[1]


def test_sharding_twice_the_batch():
    import pandas as pd

    from tpu_workbench.exercises import sharding

    # dp's collectives of minGPT tiny on 2x4 (a measured step's, abridged): gradients of
    # [512,128] weights and LayerNorm all-gathers of [1, 352 tokens, 128] activations
    step = pd.DataFrame({"shape": ["f32[512,128]", "f32[1,352,128]", "f32[]", "f32[11,128]"],
                         "bytes": [262_144, 180_224, 4, 5632]})
    right = (262_144 + 2 * 180_224 + 4 + 5632) / 1e6  # by hand: 0.628228 MB
    assert sharding.mb_at_twice_the_batch(step, tokens=352) == right
    assert sharding.judge(0.63, step, 352)[0] == "success"
    kind, text = sharding.judge(2 * 0.448004, step, 352)
    assert kind == "warn" and "gradient" in text
    assert "B x T" in sharding.judge(0.448, step, 352)[1]
    assert sharding.judge(None, step, 352)[0] == "warn"
    assert sharding.judge(5.0, step, 352)[0] == "warn"


def test_eager_vs_compiled_last_batch():
    from tpu_workbench.exercises import eager_vs_compiled as ex

    assert ex.judge("2")[0] == "success" and ex.judge(" 2 ")[0] == "success"
    assert "shape" in ex.judge("1")[1]
    assert "second epoch" in ex.judge("6")[1] and "second epoch" in ex.judge("3")[1]
    assert "whole number" in ex.judge("two")[1] and ex.judge(None)[0] == "warn"


def test_unet_signal_at_half_way_by_hand():
    """The picture's scale at t = 500 under the cosine schedule, from Nichol & Dhariwal's
    formula (diffusers' alphas_cumprod[t] is f((t + 1) / T) / f(0)), and the judge's verdicts."""
    from tpu_workbench.exercises import unet

    facts = unet.signal_facts()
    def f(u):
        return math.cos((u + 0.008) / 1.008 * math.pi / 2)

    by_hand = f((unet.T + 1) / 1000) / f(0)
    assert facts["signal"] == pytest.approx(by_hand, abs=1e-4)
    assert facts["signal"] == pytest.approx(0.70, abs=0.01)
    assert facts["noise"] == pytest.approx(math.sqrt(1 - by_hand**2), abs=1e-4)
    assert unet.judge_signal("0.7", facts)[0] == "success"
    assert unet.judge_signal(" 71% ", facts)[0] == "success"
    assert "**Right: 0.70" in unet.judge_signal("0.71", facts)[1]
    kind, text = unet.judge_signal("0.5", facts)
    assert kind == "warn" and "angle" in text and "square root" in text
    assert "square root" in unet.judge_signal(f"{by_hand**2:.3f}", facts)[1]
    assert "Too little" in unet.judge_signal("0.4", facts)[1]
    assert "Too much" in unet.judge_signal("0.9", facts)[1]
    assert "linear" in unet.judge_signal(f"{facts['linear']:.3f}", facts)[1]
    for bad, said in (("half", "'half' is not a number"), ("1.5", "1.5 is out of range"),
                      ("-3%", "-0.03 is out of range"), (None, "'' is not a number")):
        kind, text = unet.judge_signal(bad, facts)
        assert kind == "warn" and said in text and "from 0 to 1" in text, (bad, text)


def test_resnet_flops_ratio_by_hand():
    from tpu_workbench.exercises import resnet

    facts = resnet.ratio_facts()
    # tiny (CIFAR stem, 16x16, 6 classes), multiply-adds by hand: stem 16*16*64*27; stage 1:
    # four 64->64 3x3 convs at 16x16; stages 2-4 each 2^25 (their first conv halves the map
    # and doubles the channels, plus a 1x1 shortcut); the classifier 512*6.
    tiny = 16 * 16 * 64 * 27 + 4 * 256 * 64 * 576 + 3 * 2**25 + 512 * 6
    assert facts["small"]["macs"] == tiny == 138_857_472
    assert facts["small"]["stages"] == [16, 8, 4, 2] and facts["big"]["stages"] == [56, 28, 14, 7]
    # ImageNet ResNet-18: 1.82 G multiply-adds per 224x224 image (torchvision's own count).
    assert 1.80e9 < facts["big"]["macs"] < 1.83e9
    assert 13.0 < facts["ratio"] < 13.2
    assert resnet.judge_ratio("13", facts)[0] == "success"
    assert resnet.judge_ratio("12.25x", facts)[0] == "success"  # the stages alone, within 10%
    kind, text = resnet.judge_ratio("196", facts)  # the pixel ratio
    assert kind == "warn" and "pixels" in text and "13.1" not in text
    assert "Too few" in resnet.judge_ratio("3", facts)[1]
    assert "Too many" in resnet.judge_ratio("40", facts)[1]
    assert "not a number" in resnet.judge_ratio("lots", facts)[1]
    assert "out of range" in resnet.judge_ratio("-2", facts)[1]


def test_dlrm_strategies_that_fit_a_v6e_16():
    from tpu_workbench.exercises import dlrm
    from tpu_workbench.models.dlrm import MLPERF_ROWS

    facts = dlrm.fit_facts()
    # fp32 tables (rows padded to multiples of 128) split 16 ways; x 4 for the gradients and
    # AdamW's two moments
    tables = sum(-(-r // 128) * 128 for r in MLPERF_ROWS) * 128 * 4 / 16
    # The MLPs whole on every chip, each [out, in] weight in a TPU's 8 x 128 tiles (13 and 479
    # inputs round up to 128 and 512 lanes, the 1-wide head's out to 8), biases to 128 lanes.
    mlps = sum(-(-o // 8) * 8 * -(-i // 128) * 128 + -(-o // 128) * 128 for i, o in [
        (13, 512), (512, 256), (256, 128), (479, 1024), (1024, 1024), (1024, 512), (512, 256),
        (256, 1)]) * 4
    assert facts["state_gb"]["row"] == pytest.approx(4 * (tables + mlps) / 1e9, rel=1e-9)
    # stacked: 26 tables padded to 40M rows, 2 per chip, x 4
    assert facts["state_gb"]["table"] == pytest.approx(2 * 40e6 * 128 * 4 * 4 / 1e9, rel=1e-3)
    # column: 8 of 128 columns a chip, padded to 128 lanes as a TPU lays fp32 out: 418 GB
    assert facts["state_gb"]["column"] == pytest.approx(4 * (tables * 16 + mlps) / 1e9, rel=1e-3)
    assert dlrm.judge_fit(["row"], facts)[0] == "success"
    kind, text = dlrm.judge_fit(["row", "table"], facts)
    assert kind == "warn" and "40M-row" in text
    assert "lanes are 128 wide" in dlrm.judge_fit(["row", "column"], facts)[1]
    assert "missing" in dlrm.judge_fit(["dp"], facts)[1] or "dp keeps" in dlrm.judge_fit(
        ["dp"], facts)[1]
    assert dlrm.judge_fit([], facts)[0] == "warn" and dlrm.judge_fit(None, facts)[0] == "warn"
    assert "not one of" in dlrm.judge_fit(["zero"], facts)[1]


def test_typed_number_reads_what_readers_type_and_refuses_the_rest():
    from tpu_workbench.exercises import typed_number

    assert typed_number(" 1,234.5 KiB", "KiB") == 1234.5
    assert typed_number("13X", "x") == typed_number("13", "x") == 13.0
    assert typed_number("480kib", "KiB") == 480.0
    for bad in ("", None, "abc", "nan", "inf", "12 MiB"):
        assert typed_number(bad, "KiB") is None, bad


def test_port_your_model_masked_max():
    from tpu_workbench.exercises import port_your_model as ex

    assert ex.judge_masked("torch.where(h > 0.5, h, -torch.inf).max()")[0] == "success"
    kind, text = ex.judge_masked(ex.BLOCKED)  # the same value, still data-dependent
    assert kind == "warn" and "depends on the data" in text
    # also right: a 0 never beats an element above 0.5 (and the judge's tensors have some)
    assert ex.judge_masked("torch.where(h > 0.5, h, 0).max()")[0] == "success"
    kind, text = ex.judge_masked("h.mean()")
    assert kind == "warn" and "Not the same value" in text
    assert "not x" in ex.judge_masked("torch.where(h > 0.5, h, x).max()")[1]
    assert ex.judge_masked("torch.where(")[0] == "warn"
    assert ex.judge_masked("")[0] == "neutral"


def test_serve_a_model_crossover_by_hand():
    from tpu_workbench.exercises import serve_a_model

    # By hand: Llama-3.3-70B has 70.55e9 parameters: 141.1 GB of bf16, 17.64 GB on each of 8
    # chips. A token keeps K and V of 8 heads x 128 x 2 B x 80 layers = 327,680 B, 40,960 B a
    # chip; a sequence holds 1000 + 500 tokens on average: 61.44 MB a chip. 17.64e9 / 61.44e6.
    assert serve_a_model.crossover() == pytest.approx(287.1, rel=2e-3)
    assert serve_a_model.judge(290)[0] == "success"
    assert "half its answer" in serve_a_model.judge(215)[1]  # every token for the whole decode
    assert "tensor-parallel chips" in serve_a_model.judge(287 * 8)[1]
    assert serve_a_model.judge(None)[0] == "warn"
