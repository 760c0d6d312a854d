"""Live chip metrics in a worker, from libtpu's monitoring SDK (``libtpu.sdk.tpumonitoring``).

What ``tpu-info`` shows, read by the worker while a run goes on: the TensorCore duty cycle, HBM
in use and TensorCore utilisation, one value per chip. One ``kind="tpu_metrics"`` record is
streamed per sample (columns in :mod:`tpu_workbench.records`), taken after a step's clock stopped
(never inside a timed step) and at most every :data:`SAMPLE_EVERY_S`.

Only on a chip: without one, libtpu's ``get_metric`` does not fail but retries the GCE metadata
server for about 30 s per call (seen here with libtpu 0.0.x of ``.venv-torchtpu``), so nothing
is sampled unless the PCI bus has a TPU; the run's summary then says why (``chip_metrics``), and
no number is ever made up. The metric names are checked against the installed libtpu in CI
(``tests_torchtpu/``: :data:`METRICS` against ``list_supported_metrics()``).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import time
from typing import Any

SDK_MODULE = "libtpu.sdk.tpumonitoring"
# metric name in libtpu -> (record column, unit, what it is)
METRICS: dict[str, tuple[str, str, str]] = {
    "duty_cycle_pct": ("duty_cycle_pct", "%", "share of time the TensorCore was busy"),
    "tensorcore_util": ("tensorcore_util_pct", "%", "TensorCore utilisation"),
    "hbm_capacity_usage": ("hbm_used_bytes", "bytes", "HBM in use"),
    "hbm_capacity_total": ("hbm_total_bytes", "bytes", "HBM capacity"),
}
# Names this module calls in the SDK (checked by lookup in tests_torchtpu/).
API = (f"{SDK_MODULE}.get_metric", f"{SDK_MODULE}.list_supported_metrics",
       f"{SDK_MODULE}.LibtpuSdkMetric.data", f"{SDK_MODULE}.LibtpuSdkMetric.description")
SAMPLE_EVERY_S = 0.5


def unavailable_reason(sys_root: str = "/sys/bus/pci/devices") -> str:
    """Why chip metrics cannot be sampled here ("" when they can)."""
    from ..environment.backends import tpu_chips_on_pci

    if not tpu_chips_on_pci(sys_root):
        return "no TPU chip on the PCI bus: libtpu's monitoring SDK reads a chip's counters"
    if importlib.util.find_spec("libtpu") is None:
        return "libtpu is not installed in this environment (its monitoring SDK reads the metrics)"
    try:
        importlib.import_module(SDK_MODULE)
    except ImportError as exc:
        return f"this libtpu has no monitoring SDK ({SDK_MODULE}: {exc})"
    return ""


def parse_values(data: Any) -> list[float]:
    """One float per chip from what ``LibtpuSdkMetric.data()`` returns: a list of numbers or of
    strings (``"12.5"``, or ``"0: 12.5"`` with a chip index); what is not a number is dropped."""
    out = []
    for item in data if isinstance(data, list | tuple) else [data]:
        text = str(item).rsplit(":", 1)[-1].strip().rstrip("%")
        try:
            value = float(text)
        except ValueError:
            continue
        if math.isfinite(value):
            out.append(value)
    return out


class ChipMonitor:
    """Samples :data:`METRICS` (the mean over the host's chips, and each chip's) between steps."""

    def __init__(self, sdk: Any = None, reason: str | None = None,
                 every_s: float = SAMPLE_EVERY_S) -> None:
        self.reason = unavailable_reason() if sdk is None and reason is None else (reason or "")
        if sdk is None and not self.reason:
            sdk = importlib.import_module(SDK_MODULE)
        self.sdk = sdk
        self.every_s = every_s
        self.started = time.perf_counter()
        self.last = -math.inf
        self.samples = 0
        self.errors: dict[str, str] = {}

    @property
    def available(self) -> bool:
        return self.sdk is not None and not self.reason

    def sample(self, step: int, force: bool = False) -> dict[str, Any] | None:
        """A ``kind="tpu_metrics"`` record now, or None (unavailable, or sampled too recently)."""
        now = time.perf_counter()
        if not self.available or (not force and now - self.last < self.every_s):
            return None
        self.last = now
        record: dict[str, Any] = {"kind": "tpu_metrics", "step": step,
                                  "t_s": now - self.started}
        for name, (column, _, _) in METRICS.items():
            try:
                values = parse_values(self.sdk.get_metric(name).data())
            except Exception as exc:  # one metric missing in this libtpu must not end the run
                self.errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            if values:
                record[column] = sum(values) / len(values)
                record[f"{column}_per_chip"] = values
        self.samples += 1
        return record

    def summary(self) -> dict[str, Any]:
        """For the run's summary (``chip_metrics``): sampled or not, and why not."""
        return {"available": self.available, "reason": self.reason, "samples": self.samples,
                "source": SDK_MODULE, "metrics": {n: c for n, (c, _, _) in METRICS.items()},
                "errors": self.errors}
