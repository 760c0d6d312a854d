"""The `tpu-workbench` command line."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tpu_workbench.environment import backends

# mlp tiny by hand: fc1 64 -> 256, fc2 256 -> 256, head 256 -> 10 (weights and biases)
MLP_PARAMS = {"fc1.weight": 256 * 64, "fc1.bias": 256, "fc2.weight": 256 * 256, "fc2.bias": 256,
              "head.weight": 10 * 256, "head.bias": 10}
MLP_BATCH = 32  # MLPConfig's default batch size


def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpu_workbench", *args], capture_output=True,
                          text=True, timeout=300, **kwargs)


def test_info_json_reports_xla_cpu_with_8_devices_and_measured_peak():
    if backends.tpu_status().available:
        pytest.skip("a TPU is attached")
    proc = _cli("info", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["backend"] == "XLA:CPU"
    assert info["device_count"] == 8
    assert info["runtime"]["device_count"] == 8 and info["runtime"]["pjrt_device"] == "CPU"
    assert info["host_peak"]["peak_flops"] > 1e8  # measured: any real CPU does > 0.1 GFLOP/s
    assert info["peak_flops"] == info["host_peak"]["peak_flops"]
    assert "no TPU chip found" in info["why_no_tpu"]
    assert info["versions"]["torch_xla"] == "2.9.0"
    assert set(info["chips"]) == {"v5e", "v6e", "v5p"}
    assert info["chips"]["v6e"]["bf16_tflops"] == 918.0


def test_info_table_is_readable():
    proc = _cli("info", "--no-probe")
    assert proc.returncode == 0, proc.stderr
    assert "peak FLOP/s" in proc.stdout and "v6e" in proc.stdout


def test_unknown_command_is_an_error():
    proc = _cli("frobnicate")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


# -- the subcommands that run experiments, once each on the smallest model -----------------------


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TPU_WORKBENCH_RESULTS": str(tmp_path / "results")}
    proc = _cli(*args, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _assert_chart(out: Path, name: str) -> None:
    """out/name.png is a whole PNG image (signature, an IHDR of nonzero size, IEND last) and
    out/name.html a Vega-Lite page."""
    data = (out / f"{name}.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", name
    assert data[12:16] == b"IHDR", name
    width, height = struct.unpack(">II", data[16:24])
    assert width > 0 and height > 0, name
    assert data[-8:-4] == b"IEND", name
    assert "vega-lite" in (out / f"{name}.html").read_text(), name


def test_bench_writes_tables_and_charts(tmp_path):
    out = tmp_path / "bench"
    proc = _run(tmp_path, "bench", "--model", "mlp", "--preset", "tiny",
                "--modes", "torch_eager,lazy", "--steps", "3", "--out", str(out))
    steps = pd.read_csv(out / "steps.csv")
    assert {"step", "wall_ms", "loss", "compiles", "cached", "compile_ms", "executions",
            "model", "preset", "mode", "run_id"} <= set(steps.columns)
    assert steps.groupby("mode", sort=False)["step"].apply(list).to_dict() == {
        "torch_eager": [0, 1, 2], "lazy": [0, 1, 2]}
    losses = {m: steps[steps["mode"] == m]["loss"].to_numpy() for m in ("torch_eager", "lazy")}
    np.testing.assert_allclose(losses["lazy"], losses["torch_eager"], rtol=1e-3)  # same training
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["mode"]) == ["torch_eager", "lazy"]
    assert {"first_step_ms", "steady_median_ms", "steady_p10_ms", "steady_p90_ms",
            "compiles_total", "items_per_s", "mfu", "final_loss"} <= set(summary.columns)
    s = summary.set_index("mode")
    assert (s["steps"] == 3).all() and (s["steady_steps"] == 2).all()
    assert (s.loc["torch_eager", "compiles_total"], s.loc["lazy", "compiles_total"]) == (0, 1)
    for mode, row in s.iterrows():  # the tables agree with each other
        mine = steps[steps["mode"] == mode].set_index("step")["wall_ms"]
        assert row["first_step_ms"] == pytest.approx(mine[0])
        assert row["steady_median_ms"] == pytest.approx(mine[[1, 2]].mean())  # median of 2
        assert row["final_loss"] == pytest.approx(steps[steps["mode"] == mode]["loss"].iloc[-1])
    compiles = pd.read_csv(out / "compiles.csv")
    assert list(zip(compiles["mode"], compiles["step"], strict=True)) == [("lazy", 0)]
    charts = ("step_times", "steady", "first_vs_steady", "compiles", "recompiles")
    for name in charts:
        _assert_chart(out, name)
    assert f"wrote {3 + 2 * len(charts)} files to {out}" in proc.stdout


def test_shard_writes_layout_memory_collectives_and_charts(tmp_path):
    out = tmp_path / "shard"
    proc = _run(tmp_path, "shard", "--model", "mlp", "--preset", "tiny", "--mesh", "2x4",
                "--strategy", "dp", "--steps", "2", "--out", str(out))
    layout = pd.read_csv(out / "layout.csv")
    assert {"strategy", "tensor", "tensor_kind", "device", "device_name", "index_label",
            "replica_id", "num_replicas"} <= set(layout.columns)
    assert set(layout["strategy"]) == {"dp"} and set(layout["device"]) == set(range(8))
    params = layout[layout["tensor_kind"] == "param"]
    assert set(params["tensor"]) == set(MLP_PARAMS)
    assert (params["num_replicas"] == 8).all()  # dp: every device holds every parameter
    assert set(params["index_label"]) == {":, :", ":"}
    x = layout[layout["tensor"] == "batch.x"].sort_values("device")
    half = MLP_BATCH // 2  # the batch split over the data axis (mesh rows)
    assert list(x["index_label"]) == [f"0:{half}, :"] * 4 + [f"{half}:{MLP_BATCH}, :"] * 4

    memory = pd.read_csv(out / "memory.csv")
    assert list(memory["device"]) == list(range(8))
    n_params = sum(MLP_PARAMS.values())  # 85,002
    assert (memory["params_bytes"] == 4 * n_params).all()
    assert (memory["optimizer_bytes"] == 8 * n_params).all()  # Adam: two fp32 moments each
    assert (memory["inputs_bytes"] == half * 64 * 4 + half * 8).all()  # x fp32 + y int64

    collectives = pd.read_csv(out / "collectives.csv")
    assert set(collectives["kind"]) == {"all-reduce"}
    assert set(collectives["groups_text"]) == {"{{0,4},{1,5},{2,6},{3,7}}"}  # the data axis
    grads = sorted(b for b in collectives["bytes"] if b > 4)  # the rest: f32[] scalars
    assert grads == sorted(4 * n for n in MLP_PARAMS.values())  # one per gradient

    summary = json.loads((out / "summary.json").read_text())
    assert summary["errors"] == {}
    (run,) = summary["runs"]
    assert (run["strategy"], run["mesh"], run["steps"]) == ("dp", "2x4", 2)
    charts = ("layout_dp", "memory", "collectives", "step_time")
    for name in charts:
        _assert_chart(out, name)
    assert f"wrote {4 + 2 * len(charts)} files to {out}" in proc.stdout


def test_cache_writes_runs_compiles_and_a_chart(tmp_path):
    out = tmp_path / "cache"
    proc = _run(tmp_path, "cache", "--model", "mlp", "--preset", "tiny", "--steps", "2",
                "--out", str(out))
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs.columns) == ["scenario", "label", "batch_size", "first_step_ms",
                                  "steady_median_ms", "compiles", "cache_hits", "cached_graphs",
                                  "compile_ms", "saved_ms", "worker_runs_before", "round"]
    assert list(runs["scenario"]) == ["cold", "warm", "miss"]
    assert list(runs["batch_size"]) == [MLP_BATCH, MLP_BATCH, 2 * MLP_BATCH]  # default: doubled
    assert list(runs["worker_runs_before"]) == [0, 1, 2]  # one worker, warm after the first
    assert runs.loc[1, "compiles"] == 0 and runs.loc[0, "compiles"] >= 1
    assert runs.loc[2, "compiles"] >= 1
    first = runs["first_step_ms"]
    # saved only where the cache served the step: the cold run and the new shape compiled
    assert runs.loc[1, "saved_ms"] == pytest.approx(first[0] - first[1])
    assert runs["saved_ms"][[0, 2]].isna().all()
    compiles = pd.read_csv(out / "compiles.csv")
    miss = compiles[compiles["scenario"] == "warm worker, new shape"]
    assert list(miss["step"]) == [0]
    assert list(miss["trigger"]) == [f"batch_size: {MLP_BATCH} -> {2 * MLP_BATCH}"]
    assert compiles[compiles["scenario"] == "warm worker, same spec"].empty
    _assert_chart(out, "cache_first_steps")
    assert f"wrote 4 files to {out}" in proc.stdout
