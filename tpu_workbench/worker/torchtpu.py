"""TorchTPU in a worker (``torch_tpu`` 0.2.0, under ``.venv-torchtpu``'s interpreter): the
``"tpu"`` device, modes ``tpu_eager``, ``tpu_fused`` and ``tpu_compile``, the compile-cache
counters, StableHLO capture and TorchTPU's profiler config. The parent's half (status, the API
check, which interpreter runs the worker) is :mod:`tpu_workbench.environment.torchtpu`."""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

import torch

from ..environment.runtimes import Runtime
from ..environment.torchtpu import DEVICE_TYPE, MODE_EAGER, dry_run, lookup, status, version
from .backend import Backend, ChangeHooks, Step, make_optimizer, make_step


class CacheCounters:
    """Per-step deltas of ``torch.tpu._get_cache_stats()``: ``compiles`` (new compilations),
    ``cached`` (cache hits), ``compile_ms`` (compile time of the entries added, from
    ``per_entry_stats[i].compilation_duration`` in µs) and ``executions`` (cache requests: one
    per materialised graph)."""

    def __init__(self, stats_fn: Any = None) -> None:
        if stats_fn is None:
            import torch

            stats_fn = torch.tpu._get_cache_stats
        self.stats_fn = stats_fn
        self.last = self.read()

    def read(self) -> dict[str, float]:
        s = self.stats_fn()
        entries = list(s.per_entry_stats)
        return {"compiles": s.num_compilations, "cached": s.num_cache_hits,
                "compile_ms": sum(e.compilation_duration for e in entries) / 1e3,
                "executions": s.num_cache_reqs}

    def delta(self) -> dict[str, float]:
        now = self.read()
        out = {k: now[k] - self.last[k] if now[k] >= self.last[k] else now[k] for k in now}
        self.last = now
        return out

    def summary(self) -> dict[str, Any]:
        """The cache as a whole, for the run's summary (``cache``)."""
        s = self.stats_fn()
        return {"source": "torch.tpu._get_cache_stats()", "requests": s.num_cache_reqs,
                "hits": s.num_cache_hits, "compilations": s.num_compilations,
                "peak_compilation_host_memory_bytes": s.peak_compilation_host_memory_bytes,
                "entries": [{"compilation_ms": e.compilation_duration / 1e3,
                             "read_count": e.read_count} for e in s.per_entry_stats]}


class StableHLOCapture:
    """Collects what ``torch.compile(backend="tpu", options={"debug_callback": cb})`` hands
    back (a ``TpuCompileDebug`` per compiled graph; backward artifacts arrive after
    ``.backward()``) and writes it to the run's ``hlo/`` folder:
    ``graph<i>.forward.stablehlo.txt``, ``graph<i>.backward.stablehlo.txt`` and the FX graphs
    (``graph<i>.fx.txt``)."""

    FIELDS = {"stablehlo_forward_text": "forward.stablehlo.txt",
              "stablehlo_backward_text": "backward.stablehlo.txt",
              "pre_autograd_fx_readable": "fx.txt"}

    def __init__(self) -> None:
        self.graphs: list[Any] = []

    def callback(self, debug: Any) -> None:
        self.graphs.append(debug)

    def collect(self, target: Path) -> list[str]:
        target.mkdir(parents=True, exist_ok=True)
        written = []
        for i, debug in enumerate(self.graphs):
            for field, suffix in self.FIELDS.items():
                text = getattr(debug, field, None)
                if text:
                    name = f"graph{i}.{suffix}"
                    (target / name).write_text(str(text))
                    written.append(name)
        return written


