"""Plain PyTorch in a worker: eager (the baseline) and ``torch.compile`` with inductor."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..environment.paths import cache_dir
from ..environment.runtimes import Runtime
from .backend import Backend, ChangeHooks, GraphBreaks, NoCounters, Step, make_optimizer, make_step


def inductor_cache_dir() -> Path:
    """Inductor's cache, one folder per torch version and ATen CPU capability.

    torch 2.9's cache key leaves the capability out: code cached under one (``AVX512`` here)
    and loaded under another (``ATEN_CPU_CAPABILITY=avx2`` or ``default``, or a home folder
    shared with an AVX2-only host) kills the worker with SIGBUS or fails to compile
    (reproduced with plain ``torch.compile`` and no workbench code)."""
    capability = torch.backends.cpu.get_cpu_capability().lower()
    return cache_dir() / "inductor" / f"torch-{torch.__version__}-{capability}"


class DynamoCounters(NoCounters):
    """torch.compile (inductor): counts the graphs Dynamo captured and compiled."""

    def __init__(self) -> None:
        from torch._dynamo.utils import counters

        self.counters = counters
        self.last = self._graphs()

    def _graphs(self) -> int:
        return int(self.counters["stats"]["unique_graphs"])

    def delta(self) -> dict[str, float]:
        now = self._graphs()
        out = {**super().delta(), "compiles": now - self.last}
        self.last = now
        return out


class TorchProfiler:
    """torch.profiler over the steps (a Chrome trace, ``torch.trace.json``); each step is marked
    ``train_step#<n>``."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.prof: Any = None

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self.prof.__enter__()

    def step(self, step: int) -> Any:
        return torch.profiler.record_function(f"train_step#{step}")

    def stop(self) -> None:
        self.prof.__exit__(None, None, None)
        self.prof.export_chrome_trace(str(self.folder / "torch.trace.json"))


class TorchBackend(Backend):
    """Plain PyTorch on the CPU (or CUDA): modes ``torch_eager`` and ``inductor``."""

    runtime = Runtime.TORCH

    def runtime_info(self) -> dict[str, Any]:
        return {"runtime": "torch", "device": "cuda" if torch.cuda.is_available() else "cpu",
                "device_count": max(torch.cuda.device_count(), 1),
                "threads": torch.get_num_threads()}

    def setup(self, spec: Any, family: Any, model: torch.nn.Module,
              hooks: ChangeHooks) -> Step:
        use_cuda = torch.cuda.is_available() and spec.device != "cpu"
        self.device = torch.device("cuda" if use_cuda else "cpu")
        model.to(self.device).train()
        opt = make_optimizer(spec, family, model)
        if spec.mode != "inductor":
            return make_step(family, model, opt, hooks)
        # Set before the first compile: inductor reads it when it first builds code.
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache_dir()))
        self.counters = DynamoCounters()
        self.breaks = GraphBreaks()
        return make_step(family, torch.compile(model), opt, hooks)

    def wait(self, loss: torch.Tensor | None = None) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def profiler(self, folder: Path) -> TorchProfiler:
        return TorchProfiler(folder)
