"""The TorchTPU backend as the main environment sees it (no torch_tpu here, no TPU chip): the
modes are refused with a clear error, the API list is well formed, the interpreter choice. The
TorchTPU environment's own tests are in ``tests_torchtpu/`` (``scripts/dev.py test-torchtpu``)."""

from __future__ import annotations

import re
import sys

import pytest

import tpu_workbench as wb
from tpu_workbench.environment import backends, torchtpu
from tpu_workbench.environment import describe as environment
from tpu_workbench.runs import spec


@pytest.fixture
def no_chip(monkeypatch):
    monkeypatch.setattr(backends, "tpu_chips_on_pci", lambda *a, **k: [])


@pytest.mark.parametrize("mode", ["tpu_eager", "tpu_fused", "tpu_compile"])
def test_torchtpu_modes_are_refused_without_a_chip(no_chip, mode):
    assert wb.MODES[mode].runtime == "torch_tpu"
    with pytest.raises(wb.SpecError) as err:
        wb.ExperimentSpec(model="mlp", mode=mode, steps=2).validate()
    text = str(err.value)
    assert repr(mode) in text and "TorchTPU" in text
    assert "What runs instead" in text and "torch_eager" in text and "inductor" in text


def test_torchtpu_modes_are_refused_without_torch_tpu(no_chip, monkeypatch, tmp_path):
    monkeypatch.setattr(torchtpu, "installed_here", lambda: False)
    monkeypatch.setattr(torchtpu, "ROOT", tmp_path)  # no .venv-torchtpu either
    st = torchtpu.status()
    assert not st.installed and not st.available and "setup-torchtpu" in st.reason
    with pytest.raises(wb.SpecError, match="not installed"):
        wb.ExperimentSpec(model="mlp", mode="tpu_compile", steps=2).validate()
    assert "tpu_compile" not in wb.available_modes()


