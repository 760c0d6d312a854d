"""The one memory model of a plan (sharding.fit): the training state per convention, the
activations of a block measured in plain PyTorch (the tensors autograd saves for backward), the
logits, and the fit tables every view shows."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tpu_workbench as wb
from tpu_workbench import models
from tpu_workbench import sharding as sh
from tpu_workbench.models.base import TransformerShape


def _saved_bytes(fn, module: torch.nn.Module, *inputs: torch.Tensor) -> int:
    """Bytes autograd keeps for the backward pass of `fn(*inputs)`: every saved tensor's
    storage once, the inputs' and the module's parameters' own storage left out."""
    own = {t.untyped_storage().data_ptr() for t in (*inputs, *module.parameters())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())


class _Block(torch.nn.Module):
    """A Llama-style block, written plainly: RMSNorm, grouped-query attention (each KV head
    serves its group of query heads without being copied), SwiGLU. Each norm keeps only its
    input, as a fused norm kernel does (eager PyTorch on a CPU computes it in float32 and keeps
    those copies too: run under a checkpoint here, which keeps its input alone)."""

    def __init__(self, h: int, heads: int, kv: int, inner: int):
        super().__init__()
        self.heads, self.kv, self.d = heads, kv, h // heads
        self.norms = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(h)) for _ in "12"])
        self.q = torch.nn.Linear(h, h, bias=False)
        self.kv_proj = torch.nn.Linear(h, 2 * kv * self.d, bias=False)
        self.o = torch.nn.Linear(h, h, bias=False)
        self.gate = torch.nn.Linear(h, inner, bias=False)
        self.up = torch.nn.Linear(h, inner, bias=False)
        self.down = torch.nn.Linear(inner, h, bias=False)

    def _norm(self, x: torch.Tensor, i: int) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(F.rms_norm, x, (x.shape[-1],), self.norms[i], use_reentrant=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        g, r, d = self.kv, self.heads // self.kv, self.d
        y = self._norm(x, 0)
        q = self.q(y).view(b, s, g, r, d).permute(0, 2, 3, 1, 4).reshape(b, g, r * s, d)
        k, v = self.kv_proj(y).view(b, s, 2, g, d).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)).softmax(-1)  # (b, g, r*s, s)
        attn = (scores @ v).view(b, g, r, s, d).permute(0, 3, 1, 2, 4).reshape(b, s, h)
        x = x + self.o(attn)
        y = self._norm(x, 1)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


