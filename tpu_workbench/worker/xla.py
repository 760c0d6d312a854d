"""torch_xla in a worker (XLA:CPU or a TPU): modes ``eager``, ``lazy``, ``compile`` and
``dynamo``; compile counters and causes, the compile caches, HLO dumps, the profiler, SPMD."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from ..environment.runtimes import Runtime
from .backend import (
    Backend,
    ChangeHooks,
    GraphBreaks,
    Step,
    make_optimizer,
    make_step,
    optimizer_state,
)
from .recompiles import CompileLog


class XLACounters:
    """Reads torch_xla's compile/execute counters; ``delta()`` gives the change since last read."""

    def __init__(self) -> None:
        import torch_xla.debug.metrics as met

        self.met = met
        self.last = self.read()

    def read(self) -> dict[str, float]:
        met = self.met

        def total_ms(name: str) -> float:
            data = met.metric_data(name)
            return data[1] / 1e6 if data else 0.0

        return {
            "compiles": met.counter_value("UncachedCompile") or 0,
            "cached": met.counter_value("CachedCompile") or 0,
            "compile_ms": total_ms("CompileTime") + total_ms("EagerOpCompileTime"),
            # SPMD runs through the replicated path, which counts ExecuteReplicated instead.
            "executions": (met.counter_value("ExecuteComputation") or 0)
            + (met.counter_value("ExecuteReplicated") or 0)
            + ((met.metric_data("EagerOpExecuteTime") or (0,))[0]),
        }

    def delta(self) -> dict[str, float]:
        now = self.read()
        # torch.compile's openxla bridge clears the counters while it compiles: after a reset
        # the change is the new value itself.
        out = {k: now[k] - self.last[k] if now[k] >= self.last[k] else now[k] for k in now}
        self.last = now
        return out


class FallbackCounters:
    """torch_xla's ``aten::<op>`` counters: one per op that ran outside XLA (torch_xla had no
    lowering for it here, so it ran on the CPU, its inputs copied to the host and back), counting
    calls. Reading them all costs well under a millisecond (see tests/test_fallbacks.py)."""

    def __init__(self) -> None:
        import torch_xla.debug.metrics as met

        self.met = met
        self.last = self.read()

    def read(self) -> dict[str, int]:
        met = self.met
        return {name: met.counter_value(name) or 0 for name in met.counter_names()
                if name.startswith("aten::")}

    def delta(self) -> dict[str, int]:
        """{op: calls} since the last read, ops with none left out. The openxla bridge clears
        every counter while Dynamo compiles: a counter below its last value restarted from zero
        (calls before the clear in that same step are lost)."""
        now = self.read()
        out = {}
        for op, n in now.items():
            before = self.last.get(op, 0)
            calls = n - before if n >= before else n
            if calls:
                out[op] = calls
        self.last = now
        return out


_PERSISTENT = ("PersistentCacheMiss", "PersistentCacheHit", "PersistentCacheDeserializeFailure")
_COMPILE_LOG: CompileLog | None = None


def compile_log() -> CompileLog:
    """One log follower per worker, so explanations can compare with every earlier graph."""
    global _COMPILE_LOG
    if _COMPILE_LOG is None:
        _COMPILE_LOG = CompileLog(os.environ.get("PT_XLA_DEBUG_FILE"))
    return _COMPILE_LOG


def _cache_counters() -> dict[str, float]:
    import torch_xla.debug.metrics as met

    names = ("UncachedCompile", "CachedCompile", *_PERSISTENT)
    return {n: met.counter_value(n) or 0 for n in names}


def persistent_note(p: dict[str, Any]) -> str:
    """What the persistent cache did in one run, in plain words."""
    if p["deserialize_failures"]:
        return (f"The persistent cache held {p['deserialize_failures']:g} of this run's graphs but "
                "they could not be read back: this PJRT backend cannot deserialize compiled "
                "executables (PersistentCacheDeserializeFailure; XLA:CPU never can), so the run "
                "compiled them again. On a TPU the executables load from the cache.")
    if p["hits"]:
        return f"{p['hits']:g} graph(s) loaded from the persistent cache instead of compiling."
    if p["misses"]:
        return (f"{p['misses']:g} graph(s) were not in the persistent cache yet: compiled and "
                f"written to {p['folder']} ({p['files']} files) for the next process.")
    return "The persistent cache was not consulted: every graph came from the in-process cache."


