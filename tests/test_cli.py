"""The `tpu-workbench` command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tpu_workbench import backends


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