class TorchTPUProfiler:
    """The TorchTPU profile: ``torch.profiler.profile`` with TorchTPU's Kineto config
    (``experimental_config=torch.tpu.profiler.TpuProfilerConfig(run_dir=...)``), which writes
    xprof's ``.xplane.pb`` under the run's ``profile/`` folder; the host side is also exported as
    a Chrome trace (``torch.trace.json``). Same interface as the other profilers."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.prof: Any = None

    def config(self) -> Any:
        import torch

        return torch.tpu.profiler.TpuProfilerConfig(run_dir=str(self.folder))

    def activities(self) -> list[Any]:
        import torch

        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.accelerator.is_available():  # the device side registers as PrivateUse1
            acts.append(torch.profiler.ProfilerActivity.PrivateUse1)
        return acts

    def start(self) -> None:
        import torch

        self.folder.mkdir(parents=True, exist_ok=True)
        self.prof = torch.profiler.profile(activities=self.activities(),
                                           experimental_config=self.config())
        self.prof.__enter__()

    def step(self, step: int) -> Any:
        import torch

        return torch.profiler.record_function(f"train_step#{step}")

    def stop(self) -> None:
        import torch

        if torch.accelerator.is_available():
            torch.accelerator.synchronize()
        self.prof.__exit__(None, None, None)
        self.prof.export_chrome_trace(str(self.folder / "torch.trace.json"))


def eager_mode(name: str) -> Any:
    """The ``torch.tpu.EagerMode`` member of a workbench mode (tpu_eager, tpu_fused)."""
    return getattr(torch.tpu.EagerMode, MODE_EAGER[name])


class TorchTPUBackend(Backend):
    """TorchTPU on a chip: the model and optimizer on ``"tpu"``, the eager mode set, the step
    compiled for ``tpu_compile``."""

    runtime = Runtime.TORCH_TPU

    def runtime_info(self) -> dict[str, Any]:
        """What a TorchTPU worker sees: the device, its name and count (needs a chip)."""
        import torch

        info: dict[str, Any] = {"runtime": "torch_tpu", "torch": torch.__version__,
                                "torch_tpu": version()}
        if dry_run() and not torch.accelerator.is_available():
            importlib.import_module("torch_tpu")  # torch.tpu, also where autoload is off
            info.update(device="cpu", device_kind="cpu (TorchTPU dry run, no TPU)", device_count=1,
                        dry_run=True)
            return info
        if not torch.accelerator.is_available():
            raise RuntimeError(f"TorchTPU registered no 'tpu' device: {status().reason}")
        props = torch.tpu.get_device_properties()
        # TorchTPU's own peak per device (its hardware table; v7 exposes two devices per chip).
        peak = lookup("torch_tpu._internal.utils.hardware.get_bf16_flops_per_device")()
        info.update(device=DEVICE_TYPE, device_hw="TPU", device_kind=torch.tpu.get_device_name(),
                    device_count=torch.accelerator.device_count(),
                    hbm_bytes=getattr(props, "total_memory", None),
                    peak_flops_per_device=float(peak) if peak else None)
        return info

    def setup(self, spec: Any, family: Any, model: torch.nn.Module,
              hooks: ChangeHooks) -> Step:
        if not torch.accelerator.is_available():  # also in a dry run: see DRY_RUN_ENV
            raise RuntimeError(f"mode {spec.mode!r}: TorchTPU registered no 'tpu' device "
                               f"({status().reason})")
        self.device = torch.device(DEVICE_TYPE)
        torch.compiler.reset()
        torch.tpu._clear_cache()  # the run's cache statistics start from zero
        # Strict eager is TorchTPU's default; the compiled mode keeps it for the optimizer step.
        torch.tpu.eager_mode = eager_mode("tpu_fused" if spec.mode == "tpu_fused"
                                          else "tpu_eager")
        model.to(self.device).train()
        opt = make_optimizer(spec, family, model)
        self.counters = CacheCounters()
        if spec.mode != "tpu_compile":
            return make_step(family, model, opt, hooks)
        self.capture = StableHLOCapture() if "hlo" in spec.capture else None
        options = {"debug_callback": self.capture.callback} if self.capture else {}
        compiled = torch.compile(model, backend=DEVICE_TYPE, dynamic=False, options=options)
        return make_step(family, compiled, opt, hooks)

    synced_at = float("nan")  # perf_counter() when synchronize() returned, in the last wait

    def wait(self, loss: torch.Tensor | None = None) -> None:
        # torch.accelerator.synchronize() has been seen not to wait for torch.compile(backend=
        # "tpu") work (pytorch/helion#3155): a device-to-host read of the step's loss does. Both
        # are timed (wait_marks), so a run shows whether synchronize() alone would have lied.
        torch.accelerator.synchronize()
        self.synced_at = time.perf_counter()
        if loss is not None:
            loss.detach().to("cpu")

    def wait_marks(self, t0: float) -> dict[str, float]:
        # sync_ms: the step timed by synchronize() alone; wall_ms adds the loss's read
        return {"sync_ms": (self.synced_at - t0) * 1e3}

    def memory_info(self) -> dict[str, Any]:
        out = super().memory_info()
        try:  # TorchTPU's HBM figures: a text summary (0.2.0) and the device's capacity
            out["hbm_summary"] = str(torch.tpu._hbm_usage_summary())
            out["hbm_bytes"] = getattr(torch.tpu.get_device_properties(), "total_memory", None)
            out["device_memory_source"] = "torch.tpu._hbm_usage_summary()"
        except Exception as exc:  # no chip (a dry run), or the API moved: say so, keep the run
            out["device_memory_source"] = f"not available ({type(exc).__name__}: {exc})"[:160]
        return out

    def profiler(self, folder: Path) -> TorchTPUProfiler:
        return TorchTPUProfiler(folder)

    def hlo_capture(self) -> StableHLOCapture:
        if self.capture is None:
            raise RuntimeError("capture='hlo' with TorchTPU needs mode 'tpu_compile'")
        return self.capture

    def cache_info(self, runs_before: int) -> dict[str, Any]:
        return {**super().cache_info(runs_before), **self.counters.summary()}
