"""The model families in plain PyTorch on the CPU: sizes, FLOP counts, learning, determinism,
config checks. (torch_xla is never imported here; the XLA:CPU runs are the runner's tests.)"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from tpu_workbench.errors import SpecError
from tpu_workbench.models import get_model

FAMILIES = ("mingpt", "resnet", "unet")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # steady on a busy machine


def build(name: str, preset: str = "tiny", seed: int = 0, **overrides):
    family = get_model(name)
    cfg = family.config(preset, **overrides)
    torch.manual_seed(seed)
    return family, cfg, family.build(cfg)


@pytest.mark.parametrize("name, preset, expected", [
    ("mingpt", "gpt2", 124_439_808),  # GPT-2 small, lm_head tied to wte
    ("mingpt", "gpt-mini", 2_672_256),
    ("resnet", "resnet18", 11_689_512),
    ("resnet", "resnet50", 25_557_032),
])
def test_parameter_counts(name, preset, expected):
    family = get_model(name)
    with torch.device("meta"):
        model = family.build(family.config(preset))
    assert sum(p.numel() for p in model.parameters()) == expected


def test_mingpt_weights_stay_tied_when_moved():
    family = get_model("mingpt")
    with torch.device("meta"):
        model = family.build(family.config("tiny"))
    model = model.to_empty(device="cpu")  # replaces every parameter, like .to(xla_device)
    assert model.lm_head.weight is model.transformer.wte.weight


def test_mingpt_forward_matmul_flops_by_hand():
    family = get_model("mingpt")
    cfg = family.config("tiny", n_layer=1, n_head=1, n_embd=4, vocab_size=3, block_size=3,
                        length=2)
    # T = 3 positions, batch 1, d = 4, V = 3: c_attn 2*3*4*12 = 288, QK^T 2*3*3*4 = 72,
    # AV 72, attn.c_proj 2*3*4*4 = 96, c_fc 2*3*4*16 = 384, mlp.c_proj 384, lm_head 2*3*4*3 = 72.
    assert family.forward_matmul_flops(cfg, 1) == 1368
    assert family.flops_per_step(cfg, 2) == 3 * 2 * 1368
    assert family.items_per_batch(cfg, 2) == 6


@pytest.mark.parametrize("name, overrides", [
    ("mingpt", {}),
    ("resnet", {}),
    ("resnet", {"arch": "resnet50", "cifar_stem": False, "image_size": 64}),
    ("unet", {}),
    ("unet", {"attn_levels": (1,), "mid_attention": True, "attention_head_dim": 8}),
])
def test_forward_matmul_flops_match_torch_flop_counter(name, overrides):
    family, cfg, model = build(name, **overrides)
    batch = family.make_batch(cfg, 2, torch.Generator().manual_seed(0))
    # The math backend runs attention as bmm's, which the counter sees (the fused CPU kernel
    # has no FLOP formula).
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        family.loss(model, batch)
    assert counter.get_total_flops() == family.forward_matmul_flops(cfg, 2)


def _train(name: str, steps: int) -> list[float]:
    family, cfg, model = build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=family.default_lr)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        loss = family.loss(model, family.make_batch(cfg, family.default_batch_size(cfg), gen))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name, steps", [("mingpt", 30), ("resnet", 25), ("unet", 30)])
def test_tiny_preset_learns(name, steps):
    losses = _train(name, steps)
    first, last = sum(losses[:3]) / 3, sum(losses[-5:]) / 5  # ResNet's batches of 8 are noisy
    assert last < 0.6 * first, losses


@pytest.mark.parametrize("name", FAMILIES)
def test_same_seed_same_batches_and_losses(name):
    family = get_model(name)
    cfg = family.config("tiny")

    def batch(seed):
        return family.make_batch(cfg, 4, torch.Generator().manual_seed(seed))

    a, b, c = batch(1), batch(1), batch(2)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    losses = [family.loss(build(name, seed=3)[2], a).item() for _ in range(2)]
    assert losses[0] == losses[1]


@pytest.mark.parametrize("name", FAMILIES)
def test_evaluate_is_a_scalar_tensor_in_range(name):
    family, cfg, model = build(name)
    batch = family.make_batch(cfg, 4, torch.Generator().manual_seed(0))
    with torch.no_grad():
        value = family.evaluate(model, batch)
    assert isinstance(value, torch.Tensor) and value.dim() == 0
    if family.metric_name == "accuracy":
        assert 0.0 <= value.item() <= 1.0
    else:
        assert value.item() > 0.0


class _Answers(torch.nn.Module):
    """Stands in for a model: logits whose argmax is `answers` (-1 targets answered with 0)."""

    def __init__(self, answers: torch.Tensor, n_classes: int):
        super().__init__()
        self.logits = torch.nn.functional.one_hot(answers.clamp(min=0), n_classes).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits


@pytest.mark.parametrize("name", ["mingpt", "resnet", "mlp"])
def test_accuracy_counts_right_answers_of_scored_targets(name):
    """A model right on every scored target gets 1.0, one wrong answer costs exactly 1/N, with N
    counted by hand: minGPT tiny scores the sorted half of each sequence (6 of 11 targets, the
    prefix's are -1), so 4 sequences give 24; the classifiers score each of the 4 items."""
    family, cfg, model = build(name)
    batch = family.make_batch(cfg, 4, torch.Generator().manual_seed(0))
    with torch.no_grad():
        n_classes = model(batch["x"]).shape[-1]
    y = batch["y"]
    n = {"mingpt": 4 * 6}.get(name, 4)
    assert int((y != -1).sum()) == n
    assert family.evaluate(_Answers(y, n_classes), batch).item() == 1.0
    wrong = y.clone()
    first = tuple(int(i) for i in (y != -1).nonzero()[0])  # the first scored target
    wrong[first] = (y[first] + 1) % n_classes
    assert family.evaluate(_Answers(wrong, n_classes), batch).item() == pytest.approx((n - 1) / n)


def test_batches_have_fixed_shapes():
    gen = torch.Generator().manual_seed(0)
    gpt, gpt_cfg = get_model("mingpt"), get_model("mingpt").config("tiny")
    b = gpt.make_batch(gpt_cfg, 5, gen)
    assert b["x"].shape == b["y"].shape == (5, 11)
    assert (b["y"][:, :5] == -1).all() and (b["y"][:, 5:] >= 0).all()
    assert torch.equal(b["y"][:, 5:], b["x"][:, :6].sort(dim=1).values)  # the sorted half
    res = get_model("resnet")
    b = res.make_batch(res.config("resnet18"), 2, gen)
    assert b["x"].shape == (2, 3, 224, 224) and b["y"].shape == (2,)
    unet = get_model("unet")
    b = unet.make_batch(unet.config("tiny"), 3, gen)
    assert b["x"].shape == b["noise"].shape == (3, 3, 32, 32) and b["t"].shape == (3,)
    assert b["x"].min() >= -1 and b["x"].max() <= 1 and b["t"].dtype == torch.long


class _OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.name())
        return func(*args, **(kwargs or {}))


