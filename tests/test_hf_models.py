"""Hugging Face causal LMs by config (models/hf.py): real shapes on the meta device, options, and
``hf:llama`` tiny through the runner on XLA:CPU against plain PyTorch and on a 2x4 mesh.

One module-scoped set of runs shares three warm workers (plain PyTorch, one XLA device, the
8-device SPMD runtime); the other tests build on the meta device or on the CPU only.
"""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import tpu_workbench as wb
from tpu_workbench import models
from tpu_workbench import sharding as sh

pytest.importorskip("transformers")

# Published parameter counts (the models' cards and config.json on the Hugging Face Hub).
PUBLISHED = {
    ("hf:gpt2", "gpt2"): 124_439_808,
    ("hf:llama", "llama-3.2-1b"): 1_235_814_400,
    ("hf:llama", "llama-3-8b"): 8_030_261_248,
    ("hf:llama", "llama-3.1-8b"): 8_030_261_248,
    ("hf:llama", "llama-3.1-70b"): 70_553_706_496,
    ("hf:llama", "llama-3.1-405b"): 405_853_388_800,
    ("hf:llama", "mistral-7b"): 7_241_732_096,
    ("hf:mixtral", "mixtral-8x7b"): 46_702_792_704,
    ("hf:gemma2", "gemma-2-2b"): 2_614_341_888,
    ("hf:gemma2", "gemma-2-27b"): 27_227_128_320,
    ("hf:qwen2", "qwen2.5-7b"): 7_615_616_512,
    ("hf:gemma2", "gemma-2-9b"): 9_241_705_984,
}
# Published only as a headline size: within 0.5% of it.
HEADLINE = {("hf:mixtral", "mixtral-8x22b"): 141e9, ("hf:gpt2", "gpt3-175b"): 175e9}
HF = ("hf:gpt2", "hf:llama", "hf:qwen2", "hf:gemma2")
MESH = (2, 4)


def _meta(model: str, preset: str, **options):
    family = models.get_model(model)
    cfg = family.config(preset, **options)
    with torch.device("meta"):
        return family, cfg, family.build(cfg)


# ---------------------------------------------------------------------------------------------
# Shapes, options, accounting: no worker
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model, preset", list(PUBLISHED))
def test_real_presets_have_the_published_parameter_counts(model, preset):
    _, _, net = _meta(model, preset)
    assert sum(p.numel() for p in net.parameters()) == PUBLISHED[model, preset]


@pytest.mark.parametrize("model, preset", list(HEADLINE))
def test_presets_published_as_a_headline_size_are_within_half_a_percent(model, preset):
    _, _, net = _meta(model, preset)
    assert abs(sum(p.numel() for p in net.parameters()) / HEADLINE[model, preset] - 1) < 0.005


