"""What can run here: TPU (torch_xla or TorchTPU), XLA:CPU, plain PyTorch; and the host's peak.

The probes of this module sit under :mod:`tpu_workbench.environment.torchtpu` and
:mod:`tpu_workbench.environment.describe` (which puts them together in ``describe()``). Everything
in this module is safe to call in the notebook's own process: it never imports
torch_xla or torch_tpu (those are imported only inside worker processes, see
:mod:`tpu_workbench.worker`). Facts that need the runtime itself (the device count PJRT really
sees) come from :func:`tpu_workbench.runs.runner.probe`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


# PCI device ids of TPU generations (jax/_src/hardware_utils.py, torch_tpu's hardware.py), named
# as torch_tpu names them.
TPU_PCI_DEVICES = {"0x005e": "TPU v4", "0x0062": "TPU v5p", "0x0063": "TPU v5e",
                   "0x006f": "TPU v6e", "0x0076": "TPU v7"}


def tpu_kind_on_pci(sys_root: str = "/sys/bus/pci/devices") -> str | None:
    """The TPU generation on this host's PCI bus ("TPU v6e"), "TPU" for an unknown one, or None
    without a chip. For where the runtime cannot say (torch_xla under SPMD has no real device
    to ask)."""
    for address in tpu_chips_on_pci(sys_root):
        try:
            device = (Path(sys_root) / address / "device").read_text().strip()
        except OSError:
            continue
        return TPU_PCI_DEVICES.get(device, "TPU")
    return None


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


WORKER_MODULE = "tpu_workbench.worker"  # a workbench worker's command line: python -m this
# pid -> the worker (``.alive``, ``.busy``, ``.stop()``) for each worker process this process
# started: :mod:`tpu_workbench.runs.workers` registers them here, downhill of the pools, so that the
# status below can tell our own idle worker (which a run may end to take the chip) from others.
_OWN_WORKERS: dict[int, Any] = {}


def register_own_worker(pid: int, worker: Any) -> None:
    """Record that this process started worker process `pid`."""
    _OWN_WORKERS[pid] = worker


def unregister_own_worker(pid: int) -> None:
    _OWN_WORKERS.pop(pid, None)


def own_worker(pid: int) -> Any:
    """The worker object of `pid` if this process started it, else None."""
    return _OWN_WORKERS.get(pid)


@dataclass
class TPUHolder:
    """A process that holds a TPU device file open, and whose it is."""

    pid: int
    cmdline: str  # "" where /proc does not say (gone, or not ours to read)
    workbench_worker: bool  # a tpu_workbench worker process (``python -m tpu_workbench.worker``)
    own: bool  # started by this process's worker pool
    idle: bool  # own and serving no run: ended (released) when a run needs the chip

    def describe(self) -> str:
        """Who it is and what to do about it, in words."""
        cmd = self.cmdline if len(self.cmdline) <= 120 else self.cmdline[:117] + "..."
        head = f"pid {self.pid} ({cmd or 'command line unreadable'})"
        if self.own:
            state = "idle: released when a run needs the chip" if self.idle else "busy with a run"
            return f"{head}: this workbench's own worker, {state}"
        if self.workbench_worker:
            return (f"{head}: a tpu_workbench worker another process started (a stale notebook "
                    f"kernel?): stop that kernel, or `kill {self.pid}` if it is yours")
        return (f"{head}: not started by the workbench, left alone: stop it yourself "
                f"(`kill {self.pid}`) if it is yours to stop")


def _cmdline(proc_root: str, pid: int) -> str:
    try:
        raw = (Path(proc_root) / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def tpu_holder_details(proc_root: str = "/proc") -> list[TPUHolder]:
    """Each process (other than ours) that holds a TPU device file: pid, command line, whether
    it is a workbench worker and whether this process started it (and it is idle)."""
    out = []
    for pid in tpu_holders(proc_root):
        cmd = _cmdline(proc_root, pid)
        worker = _OWN_WORKERS.get(pid)
        out.append(TPUHolder(pid, cmd, f"-m {WORKER_MODULE}" in cmd or worker is not None,
                             worker is not None,
                             worker is not None and worker.alive and not worker.busy))
    return out


def holders_message(holders: list[TPUHolder]) -> str:
    """Why the chip is busy, naming each holder (a TPU admits one process at a time)."""
    return ("TPU chip(s) busy (a TPU admits one process at a time): held by "
            + "; ".join(h.describe() for h in holders))


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
    holders = tpu_holder_details()
    blocking = [h for h in holders if not h.idle]  # our own idle worker is ours to release
    if blocking:
        return TPUStatus(False, len(chips), holders_message(blocking), fallback,
                         [h.pid for h in blocking])
    if holders:
        return TPUStatus(True, len(chips), f"{len(chips)} TPU chip(s) found, held by this "
                         f"workbench's idle worker(s) {[h.pid for h in holders]}, which a run "
                         "that needs the chip ends first", "")
    return TPUStatus(True, len(chips), f"{len(chips)} TPU chip(s) found and free", "")


def have_torch_xla() -> bool:
    """True if torch_xla is installed (checked without importing it)."""
    return importlib.util.find_spec("torch_xla") is not None


def cuda_devices() -> int:
    """Number of CUDA devices plain PyTorch can use (0 without a GPU)."""
    if not any(Path("/dev").glob("nvidia[0-9]*")):  # no NVIDIA device: skip importing torch
        return 0
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


PEAK_SIZES = (256, 512, 1024)  # square fp32 matmuls (small ones run from the caches)
PEAK_SECONDS_PER_SIZE = 0.15 # at least this long of matmuls per size and way of timing
PEAK_VERSION = 4  # bump when the method changes: older cached figures are measured again
CACHE_BYTES = 16 * 2**10  # a buffer that stays in a core's L1 cache
MEMORY_BYTES = 64 * 2**20  # one that does not fit any cache


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (a
    container limited to 2 CPUs of a 64-core host has 2)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


def _best_seconds(work, clock, seconds: float) -> float:
    """The shortest of >= 3 timings of `work()` by `clock`, repeated for >= `seconds` of wall."""
    work()  # warm-up: thread pool, page faults
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - started < seconds:
        t0 = clock()
        work()
        times.append(clock() - t0)
    return min(times)


def measure_host_peak(sizes: tuple[int, ...] = PEAK_SIZES,
                      seconds_per_size: float = PEAK_SECONDS_PER_SIZE) -> dict:
    """:func:`measure_here` in a fresh process that uses the CPU's best kernels: this one may
    have been told to use older ones (``ATEN_CPU_CAPABILITY=default``, ATen's kernels for CPUs
    without AVX), which slows ATen's reductions 8x while XLA:CPU, compiling for this CPU, does
    not slow at all: a roof measured so would sit under XLA's kernels."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env["OMP_WAIT_POLICY"] = "PASSIVE"  # no thread spins while the other times its matmul
    code = ("import json, sys; from tpu_workbench.environment.backends import measure_here; "
            f"print(json.dumps(measure_here({tuple(sizes)!r}, {seconds_per_size!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring the host peak failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_here(sizes: tuple[int, ...] = PEAK_SIZES,
                 seconds_per_size: float = PEAK_SECONDS_PER_SIZE) -> dict:
    """Measure this CPU's fp32 matmul peak and its memory bandwidths in plain PyTorch, now, in
    this process (:func:`measure_host_peak` calls it in a fresh one).

    A peak must not depend on what else the machine is doing, and a wall clock does: a matmul
    descheduled half the time looks half as fast (the same machine gave 184 GFLOP/s idle and
    26-87 while other work ran). So each size is timed two ways and the higher figure kept:
    on **one** thread by that thread's own CPU time (which other processes cannot stretch)
    times the usable cores, and on every usable core by the wall clock. The first is the peak
    of the cores working apart, an upper bound of what they reach together; the second can
    only beat it on an idle machine. The peak is the best size. Bandwidths likewise: one core
    reading a buffer that stays in its L1 cache (``cache_bandwidth_bytes_per_s``: what a small
    kernel's bytes can move at most) and one that fits no cache (``bandwidth_bytes_per_s``,
    main memory, or every core copying it by the wall clock where that is higher), in bytes
    per second of the core's own time, times the cores.
    """
    import torch

    cores = usable_cores()
    threads = torch.get_num_threads()
    per_size = {}
    try:
        for n in sizes:
            matmul = functools.partial(torch.mm, torch.randn(n, n), torch.randn(n, n))
            torch.set_num_threads(1)
            one = 2.0 * n**3 / _best_seconds(matmul, time.thread_time, seconds_per_size)
            torch.set_num_threads(cores)
            every = 2.0 * n**3 / _best_seconds(matmul, time.perf_counter, seconds_per_size)
            per_size[n] = {"best_flops": max(one * cores, every), "one_core_flops": one,
                           "all_cores_wall_flops": every}
        torch.set_num_threads(1)
        bandwidth = {}
        for name, nbytes in (("cache", CACHE_BYTES), ("memory", MEMORY_BYTES)):
            x = torch.ones(nbytes // 4)
            reps = max(1, 2**28 // nbytes)  # 256 MiB read: the stride-0 rows re-read x
            rows = x.expand(reps, x.numel())
            bandwidth[name] = reps * nbytes / _best_seconds(rows.sum, time.thread_time, 0.1)
        torch.set_num_threads(cores)
        src = torch.ones(MEMORY_BYTES // 4)
        dst = torch.empty_like(src)
        copy = 2 * MEMORY_BYTES / _best_seconds(lambda: dst.copy_(src), time.perf_counter, 0.1)
    finally:
        torch.set_num_threads(threads)
    best_n = max(per_size, key=lambda n: per_size[n]["best_flops"])
    return {"peak_flops": per_size[best_n]["best_flops"], "n": best_n,
            "per_size": {str(n): v for n, v in per_size.items()},
            "bandwidth_bytes_per_s": max(bandwidth["memory"] * cores, copy),
            "cache_bandwidth_bytes_per_s": bandwidth["cache"] * cores,
            "dtype": "float32", "cores": cores, "torch": torch.__version__,
            "method": (f"fp32 matmuls at {', '.join(f'{n}x{n}' for n in sizes)}: the best of "
                       f"one core by its own CPU time x {cores} cores and all {cores} cores "
                       "by the clock"),
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}


def host_peak_key() -> dict:
    """What a measured host peak belongs to: this CPU, this environment, this torch."""
    import sys

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": package_version("torch"),
            "environment": sys.prefix, "version": PEAK_VERSION}


def host_peak_path() -> Path:
    """The cache file of this environment's host peak: one file per key, so ``.venv`` and
    ``.venv-torchtpu`` (different torch, different prefix) never overwrite each other."""
    import hashlib

    digest = hashlib.sha256(json.dumps(host_peak_key(), sort_keys=True).encode()).hexdigest()
    return cache_dir() / f"host_peak-{digest[:12]}.json"


_HOST_PEAK: dict | None = None


def host_peak_flops(refresh: bool = False) -> dict:
    """This host's fp32 matmul peak FLOP/s (``peak_flops``), measured by
    :func:`measure_host_peak` and cached on disk per CPU, environment and torch version.

    The cached figure is the best ever measured for its key: ``refresh=True`` measures again and
    keeps the higher of the two (a measurement under load cannot lower a true peak). The result
    also says how and when it was measured (``method``, ``measured_at``) and whether this call
    measured it (``fresh``) or read it from the cache.
    """
    global _HOST_PEAK
    if _HOST_PEAK is not None and not refresh:
        return {**_HOST_PEAK, "fresh": False}
    path = host_peak_path()
    cached = None
    try:
        data = json.loads(path.read_text())
        if data.get("key") == host_peak_key():
            cached = data["result"]
    except (OSError, ValueError, KeyError):
        pass  # no cache yet, or unreadable: measure
    if cached is not None and not refresh:
        _HOST_PEAK = cached
        return {**cached, "fresh": False}
    measured = measure_host_peak()
    measured["cpu"] = cpu_model()
    best = measured
    if cached is not None and cached["peak_flops"] > measured["peak_flops"]:
        best = {**cached, "remeasured_at": measured["measured_at"],
                "remeasured_flops": measured["peak_flops"]}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": host_peak_key(), "result": best}, indent=2))
    tmp.replace(path)
    _HOST_PEAK = best
    return {**best, "fresh": best is measured}