def test_unet_step_avoids_nearest_upsample():
    # torch_xla 2.9 lowers upsample_nearest2d_backward only on TPU; on XLA:CPU it is a CPU
    # fallback, so the family upsamples with broadcast + reshape instead.
    family, cfg, model = build("unet")
    batch = family.make_batch(cfg, 2, torch.Generator().manual_seed(0))
    with _OpNames() as ops:
        family.loss(model, batch).backward()
    assert not [n for n in ops.names if "upsample" in n]


def test_unet_sample():
    family, cfg, model = build("unet")
    out = family.sample(model, cfg, n=2, steps=3, generator=torch.Generator().manual_seed(0))
    again = family.sample(model, cfg, n=2, steps=3, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 3, 32, 32) and out.min() >= 0 and out.max() <= 1
    assert torch.equal(out, again)


class _OracleDenoiser(torch.nn.Module):
    """Predicts exactly the noise that separates x_t from `target`: sampling must return it."""

    def __init__(self, alphas_cumprod, target):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.alphas_cumprod, self.target = alphas_cumprod, target

    def forward(self, x, t):
        a = self.alphas_cumprod[t].view(-1, 1, 1, 1)
        return (x - a.sqrt() * self.target) / (1 - a).sqrt()


def test_unet_sampler_follows_the_training_schedule():
    family, cfg, model = build("unet")
    target = family.make_batch(cfg, 2, torch.Generator().manual_seed(0))["x"]
    oracle = _OracleDenoiser(model.alphas_cumprod, target)
    out = family.sample(oracle, cfg, n=2, steps=10, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(out, (target + 1) / 2, atol=1e-4, rtol=0)


def test_unet_does_not_import_torch_xla():
    code = ("import sys, torch; from tpu_workbench.models import get_model; f = get_model('unet'); "
            "f.build(f.config('tiny')); assert 'torch_xla' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("name, overrides, match", [
    ("mingpt", {"n_head": 5}, "n_head=5"),
    ("mingpt", {"n_embd": 0}, "n_embd.*0"),
    ("mingpt", {"block_size": 8}, "block_size=8"),
    ("mingpt", {"vocab_size": 2}, "vocab_size=2"),
    ("mingpt", {"length": -1}, "length.*-1"),
    ("resnet", {"image_size": 30}, "image_size=30.*multiple of 8"),
    ("resnet", {"image_size": 48, "cifar_stem": False}, "image_size=48.*multiple of 32"),
    ("resnet", {"arch": "resnet7"}, "resnet7"),
    ("resnet", {"num_classes": 0}, "num_classes.*0"),
    ("resnet", {"batch_size": 0}, "batch_size.*0"),
    ("unet", {"image_size": 34}, "image_size=34.*multiple of 4"),
    ("unet", {"block_out_channels": (16, 30)}, "norm_num_groups=8.*30"),
    ("unet", {"block_out_channels": ()}, r"block_out_channels.*\(\)"),
    ("unet", {"attn_levels": (3,)}, r"attn_levels=\(3,\)"),
    ("unet", {"layers_per_block": 0}, "layers_per_block.*0"),
])
def test_bad_config_raises_spec_error(name, overrides, match):
    with pytest.raises(SpecError, match=match):
        get_model(name).config("tiny", **overrides)


