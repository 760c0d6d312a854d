"""HLO explorer: parser, collectives, FLOPs (analytic and XLA's cost analysis), diff, CLI."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pandas as pd
import pytest

import tpu_workbench as wb
from tpu_workbench import hlo
from tpu_workbench.charts import hlo as hlo_charts
from tpu_workbench.cli import hlo as hlo_cli
from tpu_workbench.errors import SpecError, WorkbenchError

DATA = Path(__file__).parent / "data"
SYNTH = (DATA / "synthetic.hlo.txt").read_text()
# Written by torch_xla 2.9 SPMD on 8 XLA:CPU devices, mesh (2, 4) ("data", "model"): x[8,16]
# sharded ("data", None), fc1.weight[32,16] ("model", None), fc2.weight[16,32] (None, "model");
# loss = fc2(relu(fc1(x))).square().mean(); loss.backward(); the cpu_after_optimizations dump.
SPMD = (DATA / "spmd_tp_2x4.cpu_after_optimizations.txt").read_text()
MODEL_AXIS = [[0, 1, 2, 3], [4, 5, 6, 7]]
DATA_AXIS = [[0, 4], [1, 5], [2, 6], [3, 7]]
HAS_JAX = importlib.util.find_spec("jax") is not None


# -- parser --------------------------------------------------------------------------------------


def test_instructions_of_synthetic_module():
    df = hlo.instructions(SYNTH)
    assert list(df.columns) == hlo.COLUMNS
    assert df.attrs["modules"]["synthetic_step"]["num_partitions"] == "8"
    row = df.set_index("name")
    dot = row.loc["dot.1"]
    assert [dot[c] for c in ["opcode", "shape", "dtype", "dims", "elements", "bytes"]] == \
        ["dot", "f32[8,16]", "f32", (8, 16), 128, 512]
    assert dot["operands"] == ["x", "w"]
    assert [dot[c] for c in ["source_op", "source_file", "source_line"]] == \
        ["aten__mm", "/work/model.py", 12]
    assert bool(dot["is_entry"]) and dot["computation"] == "main.42"
    assert dot["attributes"]["lhs_contracting_dims"] == "{1}"
    assert row.loc["relu", "fusion_kind"] == "kLoop" and row.loc["relu", "called"] == ["fused_relu"]
    assert row.loc["fdot", "fusion_kind"] == "kOutput"
    assert row.loc["red", "fusion_kind"] == "kInput"
    assert row.loc["conv", "dtype"] == "bf16" and row.loc["conv", "bytes"] == 1 * 8 * 8 * 16 * 2
    root = row.loc["tuple"]
    assert bool(root["is_root"]) and root["dtype"] == "tuple" and root["dims"] is None
    assert root["bytes"] == 512 + 4 + 2048
    assert not row.loc["d", "is_entry"] and row.loc["d", "computation"] == "fused_dot"
    assert row.loc["ar-start", "replica_groups"] == "[2,4]<=[8]"
    assert row.loc["cp", "replica_groups"] == "{{0,1},{1,2},{2,3},{3,0}}"
    assert hlo.op_counts(df, "entry")["fusion"] == 3


def test_shapes_names_without_percent_and_comments():
    text = textwrap.dedent("""\
        HloModule plain

        ENTRY main {
          p = f32[4]{0} parameter(0)
          t = (f32[4]{0}, /*index=1*/s32[], pred[2,2]{1,0}) tuple(p, p, p)
          ROOT n = f32[4]{0} negate(p)
        }
        """)
    df = hlo.instructions(text).set_index("name")
    assert df.loc["n", "operands"] == ["p"] and bool(df.loc["n", "is_root"])
    assert df.loc["t", "bytes"] == 16 + 4 + 4 and df.loc["t", "elements"] == 4 + 1 + 4
    assert hlo.shape_info("f32[<=8,128]{1,0:T(8,128)}") == ("f32", (8, 128), 1024, 4096)


def test_replica_group_forms():
    assert hlo.parse_replica_groups("{{0,1,2,3},{4,5,6,7}}") == MODEL_AXIS
    assert hlo.parse_replica_groups("[2,4]<=[8]") == MODEL_AXIS
    assert hlo.parse_replica_groups("[4,2]<=[2,4]T(1,0)") == DATA_AXIS
    assert hlo.parse_replica_groups("[2,4]<=[4,2]T(1,0)") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert hlo.parse_replica_groups("{}") == []
    coll = hlo.collectives(SYNTH).set_index("kind")
    assert sorted(coll.index) == ["all-gather", "all-reduce", "collective-permute",
                                  "reduce-scatter"]  # the async pair counts once
    assert coll.loc["all-reduce", "replica_groups"] == MODEL_AXIS
    assert coll.loc["all-reduce", "opcode"] == "all-reduce-start"
    assert coll.loc["all-gather", "replica_groups"] == DATA_AXIS
    assert (coll.loc["all-gather", "group_size"], coll.loc["all-gather", "num_groups"]) == (2, 4)
    assert coll.loc["collective-permute", "num_groups"] == 4


def test_dot_and_convolution_flops():
    flops = hlo.dot_flops(SYNTH).set_index("name")["flops"]
    # dot 2*8*16*32 (top level and inside the kOutput fusion); conv 2*(8*8*16)*(3*3*4)
    assert flops.to_dict() == {"d": 8192.0, "dot.1": 8192.0, "conv": 73728.0}
    s = hlo.summary(SYNTH, cost=False)
    assert s["dot_flops"] == 8192 * 2 + 73728
    assert s["fusions_by_kind"] == {"kLoop": 1, "kOutput": 1, "kInput": 1}
    assert s["num_partitions"] == 8 and s["collective_count"] == 4


LOOP = """\
HloModule loop

