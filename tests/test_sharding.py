"""Sharding layouts: strategies on a 2x4 mesh of XLA:CPU devices, layouts, collectives, errors.

One module-scoped set of runs (minGPT tiny, compile mode, 3 steps) is shared by the tests: the
single-device baseline, dp and tp with their HLO captured (for the collectives), fsdp and dp_tp
without (they share one warm worker).
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd
import pytest

import tpu_workbench as wb
from tpu_workbench import sharding as sh
from tpu_workbench.charts import sharding as charts
from tpu_workbench.cli import shard as shard_cli
from tpu_workbench.runs.runner import WorkerPool

MESH = (2, 4)
DATA_GROUPS = [[0, 4], [1, 5], [2, 6], [3, 7]]
MODEL_GROUPS = [[0, 1, 2, 3], [4, 5, 6, 7]]
HLO_STRATEGIES = ("dp", "tp")


def _spec(strategy: str | None, **kw) -> wb.ExperimentSpec:
    return wb.ExperimentSpec(model="mingpt", preset="tiny", mode="compile", steps=3,
                             mesh=MESH if strategy else None, num_devices=8, strategy=strategy,
                             **kw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> RunResult for the baseline ("single") and every strategy."""
    mp = pytest.MonkeyPatch()  # the `results` fixture, for a module: results go to a tmp dir
    mp.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path_factory.mktemp("results")))
    pool = WorkerPool(max_workers=3)
    try:
        results = {"single": wb.run(_spec(None), pool=pool)}
        for strategy in ("dp", "tp", "fsdp", "dp_tp"):
            capture = ("hlo",) if strategy in HLO_STRATEGIES else ()
            results[strategy] = wb.run(_spec(strategy, capture=capture), pool=pool)
        results["fsdp_adafactor"] = wb.run(_spec("fsdp", optimizer="adafactor"), pool=pool)
        yield results
    finally:
        for worker in pool.workers().values():
            worker.kill()  # idle workers: no need to wait for a clean exit
        pool.shutdown()
        mp.undo()


# ---------------------------------------------------------------------------------------------
# Runs on the mesh
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["dp", "fsdp", "tp", "dp_tp"])
def test_sharded_losses_match_single_device(runs, strategy):
    single = runs["single"].steps["loss"].to_numpy()
    sharded = runs[strategy].steps["loss"].to_numpy()
    assert len(sharded) == len(single) == 3
    # Seen: relative differences of ~1e-6 (reduction order only); 1e-3 leaves room.
    assert sharded == pytest.approx(single, rel=1e-3), (strategy, sharded, single)
    assert runs[strategy].steps["compiles"].iloc[1:].sum() == 0  # no recompiles after step 0
    # One SPMD program per step (counted on torch_xla's replicated-execution path).
    assert list(runs[strategy].steps["executions"].iloc[1:]) == [1, 1], strategy


@pytest.mark.parametrize("strategy", ["dp", "fsdp", "tp", "dp_tp"])
def test_measured_layouts_match_prediction_for_every_tensor(runs, strategy):
    """torch_xla's per-device index ranges equal the ones computed by hand (predicted_layout)."""
    layout = sh.layout_frame(runs[strategy])
    assert set(layout["tensor_kind"]) == {"param", "input"}
    assert set(layout["device"]) == set(range(8))
    cols = ["device", "row", "col", "index", "shard_shape", "replica_id", "num_replicas"]
    for tensor, got in layout.groupby("tensor", sort=False):
        first = got.iloc[0]
        want = sh.layout_frame(sh.predicted_layout(tensor, first["shape"],
                                                   first["partition_spec"], MESH, first["dtype"]))
        assert got.sort_values("device")[cols].to_dict("records") == \
            want[cols].to_dict("records"), tensor


def test_a_layout_only_run_lays_out_what_a_trained_run_does(runs):
    """steps=0: torch_xla places the model on the mesh and reports its layout, trains nothing
    (the quickstart's layout on open) and has the very layout of the 3-step run."""
    only = wb.run(_spec("dp_tp").replace(steps=0))
    assert only.summary["steps"] == 0 and only.steps.empty
    assert not [r for r in only.records if r.get("kind") in ("step", "compile")]
    pd.testing.assert_frame_equal(sh.layout_frame(only), sh.layout_frame(runs["dp_tp"]))


