"""What can run here, in one dict: the backends' probes (:mod:`tpu_workbench.environment.backends`)
and TorchTPU's status (:mod:`tpu_workbench.environment.torchtpu`), without importing torch_xla or
torch_tpu."""

from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import asdict

from . import backends, torchtpu


def describe(measure_peak: bool = True) -> dict:
    """Everything this process can tell about the backends, without importing torch_xla."""
    tpu = backends.tpu_status()
    info = {
        "torch_xla_installed": backends.have_torch_xla(),
        "torch_tpu_installed": importlib.util.find_spec("torch_tpu") is not None,
        "torch_tpu": torchtpu.status().as_dict(),  # here or in .venv-torchtpu; chip or not
        "tpu": asdict(tpu),
        "cuda_devices": backends.cuda_devices(),
        "cpu": {"model": backends.cpu_model(), "cores": os.cpu_count(),
                "machine": platform.machine()},
        "versions": backends.versions(),
    }
    if tpu.available:
        info["default_backend"] = "xla:TPU"
    elif info["torch_xla_installed"]:
        info["default_backend"] = "xla:CPU"
    else:
        info["default_backend"] = "torch:cpu"
    if measure_peak:
        info["host_peak"] = backends.host_peak_flops()
    return info
