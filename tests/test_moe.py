"""Mixture of experts (kernels/moe.py, hf:mixtral) and the strategies it brings: static
capacity routing against Transformers' own experts, the ep and fsdp_tp splits, and Mixtral tiny
on 8 virtual devices against plain PyTorch, with the all-to-all expert parallelism needs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tpu_workbench as wb
from kernels import moe
from tpu_workbench import models
from tpu_workbench import sharding as sh

pytest.importorskip("transformers")


def _experts(seed: int = 0):
    family = models.get_model("hf:mixtral")
    net = family.build(family.config("tiny"))
    experts = net.hf.model.layers[0].mlp.experts
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (experts.gate_up_proj, experts.down_proj):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return experts, g


def _route(g: torch.Generator, tokens: int, experts: int, top_k: int = 2):
    logits = torch.randn(tokens, experts, generator=g)
    weights, index = torch.topk(logits.softmax(-1), top_k, dim=-1)
    return index, weights / weights.sum(-1, keepdim=True)


def test_static_capacity_equals_transformers_experts_when_nothing_is_dropped(monkeypatch):
    experts, g = _experts()
    hidden = torch.randn(44, experts.hidden_dim, generator=g)
    index, weights = _route(g, 44, experts.num_experts)
    monkeypatch.setattr(moe, "CAPACITY_FACTOR", float(experts.num_experts))  # room for all
    experts.group_tokens = 11
    ours = moe.experts_forward(experts, hidden, index, weights)
    experts.config._experts_implementation = "eager"  # Transformers' loop over the experts
    theirs = experts(hidden, index, weights)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_tokens_beyond_an_experts_capacity_are_dropped(monkeypatch):
    experts, g = _experts(1)
    monkeypatch.setattr(moe, "CAPACITY_FACTOR", 0.5)  # 4 tokens, top-1, 4 experts: 1 slot each
    hidden = torch.randn(4, experts.hidden_dim, generator=g)
    index = torch.zeros(4, 1, dtype=torch.int64)  # every token picks expert 0
    weights = torch.ones(4, 1)
    assert moe.capacity(4, 1, 4) == 1
    experts.group_tokens = 4
    out = moe.experts_forward(experts, hidden, index, weights)
    monkeypatch.setattr(moe, "CAPACITY_FACTOR", 4.0)
    whole = moe.experts_forward(experts, hidden, index, weights)
    torch.testing.assert_close(out[0], whole[0])  # the first in the queue is served
    assert out[1:].abs().max() == 0 and whole[1:].abs().min() > 0  # the others dropped


def test_a_group_is_the_models_when_it_divides_the_tokens_else_a_fixed_size_never_the_batch():
    assert moe.group_of(2 * 8191, 8191) == 8191  # the model's own sequences
    # a traced step's 8192-token sequences under a model trained at 8191 (a prime): groups of
    # GROUP_TOKENS, not one group of the whole batch (whose routing tensors grow with its square)
    assert moe.group_of(8 * 8192, 8191) == moe.GROUP_TOKENS
    assert moe.group_of(44, None) == 44  # nothing divides: all of them


def test_ep_and_fsdp_tp_partition_specs():
    specs = sh.plan("hf:mixtral", "tiny", (2, 4), "ep").set_index("tensor")["partition"]
    experts = "hf.model.layers.0.mlp.experts."
    assert specs[experts + "gate_up_proj"] == "('model', 'data', None)"  # experts on model
    assert specs[experts + "down_proj"] == "('model', 'data', None)"
    assert specs["hf.model.layers.0.self_attn.q_proj.weight"] == "(('data', 'model'), None)"
    tp = sh.plan("hf:llama", "tiny", (2, 4), "fsdp_tp").set_index("tensor")["partition"]
    assert tp["hf.model.layers.0.self_attn.q_proj.weight"] == "('model', 'data')"
    assert tp["hf.model.layers.0.self_attn.o_proj.weight"] == "('data', 'model')"
    assert sh.batch_ways("ep", (2, 4)) == 8 and sh.batch_ways("fsdp_tp", (2, 4)) == 2


@pytest.mark.parametrize("model, mesh, message", [
    ("hf:llama", (2, 4), "strategy 'ep' splits a mixture-of-experts layer's experts, but "
                         "hf:llama has none"),
    ("hf:mixtral", (1, 8), "4 experts over the model axis of mesh 1x8, but 8 does not divide"),
])
def test_ep_refuses_models_without_experts_and_axes_that_do_not_divide_them(model, mesh,
                                                                           message):
    family = models.get_model(model)
    with pytest.raises(wb.SpecError, match=message):
        sh.validate(mesh, "ep", family, family.config("tiny"), 8)


def test_mixtral_accounting_counts_the_active_experts():
    family = models.get_model("hf:mixtral")
    cfg = family.config("mixtral-8x7b")
    hf = family.hf_config(cfg)
    attention = 2 * 4096 * 4096 + 2 * 4096 * 1024
    assert family.layer_matmul_params(hf) == attention + 2 * 3 * 4096 * 14336 + 4096 * 8
    with pytest.raises(wb.SpecError, match="unknown preset 'mixtral-8x1b' for model 'hf:mixtral'; "
                                           "valid presets: tiny, mixtral-8x7b, mixtral-8x22b"):
        family.config("mixtral-8x1b")


# ---------------------------------------------------------------------------------------------
# hf:mixtral tiny through the runner on XLA:CPU
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path_factory.mktemp("results")))
    pool = wb.WorkerPool(max_workers=2)
    try:
        def spec(mode, strategy=None):
            return wb.ExperimentSpec(model="hf:mixtral", preset="tiny", mode=mode, steps=3,
                                     mesh=(2, 4) if strategy else None,
                                     num_devices=8 if strategy else None, strategy=strategy,
                                     capture=("hlo",) if strategy else ())
        out = {"torch_eager": wb.run(spec("torch_eager"), pool=pool)}
        for strategy in ("ep", "fsdp_tp"):
            out[strategy] = wb.run(spec("lazy", strategy), pool=pool)
        yield out
    finally:
        for worker in pool.workers().values():
            worker.kill()
        pool.shutdown()
        mp.undo()


@pytest.mark.parametrize("strategy", ["ep", "fsdp_tp"])
def test_mixtral_sharded_matches_plain_pytorch_and_compiles_once(runs, strategy):
    cpu = runs["torch_eager"].steps["loss"].to_numpy()
    xla = runs[strategy].steps
    np.testing.assert_allclose(xla["loss"].to_numpy(), cpu, rtol=2e-3)
    assert list(xla["compiles"]) == [1, 0, 0]
    assert [r["fallbacks"] for r in runs[strategy].records if r.get("kind") == "step"] == [0] * 3


def test_expert_parallelism_moves_tokens_by_all_to_all_on_the_model_axis(runs):
    ep = sh.collectives_frame(runs["ep"])
    moves = ep[(ep["kind"] == "all-to-all") & (ep["axis"] == "model")]
    assert len(moves) >= 4 * 2  # 2 layers: to and from the experts, forward and backward
    tp = sh.collectives_frame(runs["fsdp_tp"])
    assert not ((tp["kind"] == "all-to-all") & (tp["axis"] == "model")).any()
