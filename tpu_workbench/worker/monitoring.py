"""Live chip metrics in a worker, from libtpu's monitoring SDK (``libtpu.sdk.tpumonitoring``).

What ``tpu-info`` shows, read by the worker while a run goes on: the TensorCore duty cycle, HBM
in use and TensorCore utilisation. The SDK gives one value per chip of the host; a run reports
the chips it uses (:meth:`~tpu_workbench.worker.backend.Backend.chips`: its one device, or every
device of its mesh), each and their mean, and names them (``chips``): a one-chip run on a v6e-8
reads its own chip's duty cycle, not an eighth of it. One ``kind="tpu_metrics"`` record is
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
    return list(parse_chips(data).values())


def parse_chips(data: Any) -> dict[int, float]:
    """Chip index -> value from what ``LibtpuSdkMetric.data()`` returns: the index an entry
    names (``"3: 12.5"``), else its place in the list (the host's chips in device order); what
    is not a number is dropped."""
    out = {}
    for place, item in enumerate(data if isinstance(data, list | tuple) else [data]):
        head, _, text = str(item).rpartition(":")
        try:
            value = float(text.strip().rstrip("%"))
        except ValueError:
            continue
        named = head.split()[-1] if head.split() else ""  # "3", "chip 3"
        if math.isfinite(value):
            out[int(named) if named.isdigit() else place] = value
    return out


class ChipMonitor:
    """Samples :data:`METRICS` of the run's `chips` (host device indices; None: every chip of
    the host), each chip's and their mean, between steps."""

    def __init__(self, sdk: Any = None, reason: str | None = None,
                 every_s: float = SAMPLE_EVERY_S, chips: list[int] | None = None) -> None:
        self.reason = unavailable_reason() if sdk is None and reason is None else (reason or "")
        if sdk is None and not self.reason:
            sdk = importlib.import_module(SDK_MODULE)
        self.sdk = sdk
        self.every_s = every_s
        self.chips = None if chips is None else [int(c) for c in chips]
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
                                  "t_s": now - self.started, "chips": self.chips}
        for name, (column, _, _) in METRICS.items():
            try:
                host = parse_chips(self.sdk.get_metric(name).data())
            except Exception as exc:  # one metric missing in this libtpu must not end the run
                self.errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            chips = sorted(host) if self.chips is None else self.chips
            record["chips"] = chips
            if not all(c in host for c in chips):
                self.errors[name] = (f"chips {[c for c in chips if c not in host]} of the run "
                                     f"are not among the SDK's chips {sorted(host)}")
                continue
            values = [host[c] for c in chips]
            if values:
                record[column] = sum(values) / len(values)
                record[f"{column}_per_chip"] = values
        self.samples += 1
        return record

    def summary(self) -> dict[str, Any]:
        """For the run's summary (``chip_metrics``): sampled or not, and why not."""
        return {"available": self.available, "reason": self.reason, "samples": self.samples,
                "chips": self.chips, "source": SDK_MODULE,
                "metrics": {n: c for n, (c, _, _) in METRICS.items()}, "errors": self.errors}