class HLOCapture:
    """Copies the HLO files XLA dumped during the run (the worker's XLA_FLAGS point XLA at a dump
    folder) into the run's ``hlo/`` folder: ``*before_optimizations.txt``,
    ``*after_optimizations.txt``, the memory-usage report and, when sharded, the
    SPMD-partitioning passes. XLA:CPU's per-kernel files (.ll, .o, .mlir) are left out."""

    KEEP = ("before_optimizations.txt", "after_optimizations.txt",
            "after_optimizations-memory-usage-report.txt")
    KEEP_PASSES = ("spmd-partitioning", "sharding-propagation")  # SPMD pass dumps (.txt)

    def __init__(self) -> None:
        folder = os.environ.get("TPU_WORKBENCH_HLO_DUMP")
        if not folder:
            raise RuntimeError("capture='hlo' needs the worker's HLO dump folder "
                               "(TPU_WORKBENCH_HLO_DUMP), which the runner sets for it")
        self.folder = Path(folder)
        self.before = set(os.listdir(self.folder))

    def collect(self, target: Path) -> list[str]:
        target.mkdir(parents=True, exist_ok=True)
        copied = []
        for name in sorted(set(os.listdir(self.folder)) - self.before):
            if name.endswith(self.KEEP) or (
                    name.endswith(".txt") and any(p in name for p in self.KEEP_PASSES)):
                shutil.copy2(self.folder / name, target / name)
                copied.append(name)
        self.before |= set(copied)
        return copied


class XLAProfiler:
    """torch_xla's profiler over the steps: an ``.xplane.pb`` and a Chrome ``.trace.json.gz``
    with one event per executed HLO op; each step is marked ``train_step`` with its number."""

    def __init__(self, folder: Path):
        self.folder = folder

    def start(self) -> None:
        import torch_xla.debug.profiler as xp

        self.folder.mkdir(parents=True, exist_ok=True)
        xp.start_trace(str(self.folder))

    def step(self, step: int) -> Any:
        import torch_xla

        # xp.StepTrace cannot wrap a torch_xla.compile'd call (it opens an IR scope that the
        # compile's sync rejects); a bare TraceMe marks the step without a scope.
        return torch_xla._XLAC.profiler.TraceMe("train_step", step_num=step, _r=1)

    def stop(self) -> None:
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.profiler as xp

        xm.wait_device_ops()
        xp.stop_trace()


