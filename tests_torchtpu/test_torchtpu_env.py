"""TorchTPU in its own environment, without a chip: it reports itself correctly, every name the
adapter calls exists in the installed wheel, the workbench falls back to plain PyTorch on CPU,
DTensor lays minGPT out over gloo processes, and the quickstart runs in smoke mode."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

import tpu_workbench as wb
from tpu_workbench import cli, docs, sharding
from tpu_workbench.cli import info as cli_info
from tpu_workbench.environment import torchtpu
from tpu_workbench.scale import dtensor_sharding
from tpu_workbench.worker import torchtpu as worker_tpu


def test_environment_is_torchtpu_without_torch_xla():
    v = wb.versions()
    assert v["torch"].startswith("2.13"), v
    assert v["torch_tpu"] == torchtpu.SUPPORTED_VERSION
    assert v["libtpu"] and v["torch_xla"] is None
    assert importlib.util.find_spec("torchvision") is None  # breaks beside torch 2.13


def test_status_without_a_chip():
    st = torchtpu.status()
    assert st.installed and st.where == "this environment" and st.supported
    assert st.version == "0.2.0" and st.chips == 0 and not st.available
    assert "no TPU chip" in st.reason
    assert st.fallback == torchtpu.FALLBACK and "plain PyTorch on CPU" in st.fallback
    assert wb.available_modes() == ["torch_eager", "inductor"] == wb.default_modes()


def test_info_says_installed_no_chip_and_the_fallback(capsys):
    assert cli.main(["info", "--no-probe"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("TorchTPU"))
    assert "TorchTPU 0.2.0 installed" in line and "no TPU chip found" in line
    assert "fall back to plain PyTorch on CPU" in line
    runs_instead = next(ln for ln in out.splitlines() if "runs instead" in ln)
    assert "plain PyTorch on CPU" in runs_instead and "XLA" not in runs_instead
    info = cli_info.info_dict(probe_runtime=True)  # no torch_xla: no XLA worker is started
    assert info["backend"] == "torch:cpu" and info["torch_tpu"]["installed"]
    assert info["default_backend"] == "torch:cpu"


def test_every_api_name_exists_in_the_installed_wheel():
    """Import and attribute lookup of every torch_tpu / torch.tpu name the adapter calls: an API
    drift fails here instead of in a user's TPU session."""
    assert torchtpu.missing_api() == {}


def test_the_check_catches_drift():
    missing = torchtpu.missing_api(("torch.tpu.EagerMode.DEFER_AND_FUSE_WITH_O1",
                                    "torch.backends.tpu.allow_excess_precision",
                                    "torch_tpu.api.tpu_device"))
    assert set(missing) == {"torch.tpu.EagerMode.DEFER_AND_FUSE_WITH_O1",
                            "torch.backends.tpu.allow_excess_precision",
                            "torch_tpu.api.tpu_device"}


def test_no_chip_facts_of_the_wheel():
    """What torch_tpu 0.2.0 does without a chip (documented in the README): torch.tpu is
    installed, the 'tpu' compile backend is registered, but no 'tpu' device exists."""
    import torch
    import torch._dynamo
    import torch_tpu  # noqa: F401 (installs torch.tpu; autoload is off in this test process)

    assert type(torch.tpu).__module__.startswith("torch_tpu")
    assert "tpu" in torch._dynamo.list_backends()
    assert not torch.accelerator.is_available()
    with pytest.raises(RuntimeError, match="tpu"):
        torch.device("tpu")


def test_cache_counters_and_profiler_config_run_without_a_chip(tmp_path):
    import torch_tpu  # noqa: F401

    counters = worker_tpu.CacheCounters()  # torch.tpu._get_cache_stats() answers (zeros)
    assert counters.delta() == {"compiles": 0, "cached": 0, "compile_ms": 0.0, "executions": 0}
    assert counters.summary()["source"] == "torch.tpu._get_cache_stats()"
    prof = worker_tpu.TorchTPUProfiler(tmp_path / "profile")
    assert type(prof.config()).__name__ == "TpuProfilerConfig"
    import torch

    prof.start()  # torch.profiler.profile(experimental_config=TpuProfilerConfig(...)), CPU side
    with prof.step(0):
        torch.ones(8, 8).sum()
    prof.stop()
    assert "train_step#0" in (tmp_path / "profile" / "torch.trace.json").read_text()