%body (p: (s32[], f32[4,4])) -> (s32[], f32[4,4]) {
  %p = (s32[], f32[4,4]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %m = f32[4,4]{1,0} get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %mm = f32[4,4]{1,0} dot(%m, %m), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[], f32[4,4]{1,0}) tuple(%next, %mm)
}, execution_thread="main"

%cond (q: (s32[], f32[4,4])) -> pred[] {
  %q = (s32[], f32[4,4]{1,0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (a: f32[4,4]) -> (s32[], f32[4,4]) {
  %a = f32[4,4]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4,4]{1,0}) tuple(%zero, %a)
  ROOT %w = (s32[], f32[4,4]{1,0}) while(%init), condition=%cond, body=%body, \
backend_config={"known_trip_count":{"n":"3"}}
}
"""


def test_while_loop_counts_known_trip_count():
    flops = hlo.dot_flops(LOOP)
    assert flops[["name", "times", "flops"]].values.tolist() == [["mm", 3, 384.0]]
    assert hlo.parse_hlo(LOOP).computation("body").root.name == "t"  # "}, execution_thread=..."
    est = hlo.per_op_cost(LOOP, method="estimate").set_index("name")
    assert est.loc["w", "flops"] == 384 + 3 + 4  # 3 x (dot + add), 4 x the condition's compare


@pytest.mark.parametrize("text, match", [
    ("", "empty"),
    ("   \n\n", "empty"),
    ("hello world\n", "line 1 is not HLO"),
    ("HloModule m\n\nENTRY %main {\n  %p = f32[] parameter(0)\n", "never closed"),
    ("HloModule m\n\nENTRY %main {\n  this is not an instruction\n}\n", "line 4"),
    ("HloModule m, num_partitions=2\n", "no HLO computation"),
])
def test_bad_hlo_text(text, match):
    with pytest.raises(hlo.HloParseError, match=match) as info:
        hlo.instructions(text)
    assert isinstance(info.value, WorkbenchError) and isinstance(info.value, ValueError)


def test_search_memory_report_and_file_names():
    found = hlo.search(SPMD, "all-reduce(")
    assert len(found) == 4 and set(found["opcode"]) == {"all-reduce"}
    assert len(hlo.search(SYNTH, "source_line=12")) == 1
    assert len(hlo.search(SYNTH, "[unclosed")) == 0  # not a regex: searched as plain text
    report = hlo.memory_report(
        "Total bytes used: 16949074 (16.16MiB)\n\nAllocations sorted by size:\n\n"
        "   8.56MiB( 53%);    7.60MiB; allocation 406: size 8.56MiB, preallocated-temp:\n"
        "   8.81MiB( 55%);    7.35MiB; allocation 0: size 256.0KiB, parameter 16, shape "
        "|f32[512,128]| at ShapeIndex {}, maybe-live-out:\n")
    assert report["total_bytes"] == 16949074
    allocs = report["allocations"].set_index("allocation")
    assert allocs.loc[0, "size_bytes"] == 256 * 1024 and allocs.loc[0, "parameter"] == 16
    assert allocs.loc[0, "shape"] == "f32[512,128]" and allocs.loc[406, "kind"] == \
        "preallocated-temp"
    with pytest.raises(hlo.HloParseError):
        hlo.memory_report("nothing here")
    c = hlo.classify_file("module_0001.mingpt_train_step.1935.cpu_after_optimizations.txt")
    assert (c["module_id"], c["module"], c["stage"], c["backend"]) == \
        (1, "mingpt_train_step.1935", "after_optimizations", "cpu")
    c = hlo.classify_file("module_0000.tp_step.61.0001.spmd-partitioner.after_spmd-partitioning"
                          ".before_pipeline-end.txt")
    assert (c["module"], c["stage"], c["pass_index"]) == ("tp_step.61", "spmd-partitioning", 1)
    c = hlo.classify_file("module_0000.tp_step.61.0000.spmd-partitioner.after_sharding-"
                          "propagation.before_spmd-partitioning.txt")
    assert c["stage"] == "sharding-propagation"
    assert hlo.classify_file("module_0000.x.1.tpu_after_optimizations-memory-usage-report.txt"
                             )["stage"] == "memory-usage-report"
    assert hlo.classify_file("module_0000.x.ir-with-opt.ll") is None


def test_charts_from_frames():
    df = hlo.instructions(SYNTH)
    mix = hlo_charts.op_mix(df, top=5).to_dict()
    assert mix["mark"]["type"] == "bar"
    assert (mix["encoding"]["x"]["field"], mix["encoding"]["y"]["field"]) == ("count", "opcode")
    # counted by hand in synthetic.hlo.txt, all computations: 11 parameters (2 + 3 + 1 + 1 in
    # the called computations, 4 in the entry), 3 fusions, 2 each of add, dot and constant
    rows = mix["datasets"][mix["data"]["name"]]
    assert {r["opcode"]: r["count"] for r in rows} == {"parameter": 11, "fusion": 3, "add": 2,
                                                        "dot": 2, "constant": 2}
    entry = hlo_charts.op_mix(df, top=2, scope="entry").to_dict()
    assert {r["opcode"]: r["count"] for r in entry["datasets"][entry["data"]["name"]]} == \
        {"parameter": 4, "fusion": 3}
    table = hlo.fusion_table(df).set_index("name")
    assert "dot 1" in table.loc["fdot", "fused_ops"]
    cost = hlo.per_op_cost(SYNTH, method="estimate")
    assert set(cost["method"]) == {"estimate"}
    assert cost.set_index("name").loc["fdot", "flops"] == 8192 + 128  # dot + add
    spec = hlo_charts.roofline(cost, peak_flops=1e11, bandwidth=2e10).to_dict()
    roof, labels, points = spec["layer"]
    assert (roof["mark"]["type"], points["mark"]["type"]) == ("line", "circle")
    # the roof's two figures are written on it: 100 GFLOP/s and 20 GB/s
    assert [r["text"] for r in spec["datasets"][labels["data"]["name"]]] == [
        "peak 100 GFLOP/s", "20 GB/s"]
    enc = points["encoding"]
    assert (enc["x"]["field"], enc["y"]["field"], enc["color"]["field"]) == \
        ("intensity", "flops_per_s", "opcode")
    assert enc["x"]["scale"]["type"] == enc["y"]["scale"]["type"] == "log"
    ops = {r["name"]: r for r in spec["datasets"][points["data"]["name"]]}
    assert set(ops) == {"dot.1", "relu", "fdot", "red", "conv"}  # the ops with FLOPs
    # by hand, ridge 1e11 / 2e10 = 5 FLOP/byte: dot.1 does 8192 FLOPs on 3584 bytes, under the
    # ridge, so 2e10 B/s x 8192 / 3584; conv 73728 on 3712 bytes, over it: the 1e11 peak
    assert ops["dot.1"]["flops_per_s"] == pytest.approx(2e10 * 8192 / 3584)
    assert ops["dot.1"]["bound"] == "memory"
    assert (ops["conv"]["flops_per_s"], ops["conv"]["bound"]) == (1e11, "compute")
    d = hlo.diff(SYNTH, SPMD, "synthetic", "spmd")
    chart = hlo_charts.diff_chart(d).to_dict()
    assert chart["title"].startswith("op counts: spmd minus")
    enc = chart["encoding"]
    assert (enc["x"]["field"], enc["y"]["field"], enc["color"]["field"]) == \
        ("delta", "label", "more_in")
    rows = {r["label"]: r for r in chart["datasets"][chart["data"]["name"]]}
    # one all-reduce (an async start/done pair) in synthetic.hlo.txt, the SPMD file's 4
    # (test_spmd_fixture_all_reduce_replica_groups): 3 more in spmd
    ar = rows["all-reduce (collective)"]
    assert (ar["a"], ar["b"], ar["delta"], ar["more_in"]) == (1, 4, 3, "spmd")
    conv = rows["convolution"]  # only synthetic.hlo.txt has a convolution
    assert (conv["a"], conv["b"], conv["delta"], conv["more_in"]) == (1, 0, -1, "synthetic")
    assert rows["parameter"]["a"] == 11  # counted by hand above
    assert all(r["delta"] != 0 for r in rows.values())  # unchanged counts are left out
    with pytest.raises(ValueError, match="needs columns"):
        hlo_charts.roofline(pd.DataFrame({"x": [1]}), 1e9, 1e9)


# -- SPMD: the partitioned HLO's all-reduces ----------------------------------------------------


def test_spmd_fixture_all_reduce_replica_groups():
    coll = hlo.collectives(SPMD)
    assert list(coll["kind"].unique()) == ["all-reduce"] and len(coll) == 4
    groups = [g for g in coll["replica_groups"]]
    assert groups.count(MODEL_AXIS) == 1  # the row-parallel fc2's partial sums (model axis)
    assert groups.count(DATA_AXIS) == 3  # the loss and both weight gradients (data axis)
    assert set(coll["group_size"]) == {4, 2}
    s = hlo.summary(SPMD, cost=False)
    assert s["num_partitions"] == 8
    assert s["collectives"]["all-reduce"]["count"] == 4
    assert s["collectives"]["all-reduce"]["replica_groups"] == sorted(
        [MODEL_AXIS, DATA_AXIS], key=json.dumps)
    # per-device shapes: x's shard is [4,16] (8 rows over the 2-way data axis)
    assert "f32[4,16]" in set(hlo.instructions(SPMD)["shape"])


@pytest.mark.skipif(not HAS_JAX, reason="jax/jaxlib (torch-xla[pallas]) is not installed")
def test_cost_analysis_parses_after_optimization_text():
    cost = hlo.cost_analysis(SPMD)
    assert cost["flops"] > 0 and cost["bytes_accessed"] > 0
    per_op = hlo.per_op_cost(SPMD)
    assert set(per_op["method"]) == {"xla"}
    assert per_op["flops"].sum() == pytest.approx(cost["flops"], rel=1e-3)
    s = hlo.summary(SYNTH)
    assert s["xla_flops"] == pytest.approx(78847.0) and s["cost_error"] is None
    with pytest.raises(hlo.CostAnalysisError, match="could not parse"):
        hlo.cost_analysis("HloModule broken\n\nENTRY %m {\n  ROOT %x = f32[] frobnicate()\n}\n")


# -- runs on XLA: one module-scoped fixture starts them together -------------------------------
# The sharded run (its own worker: SPMD is a different runtime) and the forward-HLO subprocess
# go in the background while the lazy (through the CLI) and dynamo runs take turns in theirs,
# so the file's wall time is about the longest chain rather than the sum.

HAS_SHARDING = importlib.util.find_spec("tpu_workbench.sharding") is not None
NO_SHARDING = "tpu_workbench.sharding (mesh/strategy) is not written yet"
NO_JAX = "jax/jaxlib (torch-xla[pallas]) is not installed"

FORWARD_HLO = """
import os, sys
os.environ.update(PJRT_DEVICE="CPU", CPU_NUM_DEVICES="1")
import torch, torch_xla
from tpu_workbench.models import get_model
fam = get_model("mingpt"); cfg = fam.config("tiny")
torch.manual_seed(0)
model = fam.build(cfg).to(torch_xla.device())
x = fam.make_batch(cfg, cfg.batch_size, torch.Generator().manual_seed(0))["x"]
with torch.no_grad():
    out = model(x.to(torch_xla.device()))
open(sys.argv[1], "w").write(torch_xla._XLAC._get_xla_tensors_hlo([out]))  # before any sync
"""


def _args(tmp_path: Path, **kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    hlo_cli.add_arguments(parser)
    argv = ["--out", str(kw.pop("out", tmp_path / "out"))]
    for key, value in kw.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return parser.parse_args(argv)


class _Background(threading.Thread):
    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.value, self.error = fn, None, None
        self.start()

    def run(self):
        try:
            self.value = self.fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test that needs it
            self.error = exc

    def result(self, timeout: float = 600):
        self.join(timeout)
        if self.error is not None:
            raise self.error
        return self.value


@pytest.fixture(scope="module")
def xla_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("hlo_runs")
    runs: dict = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TPU_WORKBENCH_RESULTS", str(base / "results"))
        if HAS_JAX:
            env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "XLA_USE_SPMD")}
            runs["forward_path"] = base / "forward.hlo.txt"
            runs["forward"] = subprocess.Popen(
                [sys.executable, "-c", FORWARD_HLO, str(runs["forward_path"])], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if HAS_SHARDING:
            # dp_tp: Megatron tp over the model axis and the batch over the data axis, as in
            # the notes (plain "tp" replicates the batch: all its all-reduces are over "model")
            spec = wb.ExperimentSpec(model="mingpt", preset="tiny", mode="compile", steps=1,
                                     mesh=(2, 4), strategy="dp_tp", capture=("hlo",))
            runs["sharded"] = _Background(lambda: wb.run(spec))
        runs["lazy_out"] = base / "lazy_cli"
        runs["lazy_rc"] = hlo_cli.hlo(_args(base, out=runs["lazy_out"], model="mlp", mode="lazy",
                                        steps=2))
        runs["dynamo"] = wb.run(wb.ExperimentSpec(model="mlp", preset="tiny", mode="dynamo",
                                                  steps=2, capture=("hlo",)))
        if "sharded" in runs:
            runs["sharded"].join(600)
        yield runs
    if "forward" in runs and runs["forward"].poll() is None:
        runs["forward"].kill()


@pytest.mark.skipif(not HAS_SHARDING, reason=NO_SHARDING)
def test_real_tensor_parallel_run_replica_groups(xla_runs):
    files = hlo.load_run_hlo(xla_runs["sharded"].result())
    coll = hlo.collectives(hlo.main_module(files))
    groups = [g for g in coll.loc[coll["kind"] == "all-reduce", "replica_groups"]]
    assert MODEL_AXIS in groups, "no all-reduce over the model axis (tensor-parallel sums)"
    assert DATA_AXIS in groups, "no all-reduce over the data axis (gradients)"
    assert hlo.summary(hlo.main_module(files), cost=False)["num_partitions"] == 8


# -- must-have: minGPT tiny forward FLOPs, XLA vs analytic ---------------------------------------


@pytest.mark.skipif(not HAS_JAX, reason=NO_JAX)
def test_mingpt_tiny_forward_flops_match_analytic(xla_runs):
    from tpu_workbench.models import get_model

    proc = xla_runs["forward"]
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    text = xla_runs["forward_path"].read_text()
    fam = get_model("mingpt")
    cfg = fam.config("tiny")
    analytic = fam.forward_matmul_flops(cfg, cfg.batch_size)
    xla = hlo.cost_analysis(text)["flops"]  # all ops: matmuls + LayerNorm, softmax, GELU...
    assert xla == pytest.approx(analytic, rel=0.02)
    assert hlo.dot_flops(text)["flops"].sum() == pytest.approx(analytic, rel=1e-9)
    per_op = hlo.per_op_cost(text)  # XLA's own figure for each dot
    assert per_op.loc[per_op["opcode"] == "dot", "flops"].sum() == pytest.approx(analytic,
                                                                                  rel=1e-9)


# -- must-have: lazy vs dynamo (lazy through the CLI) ---------------------------------------------


def test_cli_writes_hlo_ops_and_summary(xla_runs):
    assert xla_runs["lazy_rc"] == 0
    out = xla_runs["lazy_out"]
    files = hlo.load_run_hlo(out)
    assert {"before_optimizations", "after_optimizations"} <= set(files["stage"])
    ops = pd.read_csv(out / "ops.csv")
    assert {"opcode", "fusion_kind", "is_entry", "bytes"} <= set(ops.columns)
    assert (ops["opcode"] == "dot").sum() >= 3  # the MLP's forward and backward matmuls
    summary = json.loads((out / "summary.json").read_text())
    main = next(m for m in summary["modules"] if m["module"] == summary["main_module"])
    assert main["after_optimizations"]["dot_flops"] > 0
    assert main["after_optimizations"]["collectives"] == {}


def test_lazy_vs_dynamo_diff_reports_split_step(xla_runs):
    lazy_texts = hlo.read_hlo(hlo.load_run_hlo(xla_runs["lazy_out"]))
    dynamo_texts = hlo.read_hlo(hlo.load_run_hlo(xla_runs["dynamo"]))
    d = hlo.diff_modules(lazy_texts, dynamo_texts, "lazy", "dynamo")
    modules = d[d["kind"] == "modules"].iloc[0]
    assert modules["a"] == 1 and modules["b"] > 1, "dynamo should split the step into modules"
    assert d.attrs == {"label_a": "lazy", "label_b": "dynamo"}
    # the same model: the matmuls are all there on both sides
    assert hlo.summary(lazy_texts, cost=False)["dot_flops"] == pytest.approx(
        hlo.summary(dynamo_texts, cost=False)["dot_flops"])


# -- must-have: bad input ------------------------------------------------------------------------


@pytest.mark.parametrize("kw, match", [
    ({"model": "nosuchmodel"}, "nosuchmodel"),
    ({"mode": "warp"}, "unknown mode 'warp'"),
    ({"mode": "torch_eager"}, "compiles no HLO"),
    ({"mesh": "2by4"}, "mesh '2by4'"),
    ({"steps": 0}, "steps"),
])
def test_cli_bad_input_fails_before_running(tmp_path, results, kw, match):
    with pytest.raises(SpecError, match=match):
        hlo_cli.hlo(_args(tmp_path, **kw))
    assert not results.exists()  # no worker ran


def test_cli_unwritable_output_folder(tmp_path, results):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    target = blocker / "out"
    with pytest.raises(SpecError, match="not writable") as info:
        hlo_cli.hlo(_args(tmp_path, out=target, model="mlp", mode="lazy"))
    assert str(target) in str(info.value)
    assert not results.exists()


def test_parse_mesh():
    assert hlo_cli.parse_mesh("2x4") == (2, 4)
    assert hlo_cli.parse_mesh("8") == (8,)
    assert hlo_cli.parse_mesh(None) is None
    for bad in ("2x", "x4", "0x8", "two"):
        with pytest.raises(SpecError, match="mesh"):
            hlo_cli.parse_mesh(bad)