class XLABackend(Backend):
    """torch_xla: the environment (PJRT_DEVICE, CPU_NUM_DEVICES, XLA_FLAGS, XLA_USE_SPMD) was set
    before this worker imported it."""

    runtime = Runtime.XLA

    def __init__(self) -> None:
        super().__init__()
        self.mesh: Any = None  # SPMD: the run's one mesh
        self.strategy: str | None = None
        self.log = CompileLog(None)
        self.cache_start: dict[str, float] = {}
        self.fallbacks: FallbackCounters | None = None

    def runtime_info(self) -> dict[str, Any]:
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        info: dict[str, Any] = {}
        cache = os.environ.get("TPU_WORKBENCH_XLA_CACHE")
        if cache:  # must come before the first compilation of the process
            Path(cache).mkdir(parents=True, exist_ok=True)
            xr.initialize_cache(cache, readonly=False)
            info["persistent_cache"] = cache
        if os.environ.get("XLA_USE_SPMD") == "1":
            xr.use_spmd()
        device = torch_xla.device()
        hw = xm.xla_device_hw(device)  # "TPU" / "CPU": the hardware type
        try:
            kind = xm.xla_device_kind(device)  # PJRT's kind: "TPU v6 lite", "cpu"
        except RuntimeError:  # SPMD: the virtual device "SPMD:0" has no kind to ask for
            from ..environment.backends import tpu_kind_on_pci

            kind = (tpu_kind_on_pci() or "TPU") if hw == "TPU" else hw.lower()
        info.update(runtime="xla", torch_xla=torch_xla.__version__,
                    pjrt_device=xr.device_type(), device=str(device), device_hw=hw,
                    device_kind=kind, device_count=xr.global_runtime_device_count(),
                    addressable_devices=xr.addressable_runtime_device_count(),
                    spmd=xr.is_spmd())
        return info

    def setup(self, spec: Any, family: Any, model: torch.nn.Module,
              hooks: ChangeHooks) -> Step:
        import torch_xla

        self.device = torch_xla.device()
        torch_xla.experimental.eager_mode(spec.mode == "eager")
        model.to(self.device).train()
        if spec.mesh:  # SPMD: one mesh for the run, also torch_xla's global mesh
            from . import spmd

            self.mesh, self.strategy = spmd.make_mesh(spec.mesh), spec.strategy
            spmd.shard_model(model, self.mesh, self.strategy)
        opt = make_optimizer(spec, family, model)
        if self.mesh is not None:
            spmd.shard_optimizer_state(opt, model, self.mesh, self.strategy,
                                       functools.partial(optimizer_state, spec.optimizer))
        step = self._step(spec, family, model, opt, hooks)
        with contextlib.suppress(Exception):
            torch_xla.sync()
        self.counters = XLACounters()
        self.fallbacks = FallbackCounters()
        self.breaks = GraphBreaks() if spec.mode == "dynamo" else None
        if "hlo" in spec.capture:  # after set-up's own sync: only the run's programs
            self.capture = HLOCapture()
        return step

    def _step(self, spec: Any, family: Any, model: torch.nn.Module,
              opt: torch.optim.Optimizer, hooks: ChangeHooks) -> Step:
        """The train step as the mode runs it."""
        import torch_xla

        step = make_step(family, model, opt, hooks)
        if spec.mode == "compile":
            return torch_xla.compile(step, name=f"{spec.model}_train_step")
        if spec.mode == "eager":  # every op is compiled (once) and run as it is called
            return step
        if spec.mode == "dynamo":
            step = make_step(family, torch.compile(model, backend="openxla"), opt, hooks)

        def synced_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            loss = step(batch)
            torch_xla.sync()  # lazy: cut the graph; dynamo: the optimizer update runs lazily
            return loss

        return synced_step

    def place(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        batch = super().place(batch)
        if self.mesh is not None:  # lay the batch out over the mesh's data axis
            from . import spmd

            batch = spmd.shard_batch(batch, self.mesh, self.strategy)
        return batch

    def chips(self) -> list[int]:
        if self.mesh is None:
            return super().chips()
        import torch_xla.runtime as xr

        # torch_xla's mesh spans every device of the slice (xs.Mesh checks it): on this host,
        # each device the process addresses
        return list(range(xr.addressable_runtime_device_count()))

    def layout_records(self, model: torch.nn.Module,
                       batch: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
        if self.mesh is None:
            return []
        from . import spmd

        return spmd.layout_records(model, batch, self.mesh.mesh_shape, self.strategy)

    def wait(self, loss: torch.Tensor | None = None) -> None:
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()

    def start_counting(self) -> None:
        self.wait()
        self.cache_start = _cache_counters()
        self.log = compile_log()
        self.counters.delta()
        if self.fallbacks is not None:
            self.fallbacks.delta()
        if self.breaks is not None:
            self.breaks.new(-1)

    def step_fallbacks(self, step: int) -> tuple[dict[str, int], list[dict[str, Any]]]:
        totals, records = super().step_fallbacks(step)
        ops = self.fallbacks.delta() if self.fallbacks is not None else {}
        records = [{"kind": "fallback", "step": step, "op": op, "count": n}
                   for op, n in sorted(ops.items())] + records
        return {"fallbacks": sum(ops.values()), **totals}, records

    def compile_records(self, step: int, counts: dict[str, float],
                        trigger: str) -> list[dict[str, Any]]:
        events = self.log.new_events()
        out = [{"kind": "compile", "step": step, "count": 1, "trigger": trigger, **e}
               for e in events]
        if counts["compiles"] and not events:
            out.append({"kind": "compile", "step": step, "count": counts["compiles"],
                        "cause": "", "trigger": trigger,
                        "explanation": f"{counts['compiles']:g} compilation(s); run with "
                        "explain_compiles=True for torch_xla's cause"})
        return out

    def evaluation_device(self) -> torch.device:
        """The host CPU on XLA:CPU, whose device is that CPU anyway: eager PyTorch evaluates
        there with no program of its own to compile (minGPT tiny 1.7 s, UNet tiny 7 s of
        XLA:CPU compile saved per run). A TPU evaluates on the chip."""
        import torch_xla.runtime as xr

        return torch.device("cpu") if xr.device_type() == "CPU" else self.device

    def after_evaluation(self) -> None:
        self.log.new_events()

    def profiler(self, folder: Path) -> XLAProfiler:
        return XLAProfiler(folder)

    def hlo_capture(self) -> HLOCapture:
        return self.capture

    def memory_info(self) -> dict[str, Any]:
        import torch_xla.core.xla_model as xm

        out = super().memory_info()
        try:
            out["device_memory"] = xm.get_memory_info(self.device)
            out["device_memory_source"] = "xm.get_memory_info"
        except RuntimeError as exc:  # XLA:CPU: "GetAllocatorStats is not supported"
            out["device_memory"] = None
            out["device_memory_source"] = f"not available on this backend ({exc})"[:160]
        return out

    def cache_info(self, runs_before: int) -> dict[str, Any]:
        """Also ``compiles`` (misses of the in-process cache: new executables), ``cache_hits``
        (graphs served from it), ``cached_graphs`` (held by the worker after the run) and, with
        ``persistent_cache``, what the on-disk cache did; a persistent cache written but not
        read back is stated in ``persistent_note``."""
        import torch_xla.runtime as xr

        out = super().cache_info(runs_before)
        now = _cache_counters()
        delta = {k: now[k] - self.cache_start.get(k, 0) for k in now}
        out.update(compiles=delta["UncachedCompile"], cache_hits=delta["CachedCompile"],
                   cached_graphs=xr.get_num_cached_compilation_graph())
        folder = os.environ.get("XLA_PERSISTENT_CACHE_PATH")
        if folder:
            files = [p for p in Path(folder).iterdir() if p.is_file()]
            out["persistent"] = {
                "folder": folder, "files": len(files),
                "bytes": sum(p.stat().st_size for p in files),
                "misses": delta["PersistentCacheMiss"], "hits": delta["PersistentCacheHit"],
                "deserialize_failures": delta["PersistentCacheDeserializeFailure"]}
            out["persistent_note"] = persistent_note(out["persistent"])
        return out
