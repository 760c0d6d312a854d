"""TorchTitan configs read and checked without TorchTitan (``tpu_workbench.titan.config``,
``titan_spec``): the shipped Llama-3 TOMLs, their mapping onto 0.3.0's command line, and the
bad input that must fail before any rank starts (an unknown key, degrees that do not divide
the ranks, no ``.venv-torchtpu``). The runs themselves are in ``tests_torchtpu/test_titan.py``
(TorchTitan needs torch 2.13)."""

from __future__ import annotations

import pytest

from tpu_workbench.cli import main
from tpu_workbench.environment import torchtpu
from tpu_workbench.errors import SpecError
from tpu_workbench.titan import SHIPPED
from tpu_workbench.titan import config as tc
from tpu_workbench.titan import spec as ts


def test_shipped_llama3_tomls_read_as_written():
    # Expected values copied by hand from the TOML files (TorchTitan v0.2.2's own configs).
    c8 = tc.read("llama3_8b")
    assert (c8.flavor, c8.local_batch, c8.seq_len, c8.ac_mode, c8.compile) == (
        "8B", 1, 8192, "selective", False)
    assert c8.degrees == {"dp_replicate": 1, "dp_shard": -1, "cp": 1, "tp": 1, "pp": 1}
    c70 = tc.read(SHIPPED["llama3_70b"])
    assert (c70.flavor, c70.local_batch, c70.seq_len, c70.ac_mode) == ("70B", 8, 8192, "full")
    assert c70.degrees["tp"] == 8
    assert c70.get("optimizer.lr") == 1.5e-4
    debug = tc.read("debug_model")
    assert debug.flavor == "debugmodel" and debug.get("training.dataset") == "c4_test"
    assert any("selective_ac_option = '2'" in n for n in debug.notes)  # no such option in 0.3.0
    assert any(n.startswith("training.dataset = 'c4_test'") for n in debug.notes)


def test_every_toml_key_lands_on_its_torchtitan_field():
    c70 = tc.read("llama3_70b")
    degrees = tc.resolve_degrees(c70, 64)
    assert degrees == {"dp_replicate": 1, "dp_shard": 8, "cp": 1, "tp": 8, "pp": 1}
    args = tc.torchtitan_args(c70, degrees)
    assert args[:4] == ["--module", "llama3", "--config", "llama3_70b"]
    pairs = dict(zip(args[4:-1:2], args[5:-1:2], strict=False))
    assert pairs["--training.seq_len"] == "8192"
    assert pairs["--optimizer.param_groups.0.optimizer_kwargs.lr"] == "0.00015"
    assert pairs["--parallelism.data_parallel_shard_degree"] == "8"
    assert pairs["--parallelism.tensor_parallel_degree"] == "8"
    assert "--checkpoint.no_enable" in args and "--compile.no_enable" in args
    assert args[-1] == "activation-checkpoint:full"
    assert "--compile.components" in args  # a TOML list as TorchTitan's comma list
    assert args[args.index("--compile.components") + 1] == "model,loss"


@pytest.mark.parametrize("toml,words", [
    ("[training]\nseq_lenn = 128\n", ["unknown key 'seq_lenn'", "[training]", "seq_len"]),
    ("[trainin]\nseq_len = 128\n", ["unknown section [trainin]", "[training]"]),
    ("[training]\nseq_len = '128'\n", ["training.seq_len must be int", "'128'"]),
    ("[model]\nname = 'deepseek_v3'\n", ["'deepseek_v3' is not offered", "llama3"]),
    ("[model]\nflavor = '3B'\n", ["flavor '3B'", "debugmodel, 8B, 70B, 405B"]),
    ("[model]\nconverters = ['float8']\n", ["converters", "not offered"]),
    ("[activation_checkpoint]\nmode = 'sometimes'\n", ["'sometimes'", "none, selective, full"]),
    ("[training\n", ["not valid TOML"]),
])
def test_a_bad_toml_is_named_with_what_is_valid(toml, words):
    with pytest.raises(SpecError) as err:
        tc.read(toml, "mine")
    for word in words:
        assert word in str(err.value)


def test_degrees_must_multiply_to_the_ranks():
    cfg = tc.read("debug_model_cpu")
    assert tc.resolve_degrees(cfg, 4, dp_shard=2, tp=2)["dp_shard"] == 2
    assert tc.resolve_degrees(cfg, 4, tp=2)["dp_shard"] == 2  # -1: what tp leaves
    with pytest.raises(SpecError, match=r"dp_shard 3 x cp 1 x tp 2 x pp 1 = 6, not the 4 ranks"):
        tc.resolve_degrees(cfg, 4, dp_shard=3, tp=2)
    with pytest.raises(SpecError, match="does not divide 4 ranks"):
        tc.resolve_degrees(cfg, 4, tp=3)
    with pytest.raises(SpecError, match="tp=32 does not divide the debugmodel model's 16 heads"):
        tc.resolve_degrees(cfg, 32, tp=32)
    with pytest.raises(SpecError, match="multiple of the 4 data-parallel ranks"):
        tc.batch(cfg, tc.resolve_degrees(cfg, 4), global_batch=6)


def test_a_global_batch_splits_over_the_data_parallel_ranks():
    cfg = tc.read("debug_model_cpu")
    assert tc.batch(cfg, tc.resolve_degrees(cfg, 4, dp_shard=4, tp=1), 8) == (2, 8)
    assert tc.batch(cfg, tc.resolve_degrees(cfg, 4, dp_shard=1, tp=4), 8) == (8, 8)
    assert tc.batch(cfg, tc.resolve_degrees(cfg, 4, dp_shard=2, tp=2), 8) == (4, 8)
    assert tc.batch(cfg, tc.resolve_degrees(cfg, 4)) == (2, 8)  # the TOML's 2 per rank


