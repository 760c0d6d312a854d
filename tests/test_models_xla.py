"""The tiny presets through the runner on XLA:CPU: the same losses as plain PyTorch, learning.

Kept short for two cores: XLA:CPU compiles the ResNet and UNet steps in tens of seconds, so those
two run 3 XLA steps (checked step for step against plain PyTorch, whose longer runs in
test_models.py show the loss falling); minGPT, fast on XLA, trains long enough to learn there.
"""

from __future__ import annotations

import numpy as np
import pytest

import tpu_workbench as wb

XLA_STEPS = {"mingpt": 20, "resnet": 3, "unet": 3}
TORCH_STEPS = {"mingpt": 3, "resnet": 60, "unet": 3}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path_factory.mktemp("results")))
    pool = wb.WorkerPool()
    out = {}
    for model in XLA_STEPS:
        for mode, steps in (("compile", XLA_STEPS), ("torch_eager", TORCH_STEPS)):
            spec = wb.ExperimentSpec(model=model, preset="tiny", mode=mode, steps=steps[model])
            out[model, mode] = wb.run(spec, pool=pool)
    pool.shutdown()
    mp.undo()
    return out


@pytest.mark.parametrize("model", list(XLA_STEPS))
def test_xla_matches_plain_pytorch_step_for_step(runs, model):
    xla = runs[model, "compile"].steps["loss"].to_numpy()
    cpu = runs[model, "torch_eager"].steps["loss"].to_numpy()
    np.testing.assert_allclose(xla[0], cpu[0], rtol=1e-4)  # the same weights and batch
    np.testing.assert_allclose(xla[1], cpu[1], rtol=2e-3)  # after one update
    # Adam's first updates move every weight by about lr whatever its gradient's size, so a
    # gradient that differs in its last bits (XLA:CPU sums a convolution in another order than
    # ATen) flips a near-zero update: by step 2 ResNet's losses differ by up to 0.7% under
    # ATen's default kernels (0.4% under AVX-512; plain PyTorch against itself across the three
    # kernel sets: 0.02%). A broken mode is off by far more: the loss moves 20% in that step.
    np.testing.assert_allclose(xla[2], cpu[2], rtol=2e-2)


def test_mingpt_learns_on_xla(runs):
    result = runs["mingpt", "compile"]
    loss = result.steps["loss"].to_numpy()
    assert loss[-3:].mean() < 0.8 * loss[:3].mean(), loss
    assert result.summary["metric"] > 1 / 3 + 0.15  # sorted-half token accuracy; chance 1/3


def test_resnet_learns_the_shapes_on_a_large_held_out_set(runs):
    """60 steps of 32 fresh images each, scored on 512 others: about 80% here under each of
    ATen's CPU kernel sets (chance is 1/6). With 512 images the sampling noise is about two
    points, so half-way between chance and that is far from both."""
    summary = runs["resnet", "torch_eager"].summary
    assert summary["eval_items"] >= 512
    assert summary["metric"] > 0.5, summary["metric"]
