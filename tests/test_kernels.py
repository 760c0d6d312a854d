"""The Pallas kernels in `kernels/` against their PyTorch references, in TPU interpret mode on
CPU: f32 and bf16, shapes that are and are not multiples of the blocks; block sizes the TPU
cannot take are refused before tracing; the schedule the tiling pictures come from; the
compiled kernel lowers to a tpu_custom_call; minGPT's attention option."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kernels import check, lowering, tiling, torch_bridge
from kernels.flash_attention import attention_reference, check_attention_blocks
from kernels.rmsnorm import check_rmsnorm_blocks, rmsnorm_reference


def _attention_f64(q, k, v, causal: bool, scale: float | None = None, see_ahead: int = 0):
    """Attention by hand in float64: softmax(q k^T * scale) v, written out (no SDPA); causal
    hides key j from query i when j > i + see_ahead (0: SDPA's top-left aligned mask)."""
    q, k, v = (t.double() for t in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(q.shape[-2])[:, None]
        j = torch.arange(k.shape[-2])[None, :]
        s = s.masked_fill(j > i + see_ahead, float("-inf"))
    p = (s - s.amax(-1, keepdim=True)).exp()
    return (p / p.sum(-1, keepdim=True)) @ v


def _rmsnorm_f64(x, w, eps: float = 1e-6):
    """RMSNorm by hand in float64: x / sqrt(mean(x^2) + eps) * w."""
    x, w = x.double(), w.double()
    return x / (x.square().sum(-1, keepdim=True) / x.shape[-1] + eps).sqrt() * w


def test_references_match_float64_by_hand():
    """The references every kernel is checked against are right, by an independent float64
    computation (causal self-attention, cross-attention with kv_len != q_len, RMSNorm)."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 19, 16, generator=gen) for _ in range(3))
    assert check.relative_error(attention_reference(q, k, v, True),
                                _attention_f64(q, k, v, True)) < 1e-6
    kv = [torch.randn(2, 3, 33, 16, generator=gen) for _ in range(2)]
    assert check.relative_error(attention_reference(q, *kv, False, sm_scale=0.3),
                                _attention_f64(q, *kv, False, scale=0.3)) < 1e-6
    x, w = torch.randn(5, 7, 96, generator=gen), torch.randn(96, generator=gen)
    assert check.relative_error(rmsnorm_reference(x, w), _rmsnorm_f64(x, w)) < 1e-6


def test_tolerances_pass_rounding_and_fail_a_subtle_bug():
    """What the check's tolerances let through, against float64 by hand: bfloat16's is above the
    error of rounding an exact result to bf16 (at most 2**-8 relative: 8 significant bits) and
    below an off-by-one causal mask; float32's passes the kernel and fails it with its softmax
    scale 1% off."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 24, 32, generator=gen, dtype=torch.float64) for _ in range(3))
    exact = _attention_f64(q, k, v, causal=True)
    bf16 = check.TOLERANCE["bfloat16"]
    assert check.relative_error(exact.to(torch.bfloat16), exact) <= 2**-8 < bf16
    off_by_one = _attention_f64(q, k, v, causal=True, see_ahead=1)
    assert check.relative_error(off_by_one.to(torch.bfloat16), exact) > bf16
    f32 = check.TOLERANCE["float32"]
    q32, k32, v32 = (t.float() for t in (q, k, v))
    kernel = torch_bridge.flash_attention(q32, k32, v32, causal=True)
    assert check.relative_error(kernel, exact) < f32
    wrong_scale = torch_bridge.flash_attention(q32, k32, v32, causal=True,
                                               sm_scale=1.01 / math.sqrt(32))
    assert check.relative_error(wrong_scale, exact) > f32
    x, w = torch.randn(37, 96, generator=gen), torch.randn(96, generator=gen)
    assert check.relative_error(torch_bridge.rmsnorm(x, w, block_rows=16), _rmsnorm_f64(x, w)) \
        < f32


def test_rmsnorm_matches_reference():
    table = check.check_rmsnorm()
    assert len(table) == 2 * len(check.RMSNORM_CASES)
    assert any(math.prod(shape[:-1]) % rows for shape, rows in check.RMSNORM_CASES)  # ragged
    assert table["ok"].all(), table.to_string()


def test_flash_attention_matches_reference():
    table = check.check_attention()
    assert len(table) == 2 * len(check.ATTENTION_CASES)
    lengths = [(c[0][2], c[1], c[3], c[4]) for c in check.ATTENTION_CASES]
    assert any(q % bq or kv % bk for q, kv, bq, bk in lengths)  # ragged shapes are covered
    assert table["ok"].all(), table.to_string()


def test_jax_entry_points_match_the_references():
    import jax.numpy as jnp

    from kernels.flash_attention import flash_attention
    from kernels.rmsnorm import rmsnorm

    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 13, 64, generator=gen), torch.randn(64, generator=gen)
    y = rmsnorm(jnp.asarray(x.numpy()), jnp.asarray(w.numpy()), block_rows=16)
    assert check.relative_error(np.asarray(y), rmsnorm_reference(x, w)) < 1e-5
    q, k, v = (torch.randn(2, 40, 32, generator=gen) for _ in range(3))
    out = flash_attention(*(jnp.asarray(t.numpy()) for t in (q, k, v)), causal=True, block_q=16)
    assert check.relative_error(np.asarray(out), attention_reference(q, k, v, True)) < 1e-5


@pytest.mark.parametrize("kwargs, match", [
    (dict(block_q=12, block_k=128), r"block_q=12 is not a multiple of 8"),
    (dict(block_q=8, block_k=64), r"block_k=64 is not a multiple of 128"),
    (dict(block_q=0, block_k=128), r"block_q must be a positive int, got 0"),
])
def test_attention_rejects_bad_blocks_before_tracing(kwargs, match, monkeypatch):
    monkeypatch.setattr(torch_bridge, "flash_attention_call", _never_traced)
    q = torch.randn(1, 1, 40, 32)
    with pytest.raises(ValueError, match=match):
        torch_bridge.flash_attention(q, q, q, **kwargs)


def test_bf16_needs_16_row_blocks_and_head_dim_rule():
    with pytest.raises(ValueError, match=r"block_q=8 is not a multiple of 16.*bfloat16"):
        check_attention_blocks((2, 64, 32), (2, 64, 32), torch.bfloat16, 8, 128)
    with pytest.raises(ValueError, match=r"head_dim=192 must be <= 128 or a multiple of 128"):
        check_attention_blocks((2, 64, 192), (2, 64, 192), torch.float32, 8, 128)
    with pytest.raises(ValueError, match=r"block_rows=24 is not a multiple of 16"):
        check_rmsnorm_blocks((10, 64), torch.bfloat16, 24)


def test_rmsnorm_rejects_bad_blocks_before_tracing(monkeypatch):
    monkeypatch.setattr(torch_bridge, "rmsnorm_call", _never_traced)
    with pytest.raises(ValueError, match=r"block_rows=10 is not a multiple of 8.*valid values"):
        torch_bridge.rmsnorm(torch.randn(20, 64), torch.randn(64), block_rows=10)


def _never_traced(*args, **kwargs):
    raise AssertionError("the kernel was built although the blocks are invalid")


def test_attention_schedule_follows_the_kernel():
    s = tiling.attention_schedule(200, 200, 64, 128, causal=True)
    q = s[s["operand"] == "Q"]
    assert len(q) == 4 * 2  # 4 q blocks (200 -> 256 rows) x 2 kv blocks
    # causal: kv block 1 (keys 128..255) is skipped for q blocks 0 and 1 (queries < 128)
    skipped = q[~q["computes"]][["q_block", "kv_block"]].values.tolist()
    assert skipped == [[0, 1], [1, 1]]
    k = s[s["operand"] == "K"]
    assert (k[~k["computes"]]["block"] == 0).all()  # skipped steps keep block 0: no copy
    # copies: block 0 at the start, then 1, 0, 1 for q blocks 2 and 3 (the only ones needing 1)
    assert k["fetched"].sum() == 4
    assert q["valid_end"].max() == 200 and q["row_end"].max() == 256
    full = tiling.attention_schedule(200, 200, 64, 128, causal=False)
    assert full["computes"].all()
    tiles = tiling.score_tiles(200, 200, 64, 128, causal=True)
    assert set(tiles["status"]) == {"computed", "computed, partly masked", "skipped"}
    with pytest.raises(ValueError, match="block_k=100"):
        tiling.attention_schedule(200, 200, 64, 100, causal=True)
    r = tiling.rmsnorm_schedule(37, 96, 16)
    assert r["row_end"].tolist() == [16, 32, 48] and r["valid_end"].tolist() == [16, 32, 37]


def test_attention_vmem_counts_padded_lanes_double_buffers_and_float32_scratch():
    """The page's default blocks by hand: block_q 64, block_k 128, head_dim 32, float32.
    Stored: Q and O 2 x 64 x 128 x 4 B = 64 KiB each, K and V 2 x 128 x 128 x 4 B = 128 KiB
    each, m and l 64 x 128 x 4 B = 32 KiB each, acc 64 x 128 x 4 B = 32 KiB: 480 KiB. The
    values alone (head_dim 32 lanes): 16 + 32 + 32 + 16 + 32 + 32 + 8 = 168 KiB."""
    t = tiling.attention_vmem_table(64, 128, 32, "float32").set_index("buffer")
    assert (t["bytes"] / 1024).to_dict() == {"Q": 64, "K": 128, "V": 128, "O": 64, "m": 32,
                                             "l": 32, "acc": 32}
    assert t["value_bytes"].sum() == 168 * 1024
    assert tiling.attention_vmem_bytes(64, 128, 32)["total"] == 480 * 1024
    text = tiling.vmem_text(64, 128, 32)
    assert "480 KiB" in text and "padded to 128 lanes" in text and "168 KiB" in text
    # bf16 inputs, head_dim 256 (no padding): tiles at 2 B, scratch still float32
    # 2*64*256*2 + 2*(2*256*256*2) + 2*64*256*2 + 2*(64*128*4) + 64*256*4 = 768 KiB
    assert tiling.attention_vmem_bytes(64, 256, 256, "bfloat16")["total"] == 768 * 1024
    assert "no buffer needs lane padding" in tiling.vmem_text(64, 256, 256, "bfloat16")
    with pytest.raises(ValueError, match="block_k=100"):
        tiling.attention_vmem_table(64, 100, 32)


def test_step_text_says_what_a_step_holds_and_copies():
    s = tiling.attention_schedule(200, 200, 64, 128, causal=True)
    text = tiling.step_text(s, 3)  # (q block 1, kv block 1): above the diagonal
    assert "**skipped**" in text and "K/V hold block 0" in text
    assert "Copied from HBM for this step: nothing" in text and "Of the 8 grid steps" in text
    assert "2 are skipped" in text
    assert "Copied from HBM for this step: Q, K, V" in tiling.step_text(s, 0)
    with pytest.raises(ValueError, match="valid steps are 0 to 7"):
        tiling.step_text(s, 8)


def test_error_chart_draws_an_exact_zero_apart_from_the_log_axis():
    import pandas as pd

    from tpu_workbench.charts import kernel_errors

    table = pd.DataFrame({"kernel": ["rmsnorm", "rmsnorm"], "dtype": ["float32", "bfloat16"],
                          "shape": ["(37, 96)"] * 2, "blocks": ["block_rows=16"] * 2,
                          "rel_error": [2e-7, 0.0], "tolerance": [1e-5, 1e-2]})
    spec = kernel_errors(table).to_dict()
    exact, errors = spec["hconcat"]
    # the log panel's points hold only the nonzero error; no value is clipped to a floor
    points = next(layer for layer in errors["layer"] if layer["mark"]["type"] == "point")
    datasets = spec["datasets"]
    assert [r["rel_error"] for r in datasets[points["data"]["name"]]] == [2e-7]
    assert errors["layer"][1]["encoding"]["x"]["scale"]["type"] == "log"
    # the exact one is marked in its own column (the others are drawn there transparent)
    assert exact["encoding"]["x"]["field"] == "where"
    shown = [r["dtype"] for r in datasets[exact["data"]["name"]] if r["exact"]]
    assert shown == ["bfloat16"]


def test_check_shape_is_kept_per_shape_and_measured_again_on_request():
    args = (16, 8, 128, True, "float32", 1, 32)
    assert not check.shape_checked(*args)
    first = check.check_shape(*args)
    assert first["ok"] and first["shape"] == (1, 1, 16, 32) and check.shape_checked(*args)
    assert check.check_shape(*args) is first
    again = check.check_shape(*args, reuse=False)
    assert again is not first and again["rel_error"] == first["rel_error"]  # same seed


def test_compiled_kernel_is_a_tpu_custom_call():
    text = lowering.attention_stablehlo(2, 200, 200, 64, dtype="bfloat16", block_q=64)
    calls = lowering.custom_calls(text)
    assert calls["target"].tolist() == ["tpu_custom_call"]
    assert calls["kernel_name"].tolist() == ["workbench_flash_attention"]
    assert calls["payload_bytes"].iloc[0] > 1000
    assert "tensor<2x256x64xbf16>" in calls["signature"].iloc[0]  # padded to block multiples
    assert "bytes of Mosaic MLIR bytecode" in lowering.shorten(text)
    mosaic = lowering.rmsnorm_mosaic(37, 96, dtype="float32", block_rows=16)
    assert "window_bounds = array<i64: 16, 96>" in mosaic


def test_torch_attention_is_differentiable():
    """The kernel's gradients against autograd through the float64 attention written by hand
    (not the reference its backward recomputes)."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 11, 32, generator=gen, requires_grad=True) for _ in range(3))
    out = torch_bridge.flash_attention(q, k, v, causal=True)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    exact = _attention_f64(q64, k64, v64, causal=True)
    assert check.relative_error(out, exact) < check.TOLERANCE["float32"]
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    exact_grads = torch.autograd.grad(exact, (q64, k64, v64), g.double())
    for name, a, b in zip("qkv", grads, exact_grads, strict=True):
        assert a.dtype == torch.float32 and a.shape == b.shape, name
        assert check.relative_error(a, b) < 1e-5, name
    # the causal mask reaches the gradient: the last key only influences the last query
    only_last = torch.zeros_like(out)
    only_last[..., :-1, :] = g[..., :-1, :]
    dk = torch.autograd.grad(torch_bridge.flash_attention(q, k, v, causal=True), k, only_last)[0]
    assert dk[..., -1, :].abs().max() == 0 and dk[..., :-1, :].abs().max() > 0


def test_interpret_mode_refuses_huge_grids():
    q = torch.randn(64, 8, 600, 32)
    with pytest.raises(ValueError, match=r"interpret mode would run \d+ grid steps"):
        torch_bridge.flash_attention(q, q, q, block_q=8)


def test_mingpt_attention_option():
    from tpu_workbench.errors import SpecError
    from tpu_workbench.models import get_model

    family = get_model("mingpt")
    with pytest.raises(SpecError, match=r"attention='flash' is not one of \('xla', 'pallas'\)"):
        family.config("tiny", attention="flash")
    torch.manual_seed(0)
    xla_model = family.build(family.config("tiny"))
    pallas_model = family.build(family.config("tiny", attention="pallas"))
    pallas_model.load_state_dict(xla_model.state_dict())
    batch = family.make_batch(family.config("tiny"), 2, torch.Generator().manual_seed(0))
    losses = []
    for model in (xla_model, pallas_model):
        loss = family.loss(model, batch)
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for (name, a), b in zip(xla_model.named_parameters(), pallas_model.parameters(),
                            strict=True):
        assert check.relative_error(b.grad, a.grad) < 1e-4, name


def test_pallas_on_xla_cpu_is_a_clear_error(monkeypatch):
    class FakeXlaTensor:
        device = torch.device("xla", 0)

    monkeypatch.setattr(torch_bridge, "_xla_device_kind", lambda: "CPU")
    with pytest.raises(ValueError, match=r"on xla:0 \(CPU\).*attention='xla'"):
        torch_bridge.where_kernels_run(FakeXlaTensor())  # type: ignore[arg-type]
    assert torch_bridge.where_kernels_run(torch.zeros(1)) == "interpret"
