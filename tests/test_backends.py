"""Backend detection, the chip table and the measured host peak."""

from __future__ import annotations

import math

import pytest

import tpu_workbench as wb
from tpu_workbench import timing
from tpu_workbench.environment import backends


def test_chip_table_has_published_figures():
    table = wb.chip_table()
    assert list(table["name"]) == ["v5e", "v6e", "v5p"]
    v6e = wb.get_chip("v6e")
    assert v6e.bf16_tflops == 918 and v6e.hbm_gb == 32 and v6e.ici_total_gbps == 800
    assert table["source"].str.contains("Cloud TPU documentation").all()
    with pytest.raises(ValueError, match="unknown TPU chip 'v9'; known chips: v5e, v6e, v5p"):
        wb.get_chip("v9")


def test_device_kinds_torch_xla_reports_map_to_their_chips():
    # torch_xla's xm.xla_device_kind() is PJRT's device kind, the string JAX shows as
    # jax.Device.device_kind; JAX's mesh utilities name the kinds of each generation.
    mesh_utils = pytest.importorskip("jax._src.mesh_utils")
    assert wb.get_chip(mesh_utils._TPU_V5_LITE).name == "v5e"  # "TPU v5 lite"
    assert wb.get_chip(mesh_utils._TPU_V5E).name == "v5e"
    assert wb.get_chip(mesh_utils._TPU_V5P).name == "v5p"
    assert wb.get_chip(mesh_utils._TPU_V6_LITE).name == "v6e"  # "TPU v6 lite"
    assert wb.get_chip("TPU v5").name == "v5p"  # v5p in earlier PJRT releases
    with pytest.raises(ValueError, match="unknown TPU chip 'TPU v4'"):
        wb.get_chip(mesh_utils._TPU_V4)  # not in the table: no made-up figures


def test_tpu_runs_use_the_chip_peak_never_the_host(monkeypatch):
    def no_host_peak(**_):
        raise AssertionError("a TPU run must not use the host CPU's peak")

    monkeypatch.setattr(backends, "host_peak_flops", no_host_peak)
    xla = {"runtime": "xla", "pjrt_device": "TPU", "device_kind": "TPU v6 lite"}
    assert timing.peak_flops(xla, (2, 4)) == (8 * 918e12, "v6e x8 bf16 peak (chip table)")
    torchtpu = {"runtime": "torch_tpu", "device": "tpu", "device_kind": "TPU v5e"}
    assert timing.peak_flops(torchtpu)[0] == 197e12
    torchtpu["peak_flops_per_device"] = 2307e12 / 2  # TorchTPU's own figure wins (a v7 device)
    peak, source = timing.peak_flops({**torchtpu, "device_kind": "TPU v7"})
    assert peak == 2307e12 / 2 and "TorchTPU" in source
    peak, source = timing.peak_flops({**xla, "device_kind": "TPU7x"})
    assert peak != peak and "not in the chip table" in source  # NaN, said why


def test_no_pci_chip_means_no_tpu_with_reason(tmp_path):
    (tmp_path / "0000:00:04.0").mkdir()
    (tmp_path / "0000:00:04.0" / "vendor").write_text("0x1af4\n")  # a virtio device
    assert backends.tpu_chips_on_pci(str(tmp_path)) == []
    (tmp_path / "0000:00:05.0").mkdir()
    (tmp_path / "0000:00:05.0" / "vendor").write_text("0x1ae0\n")  # a Google TPU
    assert backends.tpu_chips_on_pci(str(tmp_path)) == ["0000:00:05.0"]


def test_tpu_status_names_reason_and_fallback():
    status = wb.tpu_status()
    if status.available:
        pytest.skip("a TPU is attached")
    assert status.reason and "XLA:CPU" in status.fallback


def test_host_peak_is_measured_over_several_sizes(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(backends, "_HOST_PEAK", None)
    first = backends.host_peak_flops()
    assert first["fresh"] and set(first["per_size"]) == {"256", "512", "1024"}
    assert first["peak_flops"] == max(v["best_flops"] for v in first["per_size"].values())
    cores = backends.usable_cores()
    for v in first["per_size"].values():  # the better of one core x cores and all by the clock
        assert v["best_flops"] == max(v["one_core_flops"] * cores, v["all_cores_wall_flops"])
    assert first["cache_bandwidth_bytes_per_s"] > first["bandwidth_bytes_per_s"] > 0
    assert "256x256, 512x512, 1024x1024" in first["method"] and first["measured_at"]
    monkeypatch.setattr(backends, "_HOST_PEAK", None)
    again = backends.host_peak_flops()  # read back from disk, not measured again
    assert not again["fresh"] and again["peak_flops"] == first["peak_flops"]
    assert again["measured_at"] == first["measured_at"]


def test_the_host_peak_holds_under_load_and_old_kernels(monkeypatch):
    """Measured while every core runs other work, and while this process is told to use
    ATen's kernels for CPUs without AVX, the peak and the cache bandwidth stay within a third
    of an unloaded measurement's: a wall-clock peak fell to a third and less under such load,
    and a reduction on the old kernels reads its cache 8x slower, while XLA:CPU's kernels,
    which the roof bounds, slow down for neither."""
    import subprocess
    import sys

    quiet = backends.measure_host_peak()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(backends.usable_cores())]
    try:
        busy = backends.measure_host_peak()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    for key in ("peak_flops", "cache_bandwidth_bytes_per_s"):
        assert busy[key] > 0.67 * quiet[key], (key, busy[key], quiet[key])


