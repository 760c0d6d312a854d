"""What can run here: TPU (torch_xla or TorchTPU), XLA:CPU, plain PyTorch; and the host's peak.

Everything in this module is safe to call in the notebook's own process: it never imports
torch_xla or torch_tpu (those are imported only inside worker processes, see
:mod:`tpu_workbench.worker`). Facts that need the runtime itself (the device count PJRT really
sees) come from :func:`tpu_workbench.runner.probe`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .paths import cache_dir

GOOGLE_PCI_VENDOR = "0x1ae0"  # Google's PCI vendor id: TPU chips show up under it
DEFAULT_CPU_DEVICES = 8  # a v6e-8 host's shape


def package_version(name: str) -> str | None:
    """Installed version of a distribution, or None, without importing it."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Versions of the packages the backends depend on (None where not installed)."""
    names = ["torch", "torch_xla", "libtpu", "torch_tpu", "jax", "jaxlib", "marimo", "altair",
             "pandas", "torchvision", "diffusers"]
    out = {n: package_version(n.replace("_", "-")) or package_version(n) for n in names}
    out["python"] = platform.python_version()
    return out


def tpu_chips_on_pci(sys_root: str = "/sys/bus/pci/devices") -> list[str]:
    """PCI addresses of Google devices (TPU chips) on this host."""
    found = []
    for dev in sorted(Path(sys_root).glob("*")):
        try:
            if (dev / "vendor").read_text().strip() == GOOGLE_PCI_VENDOR:
                found.append(dev.name)
        except OSError:
            continue
    return found


def tpu_holders(proc_root: str = "/proc") -> list[int]:
    """PIDs (other than ours) that hold a TPU device file (/dev/accel*, /dev/vfio/N) open."""
    holders = set()
    me = os.getpid()
    for fd_dir in Path(proc_root).glob("[0-9]*/fd"):
        pid = int(fd_dir.parent.name)
        if pid == me:
            continue
        try:
            for fd in fd_dir.iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/accel") or (
                    target.startswith("/dev/vfio/") and target[10:].isdigit()
                ):
                    holders.add(pid)
                    break
        except OSError:  # process gone, or not ours to read
            continue
    return sorted(holders)


@dataclass
class TPUStatus:
    """Whether a TPU can be used here, and if not, why and what runs instead."""

    available: bool
    chips: int
    reason: str
    fallback: str
    holders: list[int] = field(default_factory=list)


def tpu_status() -> TPUStatus:
    """Check, in order: TPU chips on the PCI bus, a runtime (libtpu or torch_tpu), a free chip."""
    chips = tpu_chips_on_pci()
    have_libtpu = importlib.util.find_spec("libtpu") is not None
    have_torch_tpu = importlib.util.find_spec("torch_tpu") is not None
    fallback = (f"XLA:CPU with {DEFAULT_CPU_DEVICES} virtual devices "
                "(same HLO, same SPMD partitioner)")
    if not have_torch_xla():  # e.g. .venv-torchtpu: torch_tpu needs a chip, XLA:CPU is absent
        fallback = "plain PyTorch on CPU"
    if not chips:
        return TPUStatus(False, 0, "no TPU chip found on the PCI bus (vendor 0x1ae0)", fallback)
    if not (have_libtpu or have_torch_tpu):
        return TPUStatus(
            False, len(chips),
            f"{len(chips)} TPU chip(s) found but no TPU runtime: install libtpu "
            "(pip install -e '.[tpu]') or torch_tpu", fallback)
    holders = tpu_holders()
    if holders:
        return TPUStatus(
            False, len(chips),
            f"TPU chip(s) busy: held by process(es) {holders} (a TPU is locked to one process; "
            "stop the other notebook or kernel)", fallback, holders)
    return TPUStatus(True, len(chips), f"{len(chips)} TPU chip(s) found and free", "")


def have_torch_xla() -> bool:
    """True if torch_xla is installed (checked without importing it)."""
    return importlib.util.find_spec("torch_xla") is not None


def cuda_devices() -> int:
    """Number of CUDA devices plain PyTorch can use (0 without a GPU)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install must not break `info`
        return 0


def cpu_model() -> str:
    """The host CPU's model name (from /proc/cpuinfo where available)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _measure_matmul_flops(n: int, dtype_name: str, repeats: int) -> dict:
    """Best-of-`repeats` FLOP/s of an n x n matmul in plain PyTorch on this CPU."""
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm-up: thread pool start, page faults
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    flops = 2.0 * n**3
    # Memory bandwidth: best copy of a 64 MiB buffer (read + write), for a roofline's slope.
    src = torch.empty(16 * 2**20, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copies = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - t0)
    bandwidth = 2 * src.numel() * src.element_size() / min(copies)
    return {"n": n, "bandwidth_bytes_per_s": bandwidth, "dtype": dtype_name,
            "repeats": repeats, "best_s": min(times),
            "median_s": sorted(times)[len(times) // 2], "peak_flops": flops / min(times),
            "median_flops": flops / sorted(times)[len(times) // 2],
            "threads": torch.get_num_threads(), "torch": torch.__version__}


_HOST_PEAK: dict | None = None


def host_peak_flops(refresh: bool = False) -> dict:
    """Measured peak matmul FLOP/s of this host's CPU (fp32), cached on disk per CPU and torch.

    Measured, not assumed: the best of 10 runs of a 1024x1024 fp32 matmul, on all threads PyTorch
    uses; also the memory bandwidth of a 64 MiB copy (``bandwidth_bytes_per_s``). The first
    call takes about a second; later calls (and later processes) read the cache.
    """
    global _HOST_PEAK
    if _HOST_PEAK is not None and not refresh:
        return _HOST_PEAK
    key = {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": package_version("torch"),
           "version": 2}
    path = cache_dir() / "host_peak.json"
    if path.exists() and not refresh:
        try:
            cached = json.loads(path.read_text())
            if cached.get("key") == key:
                _HOST_PEAK = cached["result"]
                return _HOST_PEAK
        except (OSError, ValueError, KeyError):
            pass  # unreadable cache: measure again
    result = _measure_matmul_flops(1024, "float32", 10)
    result["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    result["cpu"] = key["cpu"]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "result": result}, indent=2))
    tmp.replace(path)
    _HOST_PEAK = result
    return result


def describe(measure_peak: bool = True) -> dict:
    """Everything this process can tell about the backends, without importing torch_xla."""
    tpu = tpu_status()
    from .torchtpu import status as torchtpu_status

    info = {
        "torch_xla_installed": have_torch_xla(),
        "torch_tpu_installed": importlib.util.find_spec("torch_tpu") is not None,
        "torch_tpu": torchtpu_status().as_dict(),  # here or in .venv-torchtpu; chip or not
        "tpu": asdict(tpu),
        "cuda_devices": cuda_devices(),
        "cpu": {"model": cpu_model(), "cores": os.cpu_count(), "machine": platform.machine()},
        "versions": versions(),
    }
    if tpu.available:
        info["default_backend"] = "xla:TPU"
    elif info["torch_xla_installed"]:
        info["default_backend"] = "xla:CPU"
    else:
        info["default_backend"] = "torch:cpu"
    if measure_peak:
        info["host_peak"] = host_peak_flops()
    return info
