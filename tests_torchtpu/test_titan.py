"""TorchTitan 0.3.0 through the workbench, in .venv-torchtpu (no chip): every name and field the
launcher relies on exists in the installed release, the command line it makes lands where it
should in TorchTitan's own config, and one FSDP2 run over two gloo ranks streams its records,
learns (held-out loss falls) and holds the shards a hand count says.

FSDP2 vs TP vs 2D over 30 steps, and their first losses, are in ``scripts/bench_titan.py``
(minutes: four ranks on two cores)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from tpu_workbench.environment import torchtpu
from tpu_workbench.titan import config as tc
from tpu_workbench.titan import runs
from tpu_workbench.titan import spec as ts
from tpu_workbench.worker import titan as worker_titan

# TorchTitan's Llama 3 debugmodel, counted by hand: embeddings and output 2048 x 256 each, the
# final norm 256; per layer q/k/v 256 x 768 (16 heads, 16 kv heads) and out 256 x 256, the
# gated MLP 3 x 256 x 768, two norms 2 x 256.
DEBUG_PARAMS = 2 * 2048 * 256 + 256 + 6 * (256 * 768 + 256 * 256 + 3 * 256 * 768 + 2 * 256)


def test_debug_model_count_by_hand():
    assert DEBUG_PARAMS == 6_163_712


def _fields(obj, prefix=""):
    """Every leaf field path of a TorchTitan config (dataclasses, lists, optimizer kwargs)."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _fields(getattr(obj, f.name), f"{prefix}{f.name}.")
    elif isinstance(obj, list) and obj and dataclasses.is_dataclass(obj[0]):
        for i, item in enumerate(obj):
            yield from _fields(item, f"{prefix}{i}.")
    elif isinstance(obj, dict):
        for key in obj:
            yield f"{prefix}{key}"
    yield prefix[:-1]


def test_what_the_launcher_relies_on_is_in_this_torchtitan():
    """A release that renames or moves any of it fails here, not in a user's run."""
    assert ts.require_titan() == ts.SUPPORTED_VERSION
    missing = {}
    for name in worker_titan.RELIES_ON:
        try:
            torchtpu.lookup(name)
        except Exception as exc:
            missing[name] = f"{type(exc).__name__}: {exc}"
    assert missing == {}
    from torchtitan.models.llama3 import config_registry, llama3_configs

    default = config_registry.llama3_debugmodel()
    have = set(_fields(default))
    wanted = {where for section in tc.KEYS.values() for kind, where, _ in section.values()
              if kind == "arg"}
    wanted |= {"hf_assets_path", "dump_folder", "dataloader.dataset",
               "validator.dataloader.dataset", "validator.freq", "metrics.log_freq",
               "debug.seed", "parallelism.spmd_backend", "override.imports"}
    assert wanted - have == set()
    for flavor, function in tc.REGISTRY.items():
        assert callable(getattr(config_registry, function)), function
        model = llama3_configs[flavor](attn_backend="flex")
        layer = model.layers[0]
        shape = tc.FLAVORS[flavor]
        assert (model.dim, len(model.layers), model.vocab_size) == (
            shape.dim, shape.layers, shape.vocab), flavor
        assert layer.feed_forward.w1.out_features == shape.ffn_hidden, flavor
        heads = layer.attention.n_heads
        assert (heads, layer.attention.n_kv_heads or heads) == (shape.heads, shape.kv_heads), \
            flavor  # None: as many kv heads as heads


def test_the_command_line_lands_in_torchtitans_config(tmp_path):
    """TorchTitan's own parser reads the launcher's command line of the 70B TOML: the values
    the TOML names arrive in the fields TorchTitan trains with."""
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.activation_checkpoint import FullAC

    spec = ts.TitanSpec(config=tc.read("llama3_70b").text, config_name="llama3_70b", ranks=16,
                        steps=7, seed=3, global_batch=16)
    config = ConfigManager().parse_args(ts.command(spec, str(tmp_path), str(tmp_path / "out")))
    assert (config.training.seq_len, config.training.local_batch_size,
            config.training.global_batch_size, config.training.steps) == (8192, 8, 16, 7)
    assert (config.parallelism.tensor_parallel_degree,
            config.parallelism.data_parallel_shard_degree) == (8, 2)
    assert config.optimizer.param_groups[0].optimizer_kwargs["lr"] == 1.5e-4
    assert isinstance(config.activation_checkpoint, FullAC.Config)
    assert config.debug.seed == 3 and config.validator.enable and config.validator.freq == 7
    assert config.override.imports == ["tpu_workbench.worker.titan_overrides.causal_sdpa"]
    assert config.model_spec.flavor == "70B"


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    seen = []
    t0 = time.monotonic()
    result = runs.titan(ranks=2, dp_shard=2, steps=3, seq_len=64,
                        out_dir=tmp_path_factory.mktemp("results"),
                        on_record=lambda r: seen.append((time.monotonic() - t0, r)))
    return result, seen, time.monotonic() - t0


def test_fsdp2_run_streams_its_steps_and_learns(fsdp_run):
    result, seen, wall = fsdp_run
    steps = [r for _, r in seen if r.get("kind") == "step"]
    assert [r["step"] for r in steps] == [0, 1, 2]
    assert seen[0][0] < wall  # records arrived while the gang ran, not only at its end
    for rec in steps:
        assert len(rec["rank_wall_ms"]) == 2 and all(ms > 0 for ms in rec["rank_wall_ms"])
        assert rec["strategy"] == "FSDP2 2"
    s = result.summary
    assert s["n_params"] == DEBUG_PARAMS and s["dist_backend"] == "gloo"
    assert s["heldout_last"] < s["heldout_first"]  # held-out text, after step 1 and step 3
    assert s["final_loss"] < s["first_loss"]
    frame = result.steps  # the results folder has what any run's has
    assert list(frame["step"]) == [0, 1, 2] and (result.out_dir / "steps.csv").is_file()
    assert (result.out_dir / "summary.json").is_file()


def test_fsdp2_holds_half_the_state_on_each_rank(fsdp_run):
    result, _, _ = fsdp_run
    last = result.steps.iloc[-1]
    # fp32 weights, gradients and Adam's two moments of half the parameters per rank (FSDP2
    # pads a parameter's first dim to a multiple of 2: at most a row each)
    for key, per_param in (("rank_param_bytes", 4), ("rank_grad_bytes", 4),
                           ("rank_optimizer_bytes", 8)):
        for got in last[key]:
            assert got == pytest.approx(DEBUG_PARAMS * per_param / 2, rel=0.01), key
    memory = runs.memory_frame([result])
    estimate = memory[memory["source"] == "estimate"]["bytes"].sum()
    assert estimate == pytest.approx(DEBUG_PARAMS * 16 / 2)