def test_resnet_held_out_predictions_feed_the_confusion_matrix():
    """Fresh images (not the run's batches) with the model's predictions, row by row, and the
    confusion matrix counting them: one cell per (true, predicted) pair, summing to the set."""
    import tpu_workbench as wb
    from tpu_workbench.models.resnet import SHAPES

    family, cfg, model = build("resnet")
    frame, images = family.held_out_predictions(model, cfg, n=50, batch_size=20)
    assert len(frame) == 50 and images.shape == (50, 3, cfg.image_size, cfg.image_size)
    assert set(frame["true"]) <= set(SHAPES) and set(frame["predicted"]) <= set(SHAPES)
    with torch.no_grad():  # row i is images[i], predicted by the model in eval mode
        assert SHAPES[int(model(images[7:8]).argmax())] == frame["predicted"][7]
    assert frame.equals(family.held_out_predictions(model, cfg, n=50, batch_size=20)[0])
    train = family.make_batch(cfg, 50, torch.Generator().manual_seed(0))
    assert not torch.equal(images, train["x"])  # its own seed, not the run's first batches
    chart = wb.charts.confusion_matrix(frame, classes=list(SHAPES)).to_dict()
    counts = chart["datasets"][next(iter(chart["datasets"]))]
    assert sum(row["count"] for row in counts) == 50
    assert len({(r["true"], r["predicted"]) for r in counts}) == len(counts) == 6 * 6
