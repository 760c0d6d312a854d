"""The UNet learns to draw: after a short plain-PyTorch training run in this process, its DDIM
samples are measurably closer to the training pictures than an untrained model's samples from
the same starting noise. And each training step draws its timesteps and noise afresh from the
cycled batches (the worker reuses a few generated batches), without changing their statistics.
"""

from __future__ import annotations

import pytest
import torch

from tpu_workbench.models import get_model
from tpu_workbench.models.unet import pictures

STEPS, BATCH, CYCLE = 150, 16, 8  # the worker cycles through 8 generated batches too


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steady on a busy 2-core machine (see test_models.py)
    yield
    torch.set_num_threads(threads)


def _nearest_rms(images: torch.Tensor, reference: torch.Tensor) -> float:
    """Mean over `images` of the RMS pixel distance to the nearest reference picture, by a
    plain loop (independent of the notebook's scoring helper)."""
    out = []
    for img in images:
        d = ((reference - img) ** 2).flatten(1).mean(dim=1).sqrt()
        out.append(d.min())
    return float(torch.stack(out).mean())


def test_samples_move_towards_the_training_pictures():
    family = get_model("unet")
    cfg = family.config("pictures16")
    torch.manual_seed(0)
    untrained = family.build(cfg)
    torch.manual_seed(0)
    model = family.build(cfg)
    gen = torch.Generator().manual_seed(0)
    batches = [family.make_batch(cfg, BATCH, gen) for _ in range(CYCLE)]
    opt = torch.optim.AdamW(model.parameters(), lr=family.default_lr)
    for step in range(STEPS):
        loss = family.loss(model, batches[step % CYCLE])
        opt.zero_grad()
        loss.backward()
        opt.step()
    reference = pictures(512, cfg.image_size, torch.Generator().manual_seed(99))

    def sample(m):
        return family.sample(m.eval(), cfg, n=16, steps=20,
                             generator=torch.Generator().manual_seed(1))

    before = _nearest_rms(sample(untrained), reference)
    after = _nearest_rms(sample(model), reference)
    # Measured: untrained 0.54, after 150 steps 0.42; real pictures to their nearest ~0.10.
    assert after < before - 0.06, (before, after)


def test_each_step_redraws_timesteps_and_noise():
    family = get_model("unet")
    cfg = family.config("pictures16")
    torch.manual_seed(0)
    model = family.build(cfg)
    batch = family.make_batch(cfg, 4, torch.Generator().manual_seed(0))
    seen = []

    def spy(noisy, t):
        seen.append((noisy.clone(), t.clone()))
        return torch.zeros_like(noisy)

    model.forward = spy
    with torch.no_grad():
        for _ in range(3):
            family.loss(model, batch)
        family.evaluate(model, batch)
    assert int(model.draws) == 3  # evaluation uses the batch as drawn and counts nothing
    ts = [t for _, t in seen]
    assert not torch.equal(ts[0], ts[1]) and not torch.equal(ts[1], ts[2])
    assert torch.equal(ts[3], batch["t"])
    assert all(((t >= 0) & (t < cfg.num_train_timesteps)).all() for t in ts)
    # With the schedule's signal at t, the redrawn noise is recovered exactly from noisy - signal
    # * picture (up to a mirror of the picture): a permutation of the batch's own noise values.
    acp = model.alphas_cumprod
    for k, (noisy, t) in enumerate(seen[:3]):
        a = acp[t].view(-1, 1, 1, 1)
        x = batch["x"]
        x = x.flip(-1) if k % 2 else x
        x = x.flip(-2) if k // 2 % 2 else x
        noise = (noisy - a.sqrt() * x) / (1 - a).sqrt()
        torch.testing.assert_close(noise.flatten(1).sort(dim=1).values,
                                   batch["noise"].flatten(1).sort(dim=1).values,
                                   atol=1e-4, rtol=0)