def _fake_measurement(monkeypatch, flops: list[float]) -> None:
    """measure_host_peak returns the figures of `flops` in turn (no real matmuls)."""
    figures = iter(flops)
    monkeypatch.setattr(backends, "measure_host_peak", lambda: {
        "peak_flops": next(figures), "measured_at": "2026-12-01 10:00:00", "method": "fake"})


def test_environments_keep_their_own_peak(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_WORKBENCH_CACHE", str(tmp_path))
    _fake_measurement(monkeypatch, [100e9, 180e9])
    key = backends.host_peak_key

    def in_env(prefix: str, torch_version: str) -> None:
        monkeypatch.setattr(backends, "host_peak_key",
                            lambda: {**key(), "environment": prefix, "torch": torch_version})
        monkeypatch.setattr(backends, "_HOST_PEAK", None)

    in_env("/x/.venv", "2.9.0")
    assert backends.host_peak_flops()["peak_flops"] == 100e9
    in_env("/x/.venv-torchtpu", "2.13.0")
    assert backends.host_peak_flops()["peak_flops"] == 180e9
    in_env("/x/.venv", "2.9.0")  # the first environment's figure is still there, unmeasured
    back = backends.host_peak_flops()
    assert back["peak_flops"] == 100e9 and not back["fresh"]
    assert len(list(tmp_path.glob("host_peak-*.json"))) == 2


def test_refresh_keeps_the_best_peak(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(backends, "_HOST_PEAK", None)
    _fake_measurement(monkeypatch, [80e9, 60e9, 150e9])
    assert backends.host_peak_flops()["peak_flops"] == 80e9
    loaded = backends.host_peak_flops(refresh=True)  # measured under more load: lower
    assert loaded["peak_flops"] == 80e9 and loaded["remeasured_flops"] == 60e9
    assert backends.host_peak_flops(refresh=True)["peak_flops"] == 150e9


def test_a_run_that_beats_the_peak_measured_again_gets_no_mfu(tmp_path, monkeypatch):
    """A run faster than the cached host peak (measured under load) re-measures it. If it still
    wins, its FLOP count or the peak is wrong: no MFU (NaN) and the source says why. (It used
    to become the peak itself, so MFU read 1.0 and hid a FLOP-accounting error.)"""
    monkeypatch.setenv("TPU_WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(backends, "_HOST_PEAK", None)
    _fake_measurement(monkeypatch, [50e9, 90e9, 95e9])
    cpu = {"runtime": "xla", "pjrt_device": "CPU", "device_kind": "cpu"}
    assert timing.honest_peak(40e9, cpu)[0] == 50e9  # below the peak: the peak as it is
    peak, source = timing.honest_peak(120e9, cpu)  # beats it: measured again (90), still beats
    assert math.isnan(peak) and "no MFU" in source and "90.0 GFLOP/s" in source
    assert backends.host_peak_flops()["peak_flops"] == 90e9  # the re-measurement was kept
    peak, source = timing.honest_peak(92e9, cpu)  # re-measured (95): the new peak holds
    assert peak == 95e9 and "measured at" in source


def test_describe_does_not_import_torch_xla():
    import sys

    info = wb.describe(measure_peak=False)
    assert "torch_xla" not in sys.modules
    assert info["versions"]["python"]


def test_tpu_generation_from_the_pci_bus(tmp_path):
    """Under SPMD torch_xla cannot name the device kind; the PCI id does (ids from JAX's
    hardware_utils and torch_tpu's hardware table)."""
    assert backends.tpu_kind_on_pci(str(tmp_path)) is None
    chip = tmp_path / "0000:00:05.0"
    chip.mkdir()
    (chip / "vendor").write_text("0x1ae0\n")
    (chip / "device").write_text("0x006f\n")
    assert backends.tpu_kind_on_pci(str(tmp_path)) == "TPU v6e"
    assert wb.get_chip(backends.tpu_kind_on_pci(str(tmp_path))).name == "v6e"
    (chip / "device").write_text("0x9999\n")
    assert backends.tpu_kind_on_pci(str(tmp_path)) == "TPU"