def test_stablehlo_capture_writes_what_the_callback_hands_back(tmp_path):
    from torch_tpu._internal.compile import TpuCompileDebug

    fields = set(TpuCompileDebug.__dataclass_fields__)
    assert set(worker_tpu.StableHLOCapture.FIELDS) <= fields

    class Debug:  # a TpuCompileDebug needs a chip to be filled in
        stablehlo_forward_text = "module @fwd {}"
        stablehlo_backward_text = None
        pre_autograd_fx_readable = "graph()"

    cap = worker_tpu.StableHLOCapture()
    cap.callback(Debug())
    assert cap.collect(tmp_path) == ["graph0.forward.stablehlo.txt", "graph0.fx.txt"]


def test_modes_give_clear_errors_here():
    with pytest.raises(wb.SpecError, match=r"torch_xla, which is not installed.*use \.venv"):
        wb.ExperimentSpec(model="mlp", mode="lazy").validate()
    with pytest.raises(wb.SpecError, match="What runs instead: plain PyTorch on CPU"):
        wb.ExperimentSpec(model="mlp", mode="tpu_compile").validate()
    with pytest.raises(wb.SpecError, match="torchvision"):
        wb.ExperimentSpec(model="resnet", mode="torch_eager").validate()


def test_dtensor_layout_over_gloo_processes():
    records = dtensor_sharding.layout("mingpt", "tiny", (1, 2), "tp", device="cpu")
    frame = sharding.layout_frame(records)
    assert list(frame.columns[:len(sharding.LAYOUT_COLUMNS)]) == sharding.LAYOUT_COLUMNS
    assert set(frame["device"]) == {0, 1} and frame["reassembled"].all()
    # DTensor's ranges are the workbench's (XLA's) ranges
    assert (frame["index"].astype(str) == frame["predicted_index"].astype(str)).all()
    fc = frame[frame["tensor"] == "transformer.h.0.mlp.c_fc.weight"].set_index("device")
    assert fc.loc[0, "spec"] == "Replicate(), Shard(dim=0)"
    assert fc.loc[0, "index_label"] != fc.loc[1, "index_label"]
    assert fc.loc[0, "shard_shape"][0] * 2 == fc.loc[0, "shape"][0]
    assert len(sharding.memory_per_device(records)) == 2
    grid = wb.charts.layout_grid(frame, "transformer.h.0.mlp.c_fc.weight", (1, 2)).to_dict()
    cells = grid["layer"][0]["encoding"]
    assert (cells["x"]["field"], cells["y"]["field"], cells["color"]["field"]) == \
        ("col", "row", "index_label")
    rows = sorted(grid["datasets"][grid["data"]["name"]], key=lambda r: r["device"])
    # by hand: the [512, 128] weight split on rows over a model axis of 2, one row of devices
    assert [(r["row"], r["col"], r["index_label"]) for r in rows] == \
        [(0, 0, "0:256, :"), (0, 1, "256:512, :")]


def test_quickstart_runs_in_smoke_mode_on_the_fallback(tmp_path, results, as_user):
    page = tmp_path / "quickstart.html"
    problems = docs.export(ROOT / "notebooks" / "quickstart.py", page, smoke=True, timeout=240)
    assert problems == []
    text = page.read_text()
    assert "plain PyTorch on CPU" in text
    assert "Skipped: this environment has no torch_xla" in text  # the HLO section
    assert "this layout comes from DTensor" in text  # the sharding section, on gloo


def test_main_env_drives_a_torchtpu_worker_in_a_dry_run(tmp_path, as_user):
    """The worker-per-runtime path: from .venv (torch 2.9 + torch_xla) a TorchTPU worker starts
    under .venv-torchtpu's interpreter. Dry run: no chip, so the worker reports a CPU device."""
    main = ROOT / ".venv" / "bin" / "python"
    python = str(main) if main.exists() else sys.executable
    code = ("import json, tpu_workbench as wb\n"
            "print(json.dumps(wb.probe(wb.ExperimentSpec(model='mlp', mode='tpu_eager'))))")
    env = {**os.environ, torchtpu.DRY_RUN_ENV: "1",
           "TPU_WORKBENCH_RESULTS": str(tmp_path / "results")}
    proc = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["runtime"] == "torch_tpu" and info["torch_tpu"] == "0.2.0" and info["dry_run"]
    assert info["torch"].startswith("2.13")  # the TorchTPU environment's torch, not .venv's


def test_plain_workers_do_not_load_torch_tpu():
    """With torch_tpu 0.2.0 loaded and no chip a CPU backward pass hangs (libtpu init), so plain
    PyTorch workers run with TORCH_DEVICE_BACKEND_AUTOLOAD=0."""
    assert wb.RuntimeConfig("torch", "cpu").env()["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