def test_no_torchtitan_environment_is_refused_before_any_rank(tmp_path, monkeypatch):
    monkeypatch.setattr(torchtpu, "ROOT", tmp_path)  # a checkout without .venv-torchtpu
    monkeypatch.setattr(ts, "_version", lambda python: None)
    started = []
    monkeypatch.setattr("tpu_workbench.runs.runner.submit", lambda *a, **k: started.append(a))
    with pytest.raises(SpecError) as err:
        ts.titan_spec(ranks=2, dp_shard=2, steps=2)
    assert ".venv-torchtpu" in str(err.value) and "setup-torchtpu" in str(err.value)
    assert not started


def test_pipeline_parallelism_is_refused_with_why(monkeypatch):
    monkeypatch.setattr(ts, "require_titan", lambda: "0.3.0")
    with pytest.raises(SpecError, match="pipeline parallelism fails on torch 2.13"):
        ts.titan_spec(ranks=4, dp_shard=2, pp=2)


def test_cli_says_what_is_wrong_and_starts_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[parallelism]\ntensor_parallel_degre = 2\n")
    assert main(["titan", "--config", str(bad), "--ranks", "2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'tensor_parallel_degre' in [parallelism]" in err
    assert "tensor_parallel_degree" in err
    assert main(["titan", "--ranks", "4", "--dp-shard", "3", "--tp", "2",
                 "--out", str(tmp_path)]) == 2
    assert "= 6, not the 4 ranks" in capsys.readouterr().err
    assert not list(tmp_path.glob("*titan*"))  # no run folder: nothing started


def test_titan_flavors_are_the_hf_llama_presets_the_plan_compiles():
    from tpu_workbench import models
    from tpu_workbench.planning import titan as plan

    family = models.get_model(plan.MODEL)
    for flavor, preset in plan.PRESETS.items():
        c = {**family.presets[preset].hf,
             **(plan.DEBUG_OPTIONS if flavor == "debugmodel" else {})}
        shape = tc.FLAVORS[flavor]
        assert (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                c["num_key_value_heads"], c["intermediate_size"], c["vocab_size"]) == (
            shape.dim, shape.layers, shape.heads, shape.kv_heads, shape.ffn_hidden,
            shape.vocab), flavor
        assert not c.get("tie_word_embeddings"), flavor  # TorchTitan's Llama 3 has its own head


def test_a_titan_toml_becomes_a_plan_per_slice(monkeypatch):
    """TorchTitan's degrees resolved on each slice's chips (data_parallel_shard_degree -1
    fills it), mapped to the workbench's strategy, model axis and global batch."""
    import pandas as pd

    from tpu_workbench.planning import titan as plan

    calls = []

    def fake_predict(model, preset, **kw):
        calls.append((model, preset, kw))
        return pd.DataFrame([{"slice": kw["slices"][0], "fits": True}])

    monkeypatch.setattr(plan, "predict", fake_predict)
    frame = plan.titan_plan("llama3_8b", ["v6e-8", "v6e-256"])
    frame70 = plan.titan_plan("llama3_70b", ["v6e-8", "v6e-256"])
    got = [(p, kw["strategies"][0], kw["model_axis"], kw["batch_size"], kw["seq_len"],
            kw["recompute"], kw["attention"]) for _, p, kw in calls]
    assert got == [
        ("llama-3.1-8b", "fsdp", None, 8, 8192, True, "flash"),  # 1 sequence x 8 FSDP2 ranks
        ("llama-3.1-8b", "fsdp", None, 256, 8192, True, "flash"),
        ("llama-3.1-70b", "tp", 8, 8, 8192, True, "flash"),  # tp 8 takes the whole v6e-8
        ("llama-3.1-70b", "fsdp_tp", 8, 256, 8192, True, "flash"),  # 32 x 8: 8 x 32 sequences
    ]
    assert list(frame["titan_layout"]) == ["FSDP2 8", "FSDP2 256"]
    assert list(frame70["titan_layout"]) == ["TP 8", "FSDP2 32 x TP 8"]
    assert "selective activation checkpointing planned as per-block recompute" in \
        frame["titan_notes"].iloc[0]
    with pytest.raises(SpecError, match="pipeline"):
        plan.titan_plan("[parallelism]\npipeline_parallel_degree = 2\n", ["v6e-8"])


def test_a_launch_plan_runs_torchtitan_on_every_host():
    import json
    import re

    from tpu_workbench.scale.launch import launch_plan

    titan = ts.titan_spec("llama3_8b", 16, tp=4, steps=10, device="tpu", check_env=False)
    plan = launch_plan("v6e-16", "torch_tpu", "gcloud", titan=titan)
    assert len(plan.launch) == 4  # one ssh per host: each its own torchrun --node_rank
    for i, host in enumerate(plan.host_plans):
        assert f"--nnodes 4 --node_rank {i} --nproc_per_node 4" in host.command
        assert "-m tpu_workbench.worker.titan" in host.command
    job = json.loads(re.search(r"printf %s '(\{.*?\})' >", plan.host_plans[0].command)[1])
    spec = ts.TitanSpec.from_dict(job["spec"])  # what each rank reads back
    assert job["device"] == "tpu" and spec.config == "" and spec.config_name == "llama3_8b"
    assert spec.read().flavor == "8B" and spec.degrees()["tp"] == 4
    assert spec.degrees()["dp_shard"] == 4 and spec.steps == 10
    with pytest.raises(SpecError, match="--runtime torch_tpu"):
        launch_plan("v6e-16", "torch_xla", "gcloud", titan=titan)