def test_families_are_listed_and_the_registry_stays_torch_free():
    assert set(HF) <= set(wb.model_names())
    code = ("import sys, tpu_workbench.models as m; m.model_names(); "
            "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    with pytest.raises(wb.SpecError, match=r"unknown model 'hf:mistral'; valid models: .*hf:llama"):
        models.get_model("hf:mistral")


def test_a_name_with_a_colon_goes_to_the_user_module_loader(monkeypatch):
    fake = types.ModuleType("tpu_workbench.models.user")
    fake.load_family = lambda name: ("loaded", name)
    monkeypatch.setitem(sys.modules, "tpu_workbench.models.user", fake)
    assert models.get_model("tests/my_model.py:make") == ("loaded", "tests/my_model.py:make")


def test_options_override_config_and_task_fields():
    family, cfg, net = _meta("hf:llama", "tiny", num_hidden_layers=3, length=4)
    assert (cfg.hf["num_hidden_layers"], cfg.length) == (3, 4)
    assert len(net.hf.model.layers) == 3
    batch = family.make_batch(cfg, 2, torch.Generator().manual_seed(0))
    assert batch["x"].shape == (2, 7)  # 2 * length - 1 positions
    spec = wb.ExperimentSpec(model="hf:qwen2", preset="tiny", options={"hidden_size": 64})
    assert spec.validate() is spec
    rope = {"rope_type": "default"}  # LlamaConfig would add rope_theta to this very dict
    family.build(family.config("tiny", rope_parameters=rope))
    assert rope == {"rope_type": "default"}  # the options are not edited


@pytest.mark.parametrize("options, message", [
    ({"num_kv_heads": 2}, r"unknown option\(s\) \['num_kv_heads'\] for model 'hf:llama': not a "
     r"field of transformers\.LlamaConfig .*valid options: task fields length, .*config fields "
     r".*num_key_value_heads"),
    ({"hidden_size": 64.0}, r"hf:llama option hidden_size must be an int \(it is 128\), got 64\.0"),
    ({"n_digits": 20}, r"vocab_size=16 is smaller than n_digits=20"),
    ({"num_key_value_heads": 3}, r"num_key_value_heads=3 must divide num_attention_heads=8"),
    ({"attn_implementation": "flash2"}, r"attn_implementation='flash2' is not one of"),
    ({"num_hidden_layers": 0}, r"hf:llama num_hidden_layers must be a positive int, got 0"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(wb.SpecError, match=message):
        wb.ExperimentSpec(model="hf:llama", preset="tiny", options=options).validate()


def test_gqa_kv_heads_that_do_not_divide_the_model_axis_name_valid_meshes():
    spec = wb.ExperimentSpec(model="hf:llama", preset="tiny", mode="compile", steps=3, mesh=MESH,
                             num_devices=8, strategy="tp", options={"num_key_value_heads": 2})
    with pytest.raises(wb.SpecError, match=r"splits hf:llama's num_attention_heads and "
                       r"num_key_value_heads 4 ways over the model axis of mesh 2x4 .*"
                       r"num_key_value_heads=2 is not divisible by 4 \(each device holds whole "
                       r"KV heads\); .*meshes 8x1, 4x2"):
        spec.validate()


def test_flops_match_an_independent_count():
    # Llama-3-8B: the Linear weights of the built model, plus QK^T and AV over T x T by hand
    # (every family's forward pass is also counted by torch's FlopCounterMode below).
    family, cfg, net = _meta("hf:llama", "llama-3-8b")
    T, batch = 11, 8
    n = batch * T
    linear = sum(m.weight.numel() for m in net.modules() if isinstance(m, torch.nn.Linear))
    attention = 32 * 4 * n * T * 4096  # layers * 2 dots * 2 flops * tokens * T * heads*head_dim
    assert family.flops_per_step(cfg, batch) == 3 * (2 * n * linear + attention)


@pytest.mark.parametrize("model", HF)
def test_forward_matmul_flops_match_torch_flop_counter(model):
    family = models.get_model(model)
    cfg = family.config("tiny")
    net = family.build(cfg)
    batch = family.make_batch(cfg, 2, torch.Generator().manual_seed(0))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        family.loss(net, batch)
    assert counter.get_total_flops() == family.forward_matmul_flops(cfg, 2)


def test_tied_embedding_survives_a_move():
    """Module.to() across tensor types unties shared parameters; CausalLM ties them again."""
    family = models.get_model("hf:gemma2")
    net = family.build(family.config("tiny")).to("meta")
    assert net.hf.lm_head.weight is net.hf.model.embed_tokens.weight
    assert "hf.lm_head.weight" not in dict(net.named_parameters())


def test_tp_rules_for_llama_and_gpt2_conv1d():
    llama = sh.plan("hf:llama", "tiny", MESH, "tp").set_index("tensor")["partition"]
    layer = "hf.model.layers.0."
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
                 "mlp.up_proj"):
        assert llama[f"{layer}{name}.weight"] == "('model', None)", name  # column-parallel
    for name in ("self_attn.o_proj", "mlp.down_proj"):
        assert llama[f"{layer}{name}.weight"] == "(None, 'model')", name  # row-parallel
    assert llama["hf.model.embed_tokens.weight"] == "('model', None)"  # vocab-parallel
    assert "hf.lm_head.weight" not in llama  # tied: planned once, as the embedding
    # GPT-2's Conv1D stores [in, out]: column-parallel splits dim 1, row-parallel dim 0.
    gpt2 = sh.plan("hf:gpt2", "tiny", MESH, "tp").set_index("tensor")["partition"]
    block = "hf.transformer.h.0."
    assert gpt2[f"{block}attn.c_attn.weight"] == "(None, 'model')"
    assert gpt2[f"{block}attn.c_attn.bias"] == "('model',)"
    assert gpt2[f"{block}mlp.c_proj.weight"] == "('model', None)"
    assert gpt2[f"{block}mlp.c_proj.bias"] == "replicated"


def test_preset_table_lists_config_fields():
    table = models.preset_table("hf:qwen2").set_index("preset")
    assert table.loc["qwen2.5-7b", "params"] == PUBLISHED["hf:qwen2", "qwen2.5-7b"]
    assert table.loc["qwen2.5-7b", "num_key_value_heads"] == 4


# ---------------------------------------------------------------------------------------------
# hf:llama tiny through the runner on XLA:CPU
# ---------------------------------------------------------------------------------------------
def _spec(mode: str, steps: int, strategy: str | None = None) -> wb.ExperimentSpec:
    return wb.ExperimentSpec(model="hf:llama", preset="tiny", mode=mode, steps=steps,
                             mesh=MESH if strategy else None, num_devices=8 if strategy else None,
                             strategy=strategy)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path_factory.mktemp("results")))
    pool = wb.WorkerPool(max_workers=3)
    try:
        out = {mode: wb.run(_spec(mode, 4), pool=pool)
               for mode in ("torch_eager", "lazy", "compile")}
        for strategy in ("tp", "dp_tp"):
            out[strategy] = wb.run(_spec("compile", 3, strategy), pool=pool)
        yield out
    finally:
        for worker in pool.workers().values():
            worker.kill()  # idle workers: no need to wait for a clean exit
        pool.shutdown()
        mp.undo()


@pytest.mark.parametrize("mode", ["lazy", "compile"])
def test_llama_on_xla_matches_plain_pytorch_and_compiles_once(runs, mode):
    xla = runs[mode].steps
    cpu = runs["torch_eager"].steps["loss"].to_numpy()
    np.testing.assert_allclose(xla["loss"].iloc[0], cpu[0], rtol=1e-4)
    np.testing.assert_allclose(xla["loss"].to_numpy(), cpu, rtol=5e-3)
    # One graph per step, compiled at step 0 and never again (compile mode runs after lazy in
    # the same warm worker and may find the same graph in its cache: 0 compiles then).
    compiles = list(xla["compiles"])
    if mode == "lazy":  # the first XLA run in its worker: no .item() cuts the step in two
        assert compiles[0] == 1, compiles
    assert compiles[0] <= 1 and sum(compiles[1:]) == 0, compiles
    assert [r["fallbacks"] for r in runs[mode].records if r.get("kind") == "step"] == [0] * 4


@pytest.mark.parametrize("strategy", ["tp", "dp_tp"])
def test_llama_sharded_losses_match_one_device(runs, strategy):
    single = runs["compile"].steps["loss"].to_numpy()[:3]
    sharded = runs[strategy].steps
    assert sharded["loss"].to_numpy() == pytest.approx(single, rel=1e-3)
    assert sharded["compiles"].iloc[1:].sum() == 0
    assert runs[strategy].summary["n_params"] == runs["compile"].summary["n_params"]


def test_llama_tp_layout_measured_equals_planned(runs):
    """What torch_xla holds per device of layer 0 and the embedding equals the plan's split."""
    layout = sh.layout_frame(runs["tp"])
    plan = sh.plan("hf:llama", "tiny", MESH, "tp").set_index("tensor")["partition"]
    cols = ["device", "row", "col", "index", "shard_shape", "replica_id", "num_replicas"]
    checked = 0
    for tensor, got in layout.groupby("tensor", sort=False):
        if not tensor.startswith(("hf.model.layers.0.", "hf.model.embed_tokens")):
            continue
        first = got.iloc[0]
        assert str(first["partition"]) == plan[tensor], tensor
        want = sh.layout_frame(sh.predicted_layout(tensor, first["shape"],
                                                   first["partition_spec"], MESH, first["dtype"]))
        assert got.sort_values("device")[cols].to_dict("records") == \
            want[cols].to_dict("records"), tensor
        checked += 1
    assert checked == 10  # embedding, q, k, v, o, gate, up, down, two norms


def test_the_editable_fields_are_the_config_classes_own():
    """GPT-2's config answers to num_hidden_layers but its field is n_layer: the your_model
    notebook offered the common names, and an edit became an unknown option."""
    family = models.get_model("hf:gpt2")
    fields = family.editable_fields(family.config("tiny"))
    assert fields == {"n_embd": 128, "n_head": 4, "n_layer": 2}
    assert family.transformer_shape(family.config("tiny", n_layer=3)).layers == 3
    llama = models.get_model("hf:llama")
    llama = llama.editable_fields(llama.config("tiny"))
    assert llama["num_key_value_heads"] == 4 and llama["intermediate_size"] == 256
