"""The hf:* families' TPU options (models/hf.py): ``attn_implementation="flash"`` (torch_xla's
Pallas kernel, kernels/xla_flash.py) and ``remat=True`` (kernels/remat.py).

Plain PyTorch checks run here; the XLA:CPU ones in one subprocess (8 CPU devices, SPMD, a 1-D
mesh) that only traces: flash attention cannot run on XLA:CPU, and nothing in it executes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tpu_workbench as wb
from tpu_workbench import models

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


def _step(remat: bool) -> tuple[float, dict[str, torch.Tensor], int]:
    """One training step's loss, gradients, and how often layer 0's MLP ran."""
    family = models.get_model("hf:llama")
    cfg = family.config("tiny", remat=remat)
    torch.manual_seed(0)
    net = family.build(cfg)
    calls = []
    # a pre-hook: torch stops the recomputation once the last saved tensor is back (early stop)
    net.hf.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    loss = family.loss(net, family.make_batch(cfg, 4, torch.Generator().manual_seed(0)))
    loss.backward()
    return loss.item(), {n: p.grad for n, p in net.named_parameters()}, len(calls)


def test_remat_recomputes_each_layer_and_changes_no_number():
    loss, grads, calls = _step(remat=False)
    remat_loss, remat_grads, remat_calls = _step(remat=True)
    assert (calls, remat_calls) == (1, 2)  # remat: the layer runs again in the backward
    # The same float32 ops on the same inputs: equal up to summation order (1e-6 relative).
    assert remat_loss == pytest.approx(loss, rel=1e-6)
    assert remat_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(remat_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_flash_off_a_tpu_is_a_spec_error_before_anything_runs():
    family = models.get_model("hf:llama")
    cfg = family.config("tiny", attn_implementation="flash")
    net = family.build(cfg)
    with pytest.raises(wb.SpecError, match=r"attn_implementation='flash': flash attention runs "
                       r"on a TPU; on XLA:CPU it can only be traced for the TPU compiler .*plain "
                       r"PyTorch on cpu; use eager or sdpa here"):
        family.loss(net, family.make_batch(cfg, 2, torch.Generator().manual_seed(0)))


def test_flash_wrapper_equals_eager_attention_around_a_stand_in_kernel(monkeypatch):
    """GQA's repeated heads, the padding to the kernel's blocks and the layout around the kernel,
    checked on plain PyTorch: the kernel (TPU only) replaced by causal SDPA, against
    Transformers' eager attention."""
    from kernels import xla_flash

    def stand_in(q, k, v, causal, sm_scale, partition_spec, mesh):
        assert q.shape == k.shape == v.shape and q.shape[2] == 128  # 11 tokens padded
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                scale=sm_scale)

    monkeypatch.setattr(xla_flash, "_kernel", lambda: stand_in)  # no torch_xla in this process
    monkeypatch.setattr(xla_flash, "unavailable", lambda device: None)
    monkeypatch.setattr(xla_flash, "_partition", lambda shape: (None, None))
    family = models.get_model("hf:llama")
    batch = family.make_batch(family.config("tiny"), 2, torch.Generator().manual_seed(0))
    logits = {}
    for impl in ("eager", "flash"):
        torch.manual_seed(0)
        logits[impl] = family.build(family.config("tiny", attn_implementation=impl))(batch["x"])
    torch.testing.assert_close(logits["flash"], logits["eager"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model, options, message", [
    ("hf:llama", {"attn_implementation": "flash2"},
     r"attn_implementation='flash2' is not one of \('eager', 'sdpa', 'flash'\)"),
    ("hf:llama", {"attn_implementation": "flash", "head_dim": 192},
     r"head_dim=192: .* at most 128 or a multiple of 128; use eager or sdpa"),
    ("hf:gemma2", {"attn_implementation": "flash"},
     r"attn_logit_softcapping=50.0: the Pallas kernel has no soft-capping"),
    ("hf:qwen2", {"attn_implementation": "flash", "use_sliding_window": True,
                  "sliding_window": 8, "max_window_layers": 0},
     r"sliding_window=8: the Pallas kernel is causal over the whole sequence"),
    ("hf:llama", {"remat": 1}, r"option remat must be True or False .*got 1"),
])
def test_bad_tpu_options_are_named(model, options, message):
    with pytest.raises(wb.SpecError, match=message):
        wb.ExperimentSpec(model=model, preset="tiny", options=options).validate()