def test_tp_layout_of_c_fc_weight_by_hand(runs):
    """mlp.c_fc of block 0 is column-parallel: weight [512, 128] split on rows over the model
    axis. Device d sits at mesh (row, col) = (d // 4, d % 4) (np.arange(8) reshaped to 2x4), so
    it holds rows [128 * (d % 4), 128 * (d % 4 + 1)) and all 128 columns, and the two devices
    of a column (d and d + 4) are replicas 0 and 1 of the same slice."""
    layout = sh.layout_frame(runs["tp"])
    w = layout[layout["tensor"] == "transformer.h.0.mlp.c_fc.weight"].sort_values("device")
    assert len(w) == 8
    # Tile assignment: dim 0 in 4 pieces, replicated over the last (data) tile dim of 2; piece i
    # is held by devices i and i + 4.
    assert set(w["spec"]) == {"{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"}
    k = 512 // 4
    for r in w.itertuples():
        d = r.device
        assert (r.row, r.col) == (d // 4, d % 4)
        assert r.mesh_coords == [d // 4, d % 4]
        assert r.index == [[k * (d % 4), k * (d % 4 + 1)], [0, 128]]
        assert r.shard_shape == [128, 128] and r.shard_bytes == 128 * 128 * 4
        assert r.replica_id == d // 4 and r.num_replicas == 2
        assert r.device_name == f"CPU:{d}"
    # its row-parallel partner c_proj [128, 512] is split on columns
    proj = layout[layout["tensor"] == "transformer.h.0.mlp.c_proj.weight"]
    assert set(proj["partition"]) == {"(None, 'model')"}
    # the batch is replicated under tp, split over data under dp
    x = layout[layout["tensor"] == "batch.x"]
    assert (x["index_label"] == ":, :").all() and set(x["replica_id"]) == set(range(8))
    dp = sh.layout_frame(runs["dp"])
    x = dp[dp["tensor"] == "batch.x"].sort_values("device")
    assert [r[0] for r in x["index"]] == [[0, 16]] * 4 + [[16, 32]] * 4


def _adamw_bytes_after_one_step() -> tuple[int, int]:
    """minGPT tiny's parameter bytes and what a real torch AdamW holds for them after one step
    on the CPU: the exp_avg and exp_avg_sq tensors (their nbytes; the per-tensor scalar ``step``
    counters, 4 B each, are not part of memory_per_device's optimizer figure)."""
    import torch

    from tpu_workbench.models import get_model

    family = get_model("mingpt")
    cfg = family.config("tiny")
    torch.manual_seed(0)
    model = family.build(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    family.loss(model, family.make_batch(cfg, 2, torch.Generator().manual_seed(0))).backward()
    opt.step()
    params = list(model.parameters())  # tied weights once, as the optimizer sees them
    moments = [t for p in params for name, t in opt.state[p].items()
               if name in ("exp_avg", "exp_avg_sq")]
    assert len(moments) == 2 * len(params)
    return sum(p.nbytes for p in params), sum(t.nbytes for t in moments)


def test_adafactor_state_is_made_sharded_and_counted_as_none(runs):
    """FSDP with Adafactor: its state is remade sharded (spmd.shard_optimizer_state through
    backend.optimizer_state) and trains: the same first loss as AdamW's run, then its own; the
    same parameter shards, and no moments per parameter in memory_per_device."""
    fact, adam = runs["fsdp_adafactor"], runs["fsdp"]
    losses = fact.steps["loss"].to_numpy()
    assert len(losses) == 3 and np.isfinite(losses).all()
    assert losses[0] == pytest.approx(adam.steps["loss"].iloc[0], rel=1e-5)
    assert abs(losses[-1] - adam.steps["loss"].iloc[-1]) > 1e-4
    mem, adam_mem = sh.memory_per_device(fact), sh.memory_per_device(adam)
    assert (mem["params_bytes"] == adam_mem["params_bytes"]).all()
    assert (mem["optimizer_bytes"] == 0).all()
    assert (adam_mem["optimizer_bytes"] == 2 * adam_mem["params_bytes"]).all()


def test_fsdp_divides_parameter_memory(runs):
    dp = sh.memory_per_device(runs["dp"])
    fsdp = sh.memory_per_device(runs["fsdp"])
    tp = sh.memory_per_device(runs["tp"])
    assert list(dp.columns) == sh.MEMORY_COLUMNS
    params_bytes, moments_bytes = _adamw_bytes_after_one_step()
    assert params_bytes == 4 * runs["dp"].summary["n_params"]
    assert (dp["params_bytes"] == params_bytes).all()  # replicated: every device holds all of it
    assert (dp["optimizer_bytes"] == moments_bytes).all()
    # fsdp: all but the tiny [3, 128]-like tensors split 8 ways (ragged ones are padded)
    assert (fsdp["params_bytes"] < dp["params_bytes"] / 7).all()
    assert (tp["params_bytes"] < dp["params_bytes"] / 2).all()
    # the HLO report gives XLA's per-device total for the runs that captured it
    assert dp["xla_total_bytes"].notna().all() and (dp["xla_total_bytes"] > 0).all()
    assert fsdp["xla_total_bytes"].isna().all()


def _chart_rows(spec: dict) -> list[dict]:
    return spec["datasets"][spec["data"]["name"]]


def test_sharding_charts_encode_their_fields(runs):
    """The charts' encodings name the columns they draw, and their rows hold the runs' figures
    (each expectation from the runs' step records, the layout or a real AdamW, by hand)."""
    strategies = ["dp", "tp", "fsdp", "dp_tp"]
    steady = [float(runs[s].steps["wall_ms"].iloc[1:].median()) for s in strategies]
    spec = charts.step_time_per_strategy(
        pd.DataFrame({"strategy": strategies, "steady_median_ms": steady})).to_dict()
    (bars,) = spec["layer"]  # no p10/p90 columns: no spread rule
    enc = bars["encoding"]
    assert (enc["x"]["field"], enc["y"]["field"], enc["color"]["field"]) == \
        ("strategy", "steady_median_ms", "strategy")
    assert enc["x"]["sort"] == strategies
    assert [(r["strategy"], r["steady_median_ms"]) for r in _chart_rows(spec)] == \
        list(zip(strategies, steady, strict=True))

    memory = pd.concat([sh.memory_per_device(runs[s]).assign(strategy=s) for s in HLO_STRATEGIES])
    spec = charts.memory_bars(memory).to_dict()
    assert spec["facet"]["column"]["field"] == "strategy"
    enc = spec["spec"]["layer"][0]["encoding"]
    assert (enc["x"]["field"], enc["color"]["field"]) == ("device_name", "part")
    assert (enc["y"]["field"], enc["y"]["aggregate"]) == ("mb", "sum")
    rows = _chart_rows(spec)
    assert len(rows) == len(HLO_STRATEGIES) * 8 * 4  # strategies x devices x 4 parts
    params_bytes, moments_bytes = _adamw_bytes_after_one_step()
    dp = [r for r in rows if r["strategy"] == "dp"]
    assert {r["device_name"] for r in dp} == {f"CPU:{d}" for d in range(8)}
    for part, nbytes in (("params", params_bytes), ("optimizer", moments_bytes)):
        got = [r["mb"] for r in dp if r["part"].startswith(part)]
        assert got == pytest.approx([nbytes / 1e6] * 8), part  # replicated on every device

    layout = sh.layout_frame(runs["tp"])
    spec = charts.layout_grid(layout, "transformer.h.0.mlp.c_fc.weight", MESH).to_dict()
    assert "transformer.h.0.mlp.c_fc.weight" in str(spec["title"])
    cells, labels = spec["layer"]
    assert (cells["encoding"]["x"]["field"], cells["encoding"]["y"]["field"],
            cells["encoding"]["color"]["field"]) == ("col", "row", "index_label")
    assert labels["encoding"]["text"]["field"] == "label"
    rows = sorted(_chart_rows(spec), key=lambda r: r["device"])
    # by hand, as in test_tp_layout_of_c_fc_weight_by_hand: device d at (d // 4, d % 4) holds
    # rows 128 * (d % 4) up to 128 * (d % 4 + 1) of the [512, 128] weight, replica d // 4
    assert [(r["row"], r["col"], r["index_label"], r["replica_id"]) for r in rows] == [
        (d // 4, d % 4, f"{128 * (d % 4)}:{128 * (d % 4 + 1)}, :", d // 4) for d in range(8)]


def _groups(frame: pd.DataFrame, kind: str) -> list:
    return [g for g in frame.loc[frame["kind"] == kind, "replica_groups"]]


def test_dp_all_reduces_gradients_across_the_data_axis(runs):
    coll = sh.collectives_frame(runs["dp"])
    assert list(coll.columns) == sh.COLLECTIVE_COLUMNS
    reduces = _groups(coll, "all-reduce")
    n_params = len({n for n in sh.layout_frame(runs["dp"]).query("tensor_kind == 'param'")
                    ["tensor"]})
    assert len(reduces) >= n_params  # one per gradient (+ the loss)
    assert all(g == DATA_GROUPS for g in reduces)
    assert set(coll["axis"]) == {"data"}  # nothing crosses the model axis
    grads = coll[coll["kind"] == "all-reduce"]
    assert grads["groups_text"].eq("{{0,4},{1,5},{2,6},{3,7}}").all()
    assert (grads["estimated_us"] > 0).all()


def test_tp_all_reduces_within_the_model_axis(runs):
    coll = sh.collectives_frame(runs["tp"])
    reduces = _groups(coll, "all-reduce")
    assert reduces and all(g == MODEL_GROUPS for g in reduces)
    assert "data" not in set(coll["axis"])  # the batch is replicated: no gradient all-reduce


def test_summary_and_charts_from_runs(runs):
    summary = sh.summary_frame([runs[k] for k in ("single", "dp", "tp", "fsdp", "dp_tp")])
    assert list(summary["strategy"]) == ["single", "dp", "tp", "fsdp", "dp_tp"]
    assert summary.loc[summary["strategy"] == "dp", "collectives"].iloc[0] > 0
    charts.step_time_per_strategy(summary).to_dict()
    memory = pd.concat([sh.memory_per_device(runs[s]).assign(strategy=s) for s in HLO_STRATEGIES])
    charts.memory_bars(memory).to_dict()
    colls = pd.concat([sh.collectives_frame(runs[s]).assign(strategy=s) for s in HLO_STRATEGIES])
    charts.collective_bytes(colls).to_dict()
    layout = sh.layout_frame(runs["tp"])
    spec = charts.layout_grid(layout, "transformer.h.0.mlp.c_fc.weight", MESH).to_dict()
    assert "transformer.h.0.mlp.c_fc.weight" in str(spec["title"])


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors before any worker starts or anything compiles
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def empty_pool():
    pool = WorkerPool(max_workers=1)
    yield pool
    assert pool.workers() == {}, "a worker was started for bad input"
    pool.shutdown()


def test_mesh_size_must_match_device_count(empty_pool):
    with pytest.raises(wb.SpecError, match=r"mesh 2x2 has 4 devices but num_devices=8"):
        wb.run(_spec("dp").replace(mesh=(2, 2)), pool=empty_pool)


def test_batch_not_divisible_by_the_data_axis_says_what_divides(empty_pool):
    with pytest.raises(wb.SpecError, match=r"batch_size=31 .*multiples of 2, e\.g\. 30 or 32"):
        wb.run(_spec("dp", batch_size=31), pool=empty_pool)
    # fsdp splits the batch over all 8 devices
    with pytest.raises(wb.SpecError, match=r"batch_size=30 .*multiples of 8, e\.g\. 24 or 32"):
        wb.run(_spec("fsdp", batch_size=30), pool=empty_pool)
    _spec("tp", batch_size=31).validate()  # tp replicates the batch: any size


@pytest.mark.parametrize("changes, message", [
    ({"strategy": "zero3"}, r"unknown strategy 'zero3'; valid strategies: dp, fsdp, tp, dp_tp"),
    ({"strategy": "tp", "mesh": (8,)}, r"strategy 'tp' needs a 2-D mesh \(data, model\)"),
    ({"mesh": (2, 2, 2)}, r"mesh 2x2x2 has 3 axes"),
    ({"strategy": "tp", "preset": "gpt-mini"},
     r"n_head=6 is not divisible by 4; valid model axes .*meshes 8x1, 4x2"),
])
def test_bad_strategy_or_mesh(empty_pool, changes, message):
    with pytest.raises(wb.SpecError, match=message):
        wb.run(_spec("dp").replace(**changes), pool=empty_pool)


def test_custom_partition_specs_are_checked():
    with pytest.raises(wb.SpecError, match=r"names axis 'modle', which is not in mesh 2x4; its "
                                           r"axes are 'data', 'model'"):
        sh.shard_tensor_spec("w", [512, 128], ("modle", None), (2, 4))
    with pytest.raises(wb.SpecError, match=r"has 1 entries but tensor 'w' has rank 2 "
                                           r"\(shape \[512, 128\]\)"):
        sh.shard_tensor_spec("w", [512, 128], ("model",), "2x4")
    with pytest.raises(wb.SpecError, match=r"uses mesh axis 'data' twice"):
        sh.shard_tensor_spec("w", [512, 128], ("data", "data"), "2x4")
    with pytest.raises(wb.SpecError, match=r"'model', which is not in mesh 8"):
        sh.shard_tensor_spec("w", [512, 128], ("model", None), "8")


def test_predicted_layout_of_a_ragged_split():
    """[10, 6] split ('model', 'data') on 2x4: pieces of ceil(10/4)=3 rows, the last one holds
    1 real row in a padded 3-row buffer (what torch_xla reports, see notes section 3)."""
    layout = sh.layout_frame(sh.shard_tensor_spec("w", [10, 6], ("model", "data"), "2x4"))
    assert list(layout["index_label"]) == ["0:3, 0:3", "3:6, 0:3", "6:9, 0:3", "9:10, 0:3",
                                           "0:3, 3:6", "3:6, 3:6", "6:9, 3:6", "9:10, 3:6"]
    tail = layout.iloc[3]
    assert tail["shard_shape"] == [3, 3] and tail["data_bytes"] == 3 * 4
    flat = sh.layout_frame(sh.shard_tensor_spec("b", [10, 6], (("data", "model"), None), "2x4"))
    assert list(flat["index_label"])[4:] == ["8:10, :", "10:10, :", "10:10, :", "10:10, :"]


def test_param_plan_without_running():
    plan = sh.plan("mingpt", "tiny", MESH, "tp")
    row = plan.set_index("tensor").loc["transformer.h.0.attn.c_attn.weight"]
    assert row["partition"] == "('model', None)" and row["pieces"] == 4
    assert "lm_head.weight" not in set(plan["tensor"])  # tied to transformer.wte.weight
    fsdp = sh.plan("mingpt", "tiny", MESH, "fsdp").set_index("tensor")
    assert fsdp.loc["transformer.wte.weight", "partition"] == "(None, ('data', 'model'))"
    # bytes in the parameter's own dtype: a bf16 model's weight is 2 bytes a value (the plan
    # used to say 4 whatever the dtype)
    bf16 = sh.plan("hf:llama", "tiny", MESH, "tp", options={"dtype": "bfloat16"})
    q = bf16.set_index("tensor").loc["hf.model.layers.0.self_attn.q_proj.weight"]
    assert q["dtype"] == "bfloat16" and q["bytes"] == 2 * q["params"]
    assert q["bytes_per_device"] == q["bytes"] / 4


def test_parse_mesh_and_named_meshes():
    assert sh.parse_mesh("2x4") == (2, 4) and sh.parse_mesh("8") == (8,)
    assert sh.parse_mesh("v6e-8") == (2, 4) and sh.MESHES["v6e-32"] == (4, 8)
    # the named meshes are the slice table's (data, model) meshes, not a table of their own
    assert all(sh.MESHES[n] == wb.get_slice(n).mesh_2d for n in sh.MESHES)
    for bad in ("2x", "axb", "0x4", "2x2x2"):
        with pytest.raises(wb.SpecError, match="mesh"):
            sh.parse_mesh(bad)


def test_collectives_frame_reads_explicit_and_iota_groups():
    hlo = """HloModule m, num_partitions=8

ENTRY %main.1 (p: f32[16,64]) -> f32[16,64] {
  %p = f32[16,64]{1,0} parameter(0)
  %all-reduce.1 = f32[16,64]{1,0} all-reduce(%p), channel_id=1, replica_groups={{0,4},{1,5},{2,6},{3,7}}, use_global_device_ids=true, to_apply=%add
  %ag = f32[64,64]{1,0} all-gather(%p), channel_id=2, replica_groups=[2,4]<=[8], dimensions={0}
  %rs = f32[4,64]{1,0} reduce-scatter(%p), channel_id=3, replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}, to_apply=%add
  ROOT %ar = f32[16,64]{1,0} all-reduce(%p), channel_id=4, replica_groups={}, to_apply=%add
}
"""  # noqa: E501
    frame = sh.collectives_frame(None, hlo_text=hlo, mesh_shape=MESH)
    assert list(frame["kind"]) == ["all-reduce", "all-gather", "reduce-scatter", "all-reduce"]
    assert list(frame["axis"]) == ["data", "model", "data", "all"]
    assert frame["replica_groups"].tolist()[:3] == [DATA_GROUPS, MODEL_GROUPS, DATA_GROUPS]
    assert list(frame["group_size"]) == [2, 4, 2, 8]
    # a reduce-scatter's ring moves the whole input: result x group size
    assert list(frame["buffer_bytes"]) == [16 * 64 * 4, 64 * 64 * 4, 4 * 64 * 4 * 2,
                                           16 * 64 * 4]
    # By hand (v6e: 100 GB/s per link and direction, no wrap-around on axes of 2 and 4, 1 µs
    # per hop): 4096 B over the data axis (2 chips): 2 x 1/2 x 4096 B / 1e11 B/s + 2 x 1 hop;
    # over all 8 (both axes, two links at once): 2 x 7/8 x 4096 / 2e11 + 2 x (1 + 3) hops.
    assert frame["estimated_us"].iloc[0] == pytest.approx(0.04096 + 2.0)
    assert frame["estimated_us"].iloc[3] == pytest.approx(0.03584 + 8.0)
    # The parse is kept per HLO text; each call gets its own frame, for its own mesh.
    frame["kind"] = "changed by the caller"
    again = sh.collectives_frame(None, hlo_text=hlo, mesh_shape=(8, 1))
    assert list(again["kind"])[:2] == ["all-reduce", "all-gather"]
    assert list(again["axis"]) != list(frame["axis"])


def test_cli_rejects_bad_input_before_running(tmp_path):
    parser = argparse.ArgumentParser()
    shard_cli.add_arguments(parser)
    with pytest.raises(wb.SpecError, match=r"mesh '2by4' is not a mesh shape"):
        shard_cli.shard(parser.parse_args(["--mesh", "2by4", "--out", str(tmp_path)]))
    with pytest.raises(wb.SpecError, match=r"unknown strategy 'ddp'"):
        shard_cli.shard(parser.parse_args(["--strategy", "dp,ddp", "--out", str(tmp_path)]))
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(wb.SpecError, match="not writable"):
        shard_cli.shard(parser.parse_args(["--out", str(blocker / "sub")]))
    specs = shard_cli.specs_from_args(parser.parse_args(["--strategy", "all", "--mesh", "v6e-8",
                                                  "--out", str(tmp_path)]))
    assert [s.strategy for s in specs] == ["dp", "fsdp", "tp", "dp_tp", "fsdp_tp"]
    assert all(s.device_count == math.prod(s.mesh) == 8 and s.capture == ("hlo",) for s in specs)


def test_channel_norms_follow_their_conv_under_tp():
    """ResNet under tp: a conv split on output channels, its BatchNorm's weight, bias and
    running statistics split the same way (shard_model marks every other buffer replicated, so
    no buffer changes its sharding after step 0 and the step compiles once)."""
    import torch

    from tpu_workbench.models import get_model

    family = get_model("resnet")
    with torch.device("meta"):
        model = family.build(family.config("tiny"))
    params = sh.param_specs(model, "tp", MESH)
    buffers = sh.buffer_specs(model, "tp", MESH)
    assert params["layer1.0.conv1.weight"] == ("model", None, None, None)
    assert params["layer1.0.bn1.weight"] == ("model",)
    assert buffers["layer1.0.bn1.running_mean"] == ("model",)
    assert "layer1.0.bn1.num_batches_tracked" not in buffers  # an int counter: replicated
    assert params["fc.weight"] is None  # 10 classes do not divide by 4


def test_device_holdings_lists_what_one_device_holds_by_hand():
    """Device 5 of a 2x4 mesh (row 1, column 1) with a weight split on the model axis and a
    replicated bias: it holds rows 128:256 of the weight, shared with device 1, and the whole
    bias, shared with all 8 (computed by hand from the layout rule, not by the code)."""
    layout = sh.layout_frame(
        sh.predicted_layout("w", [512, 128], ("model", None), (2, 4))
        + sh.predicted_layout("b", [512], None, (2, 4)))
    held = sh.device_holdings(layout, "CPU:5").set_index("tensor")
    assert held.loc["w", "slice held"] == "128:256, :" and held.loc["w", "devices holding it"] == 2
    assert held.loc["w", "shard_bytes"] == 128 * 128 * 4
    assert held.loc["b", "shard_bytes"] == 512 * 4 and held.loc["b", "devices holding it"] == 8
    assert list(held.index) == ["w", "b"]  # largest first
    with pytest.raises(ValueError, match="no device 'TPU:9'.*CPU:0"):
        sh.device_holdings(layout, "TPU:9")