def test_a_gqa_swiglu_blocks_activations_are_what_autograd_keeps():
    """Measured on a block written here (no model code of the workbench's), in bf16, with
    Llama-3-8B's proportions (inner width 3.5x, four query heads per KV head): the estimate
    counts what autograd saves, within 10%. Korthikanti's GPT constant, which the fit checks
    used to apply to every block, is a third too high here (dropout masks and a 4x MLP)."""
    h, heads, kv, inner, b, s = 256, 8, 2, 896, 2, 256
    torch.manual_seed(0)
    block = _Block(h, heads, kv, inner).to(torch.bfloat16)
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    measured = _saved_bytes(block, block, x)
    shape = TransformerShape(h, 1, heads, kv, h // heads, inner, 1000, "gated", "n_layer")
    estimate = sh.activation_bytes(shape, b, s)
    assert estimate == pytest.approx(measured, rel=0.10), (estimate, measured)
    korthikanti = s * b * h * (10 + 24) + 5 * heads * s * s * b  # GPT, 16-bit, with dropout
    assert korthikanti / measured > 1.25


def test_minigpts_activations_are_what_autograd_keeps():
    """minGPT's own blocks (GELU, full heads), one block more measured against the estimate of
    one block: GPT-2's shape, for which the estimate is Korthikanti's without dropout."""
    family = models.get_model("mingpt")

    def saved(layers: int) -> tuple[int, TransformerShape]:
        cfg = family.config("tiny", n_layer=layers, n_embd=256, n_head=8, length=32,
                            block_size=64, vocab_size=1000, n_digits=10)
        torch.manual_seed(0)
        net = family.build(cfg).to(torch.bfloat16)
        batch = family.make_batch(cfg, 4, torch.Generator().manual_seed(0))
        return _saved_bytes(lambda x: family.loss(net, {**batch, "x": x}), net, batch["x"]), \
            family.transformer_shape(cfg)

    (one, shape), (two, _) = saved(1), saved(2)
    assert sh.activation_bytes(shape, 4, 63) == pytest.approx(two - one, rel=0.05)


def test_recomputation_keeps_each_blocks_input_and_one_block():
    shape = TransformerShape(4096, 32, 32, 8, 128, 14336, 128256, "gated", "num_hidden_layers")
    one_block = sh.activation_bytes(shape, 1, 2048) / 32
    kept = sh.activation_bytes(shape, 1, 2048, recompute=True)
    assert kept == pytest.approx(32 * 2048 * 4096 * 2 + one_block)  # bf16 block inputs
    assert sh.activation_bytes(shape, 1, 2048, tp=4) < 0.6 * one_block * 32  # most splits
    assert sh.activation_bytes(shape, 1, 2048, flash=True) < sh.activation_bytes(shape, 1, 2048)


def test_logits_are_the_two_buffers_the_tpu_compiler_allocated():
    """libtpu compiled a one-layer Llama-3-8B step (fsdp on a v6e-8, batch 32 x 2048) with two
    bf16 [32, 2048, 16032] logits buffers of 1.96 GiB each per chip (the 128,256-token
    vocabulary split 8 ways; shared/notes/tpu_compiler_offline.md). Our split is by batch (4
    sequences a chip, the whole vocabulary): the same bytes."""
    shape = TransformerShape(4096, 32, 32, 8, 128, 14336, 128256, "gated", "num_hidden_layers")
    assert sh.logits_bytes(shape, 4, 2048) == pytest.approx(2 * 1.96 * 2**30, rel=0.01)
    assert sh.logits_bytes(shape, 4, 2048, dtype="float32") == 2 * sh.logits_bytes(shape, 4, 2048)


def test_adafactor_keeps_no_moments_per_parameter_only_the_master_weights():
    """Adafactor's factored moments are a row and a column per matrix (counted as none): fp32
    training keeps 4 + 4 bytes a parameter, mixed precision 2 + 2 + 4 (fp32 master weights).
    It makes Llama-3-8B fit a v6e-4 (torchprime's published runs), which Adam does not."""
    n = 8_030_261_248
    for dtype, total in (("float32", 8), ("bfloat16", 8)):
        f = sh.fits(n, "fsdp", "4", dtype=dtype, optimizer="adafactor")
        assert f["per_device_bytes"] == pytest.approx(total * n / 4)
        assert f["optimizer_bytes"] == pytest.approx(sh.ADAFACTOR_STATE_BYTES[dtype] * n / 4)
        assert "adafactor" in f["reason"]
    assert sh.fits(n, "fsdp", "4", "v6e", "bfloat16", optimizer="adafactor")["fits"]
    assert not sh.fits(n, "fsdp", "4", "v6e", "bfloat16")["fits"]  # Adam: 32.1 GB a chip
    with pytest.raises(wb.SpecError, match="unknown optimizer 'sgd'; valid: adamw, adafactor"):
        sh.fits(n, "fsdp", "4", optimizer="sgd")
    plan = dict(slices=["v6e-4"], seq_len=8192, batch_size=8, recompute=True,
                attention="flash")  # E5's
    adam, fact = (wb.fit_check("hf:llama", "llama-3-8b", **plan, optimizer=o)
                  for o in ("adamw", "adafactor"))
    assert fact["optimizer_gb"].iloc[0] < adam["optimizer_gb"].iloc[0] / 2
    state = [(f["params_gb"] + f["grads_gb"] + f["optimizer_gb"]).iloc[0] for f in (fact, adam)]
    assert state[0] < fact["usable_gb"].iloc[0] < state[1]  # what predict's gate checks


def test_the_training_state_is_sixteen_bytes_a_parameter_either_way():
    """fp32 (4 + 4 + 8) or bf16 mixed precision as ZeRO counts it (2 + 2 + 12, Rajbhandari et
    al. 2020): the convention every view states; predict used 8, a notebook 16."""
    n = 1_300_000_000
    for dtype in ("float32", "bfloat16"):
        dp = sh.fits(n, "dp", "v6e-8", dtype=dtype)
        assert dp["fits"] and dp["per_device_bytes"] == pytest.approx(16 * n)
    fsdp = sh.fits(n, "fsdp", "v6e-8")
    assert fsdp["per_device_bytes"] == pytest.approx(16 * n / 8) and fsdp["shards"] == 8
    big = sh.fits(10 * n, "dp", "2x4")  # 208 GB per chip
    assert not big["fits"] and "fsdp would split the state 8 ways" in big["reason"]
    assert sh.fits(10 * n, "fsdp", "2x4")["fits"]  # 26 GB of 28.8 usable
    with pytest.raises(wb.SpecError, match="needs a 2-D mesh"):
        sh.fits(n, "tp", "8")
    with pytest.raises(wb.SpecError, match="dtype must be one of float32, bfloat16"):
        sh.fits(n, "dp", "8", dtype="fp8")
    assert "16 bytes per parameter" in sh.CONVENTION


def test_fit_table_plans_llama_3_8b_on_v6e_slices():
    table = sh.model_fit_table("hf:llama", "llama-3-8b", 32, 2048, recompute=True)
    n = int(table["params"].iloc[0])
    assert n == 8_030_261_248  # Meta's published count
    assert len(table) == 12 and set(table.slice) == {"v6e-8", "v6e-16", "v6e-32"}
    row = table.set_index(["slice", "strategy"])
    assert not row.loc[("v6e-8", "dp"), "fits"]  # 16 B per parameter on every chip
    fsdp8 = row.loc[("v6e-8", "fsdp")]
    assert fsdp8["per_device_gb"] == pytest.approx(
        n * 16 / 8 / 1e9 + fsdp8["activation_gb"] + fsdp8["logits_gb"])
    assert fsdp8["logits_gb"] == pytest.approx(2 * 4 * 2048 * 128256 * 2 / 1e9)  # 4 a chip
    # GQA: 8 KV heads cannot split over a model axis that does not divide them; a batch that
    # does not split over the data axis
    shape = TransformerShape(1024, 4, 12, 8, 64, 4096, 1000, "gated", "num_hidden_layers")
    odd = sh.fit_table(shape, 10**9, 30, 128, slices=["v6e-8"], strategies=["fsdp", "tp"])
    assert "does not split 8 ways" in odd.reason[0]
    gqa = sh.fit_table(TransformerShape(1024, 4, 12, 6, 64, 4096, 1000, "gated", "n"), 10**9,
                       32, 128, slices=["v6e-8"], strategies=["tp"])
    assert not gqa.fits[0] and "kv_heads=6 not divisible by the model axis 4" in gqa.reason[0]
    with pytest.raises(wb.SpecError, match="unknown TPU slice 'v6e-9'"):
        sh.fit_table(shape, 10**9, 8, 128, slices=["v6e-9"])
    assert math.isclose(row.loc[("v6e-16", "fsdp"), "usable_gb"], 28.8)


def test_a_plan_of_a_model_that_is_no_transformer_is_refused_naming_it():
    with pytest.raises(wb.SpecError, match="model 'resnet' is not a decoder-only transformer"):
        sh.model_fit_table("resnet", "resnet50", 32, 1)
    with pytest.raises(wb.SpecError, match="model 'unet' is not a decoder-only transformer"):
        wb.model_step_collectives("unet", "tiny", "v6e-8", "fsdp", 8, 16)