# ---------------------------------------------------------------------------------------------
# XLA:CPU, traced only
# ---------------------------------------------------------------------------------------------
TRACE = """
import json, os, re
import numpy as np, torch, torch_xla
import torch_xla.debug.metrics as met
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from kernels.xla_flash import tpu_lowering
from tpu_workbench import models
from tpu_workbench.errors import SpecError

xr.use_spmd()
mesh = xs.Mesh(np.arange(8), (8,), ("data",))
xs.set_global_mesh(mesh)
dev = torch_xla.device()
family = models.get_model("hf:llama")
out = {}


def trace(cfg, lowering=False):
    torch.manual_seed(0)
    net = family.build(cfg).to(dev)
    batch = {k: v.to(dev) for k, v in family.make_batch(
        cfg, 8, torch.Generator().manual_seed(0)).items()}
    for v in batch.values():
        xs.mark_sharding(v, mesh, ("data",) + (None,) * (v.dim() - 1))
    if lowering:
        with tpu_lowering():
            loss = family.loss(net, batch)
            loss.backward()
    else:
        loss = family.loss(net, batch)
        loss.backward()
    return torch_xla._XLAC._get_xla_tensors_hlo([loss] + [p.grad for p in net.parameters()])


for remat in (False, True):
    hlo = trace(family.config("tiny", remat=remat))
    out[f"remat={remat}"] = {"dots": len(re.findall(r" dot\\(", hlo)),
                             "barriers": hlo.count("opt-barrier(")}

# head_dim 128 (what the kernel is tuned for), 2 query heads on 1 KV head (GQA), 127 tokens
flash = family.config("tiny", attn_implementation="flash", hidden_size=256,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=128, length=64,
                      max_position_embeddings=128)
try:
    trace(flash)
except SpecError as e:
    out["outside"] = str(e)
hlo = trace(flash, lowering=True)
calls = re.findall(r"= (\\([^)]*\\)|\\S+) custom-call\\(.*custom_call_target=\\"tpu_custom_call\\"",
                   hlo)  # each call's result types
out["flash"] = {"tpu_custom_calls": [re.findall(r"\\w+\\[[\\d,]*\\]", c) for c in calls],
                "manual_sharding": hlo.count("SPMDFullToShardShape")}
out["executed"] = met.counter_value("ExecuteComputation") or 0
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def traced():
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", TRACE], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_remat_on_xla_recomputes_behind_an_optimization_barrier(traced):
    plain, remat = traced["remat=False"], traced["remat=True"]
    assert plain["barriers"] == 0
    assert remat["barriers"] == 2  # torch_xla's checkpoint: one per decoder layer
    # Each layer's forward runs again in the backward: 9 matmuls (q, k, v, o, gate, up, down,
    # QK^T, AV), less down_proj, whose output only feeds the layer's output, which the backward
    # never reads: 2 layers x 8 more dots.
    assert remat["dots"] == plain["dots"] + 2 * 8


def test_flash_traces_to_tpu_kernels_partitioned_and_nothing_runs(traced):
    assert traced["outside"].startswith("attn_implementation='flash': flash attention runs on "
                                        "a TPU; on XLA:CPU it can only be traced")
    assert "XLA:CPU" in traced["outside"]
    # 2 layers x (forward: o, l, m; backward: dq; backward: dk, dv), each over the batch of 8
    # split 8 ways: (batch 1, 2 heads, 127 tokens padded to 128, head_dim 128 or l/m's 128 lanes).
    calls = traced["flash"]["tpu_custom_calls"]
    assert sorted(len(c) for c in calls) == [1, 1, 2, 2, 3, 3], calls
    assert {t for c in calls for t in c} == {"f32[1,2,128,128]"}
    assert traced["flash"]["manual_sharding"] > 0
    assert traced["executed"] == 0


def test_the_tpu_traces_causal_mask_gives_transformers_logits():
    """The TPU compile's trace passes a 4-D causal mask (no index gather for libtpu to trip on):
    the same logits as the 2-D mask Transformers expands itself."""
    from tpu_workbench.models import get_model

    family = get_model("hf:llama")
    torch.manual_seed(0)
    model = family.build(family.config("tiny"))
    idx = torch.randint(10, (4, 11))
    want = model(idx)
    model.dense_causal_mask = True
    assert torch.equal(model(idx), want)