def test_chip_found_lets_the_modes_through(monkeypatch):
    monkeypatch.setattr(backends, "tpu_chips_on_pci", lambda *a, **k: ["0000:00:04.0"])
    monkeypatch.setattr(backends, "tpu_holders", lambda *a, **k: [])
    monkeypatch.setattr(torchtpu, "installed_here", lambda: True)
    monkeypatch.setattr(torchtpu, "version", lambda: torchtpu.SUPPORTED_VERSION)
    s = wb.ExperimentSpec(model="mlp", mode="tpu_fused", steps=2).validate()
    config = wb.runtime_config(s)
    assert config == wb.RuntimeConfig("torch_tpu", "tpu")
    assert config.env()["TPU_WORKBENCH_RUNTIME"] == "torch_tpu"
    assert "PJRT_DEVICE" not in config.env()
    assert config.env()["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "1"  # registers the tpu device
    assert wb.default_modes() == ["torch_eager", "tpu_eager", "tpu_compile"]
    with pytest.raises(wb.SpecError, match="device='cpu'"):
        wb.ExperimentSpec(model="mlp", mode="tpu_eager", device="cpu").validate()
    with pytest.raises(wb.SpecError, match="tpu_compile"):
        wb.ExperimentSpec(model="mlp", mode="tpu_eager", capture=("hlo",)).validate()
    monkeypatch.setattr(torchtpu, "version", lambda: "0.3.0")
    with pytest.raises(wb.SpecError, match="supports 0.2.0"):
        wb.ExperimentSpec(model="mlp", mode="tpu_eager").validate()


def test_xla_modes_name_the_missing_runtime(monkeypatch):
    monkeypatch.setattr(backends, "have_torch_xla", lambda: False)
    with pytest.raises(wb.SpecError, match=r"torch_xla, which is not installed.*use \.venv"):
        wb.ExperimentSpec(model="mlp", mode="lazy").validate()
    assert wb.available_modes()[:2] == ["torch_eager", "inductor"]
    assert not {"eager", "lazy", "compile", "dynamo"} & set(wb.available_modes())


def test_api_list_is_well_formed():
    assert len(torchtpu.API) == len(set(torchtpu.API)) >= 20
    for name in torchtpu.API:
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", name), name
        assert name.startswith(("torch.", "torch_tpu.")), name
    # what the worker-side code calls is listed
    assert {"torch.tpu.EagerMode.DEFER_NEVER", "torch.tpu.EagerMode.DEFER_AND_FUSE",
            "torch.tpu._get_cache_stats", "torch.tpu.profiler.TpuProfilerConfig",
            "torch.accelerator.synchronize"} <= set(torchtpu.API)
    for name in torchtpu.MODE_EAGER.values():
        assert f"torch.tpu.EagerMode.{name}" in torchtpu.API
    assert set(torchtpu.MODE_EAGER) | {"tpu_compile"} == {
        m for m, mode in wb.MODES.items() if mode.runtime == "torch_tpu"}


def test_lookup_reports_the_missing_part():
    assert torchtpu.lookup("os.path.join") is __import__("os").path.join
    with pytest.raises(AttributeError, match="os.path has no attribute 'nope'"):
        torchtpu.lookup("os.path.nope")
    with pytest.raises(ImportError):
        torchtpu.lookup("no_such_module_xyz.attr")
    missing = torchtpu.missing_api(("os.path.join", "os.nope"))
    assert list(missing) == ["os.nope"]


def test_interpreter_choice(monkeypatch, tmp_path):
    from tpu_workbench.environment.runtimes import Runtime

    monkeypatch.setattr(torchtpu, "installed_here", lambda: False)
    monkeypatch.setattr(torchtpu, "ROOT", tmp_path)
    assert Runtime.TORCH_TPU.python() == sys.executable  # no .venv-torchtpu
    python = tmp_path / ".venv-torchtpu" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    assert Runtime.TORCH_TPU.python() == str(python)
    assert Runtime.XLA.python() == Runtime.TORCH.python() == sys.executable
    monkeypatch.setattr(torchtpu, "installed_here", lambda: True)
    assert Runtime.TORCH_TPU.python() == sys.executable


def test_plain_workers_do_not_autoload_torch_tpu():
    assert wb.RuntimeConfig("torch", "cpu").env()["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD" not in wb.RuntimeConfig("xla", "cpu", 8).env()


@pytest.mark.parametrize("installed", [True, False])
def test_status_is_described(no_chip, monkeypatch, tmp_path, installed):
    """Each of the two states without a chip, set up by the test, is described as such."""
    monkeypatch.delenv(torchtpu.DRY_RUN_ENV, raising=False)
    monkeypatch.setattr(torchtpu, "installed_here", lambda: installed)
    monkeypatch.setattr(torchtpu, "version", lambda: torchtpu.SUPPORTED_VERSION)
    monkeypatch.setattr(torchtpu, "ROOT", tmp_path)  # and no .venv-torchtpu
    st = environment.describe(measure_peak=False)["torch_tpu"]
    assert st["available"] is False and st["installed"] is installed
    if installed:
        assert st["reason"].startswith("no TPU chip found on the PCI bus (vendor 0x1ae0)")
        assert st["version"] == torchtpu.SUPPORTED_VERSION == "0.2.0"
    else:
        assert "torch_tpu is not installed" in st["reason"] and "setup-torchtpu" in st["reason"]
        assert st["version"] is None
    assert "torch_eager" in st["fallback"]
    assert spec.MODES["tpu_compile"].description


def test_dtensor_placements_follow_the_strategies():
    from tpu_workbench.scale import dtensor_sharding as ds

    assert ds.placements(None, (2, 4)) == [("replicate", None), ("replicate", None)]
    assert ds.placements(("model", None), (2, 4)) == [("replicate", None), ("shard", 0)]
    assert ds.placements((None, "model"), (2, 4)) == [("replicate", None), ("shard", 1)]
    assert ds.placements((("data", "model"), None), (2, 4)) == [("shard", 0), ("shard", 0)]
    assert ds.placements(("data",), (8,)) == [("shard", 0)]
    with pytest.raises(wb.SpecError, match="device 'cuda'"):
        ds.resolve_device("cuda")
    assert ds.resolve_device("cpu") == "cpu"


def test_dtensor_layout_is_validated_before_any_process_starts():
    from tpu_workbench.scale import dtensor_sharding as ds

    with pytest.raises(wb.SpecError, match="2-D mesh"):
        ds.layout("mingpt", "tiny", (4,), "tp", device="cpu")


class _Joined(Exception):
    """Raised by the fake process group: the rank got as far as joining it."""


def test_a_gang_rank_gives_torchtpu_the_processes_on_its_own_host(monkeypatch, tmp_path):
    """A v6e-16 launch plan starts ``torchrun --nnodes 4 --nproc_per_node 4``: each rank sees
    WORLD_SIZE=16 and LOCAL_WORLD_SIZE=4, and ``set_tpu_launch_env(nproc_per_node=)`` takes the
    processes per host, as torchrun's flag of the same name does: 4, not 16."""
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    from tpu_workbench.worker import gang

    calls = []
    fake = SimpleNamespace(set_tpu_launch_env=lambda **kw: calls.append(kw))
    monkeypatch.setattr(torch, "tpu", SimpleNamespace(distributed=fake), raising=False)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: (_ for _ in ()).throw(
        _Joined()))
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    job = {"spec": wb.ExperimentSpec(model="mlp", mode="torch_eager").to_dict(),
           "device": "tpu", "out": str(tmp_path)}
    with pytest.raises(_Joined):
        gang._train(job, 5, 16, None)
    assert calls == [{"nproc_per_node": 4}]

    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(RuntimeError, match="LOCAL_WORLD_SIZE is not set"):
        gang._train(job, 5, 16, None)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "four")
    with pytest.raises(RuntimeError, match="LOCAL_WORLD_SIZE='four'"):
        gang._train(job, 5, 16, None)
