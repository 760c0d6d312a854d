"""Backend detection, the chip table and the measured host peak."""

from __future__ import annotations

import pytest

import tpu_workbench as wb
from tpu_workbench import backends


def test_chip_table_has_published_figures():
    table = wb.chip_table()
    assert list(table["name"]) == ["v5e", "v6e", "v5p"]
    v6e = wb.get_chip("TPU v6 lite")  # the device-kind string a v6e reports
    assert v6e.bf16_tflops == 918 and v6e.hbm_gb == 32 and v6e.ici_gbps == 800
    assert table["source"].str.contains("Cloud TPU documentation").all()
    with pytest.raises(ValueError, match="unknown TPU chip 'v9'; known chips: v5e, v6e, v5p"):
        wb.get_chip("v9")


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


def test_host_peak_is_measured_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(backends, "_HOST_PEAK", None)
    first = backends.host_peak_flops()
    assert (tmp_path / "host_peak.json").exists()
    assert first["peak_flops"] >= first["median_flops"] > 0
    monkeypatch.setattr(backends, "_HOST_PEAK", None)
    assert backends.host_peak_flops() == first  # read back from disk, not measured again


def test_describe_does_not_import_torch_xla():
    import sys

    info = wb.describe(measure_peak=False)
    assert "torch_xla" not in sys.modules
    assert info["versions"]["python"]
