"""The training loop that runs inside a worker, in every execution mode.

Runs in the worker process only (it imports torch_xla for XLA modes). One step record is streamed
per training step, after waiting for the device, with these fields:

============== =============================================================================
kind           ``"step"``
step           0-based step index (step 0 includes compilation)
wall_ms        wall time of the step in ms, measured after the device finished its work
loss           training loss of the step (read after the clock stopped)
compiles       new (uncached) XLA compilations during the step (0 for plain PyTorch)
cached         compilations served from the in-process cache during the step
compile_ms     XLA compile time spent in the step (ms)
executions     XLA executions during the step
============== =============================================================================

For every XLA compilation a ``kind="compile"`` record follows its step's record: ``step``,
``cause`` (torch_xla's words), ``explanation`` (ours), ``graph_hash``, ``inputs``, ``outputs`` and
``frame`` (the Python line that triggered it); see :mod:`tpu_workbench.recompiles`. Without
``explain_compiles`` one such record per step that compiled gives only the ``count``.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import models
from .recompiles import CompileLog
from .spec import CHANGES, MODES, ExperimentSpec

N_BATCHES = 8  # distinct generated batches, cycled through (all moved to the device up front)


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


class NoCounters:
    """Plain PyTorch eager compiles nothing."""

    def delta(self) -> dict[str, float]:
        return {"compiles": 0, "cached": 0, "compile_ms": 0.0, "executions": 0}


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


def init_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Create Adam's state up front, as its first step would, so step 0 and step 1 trace the same
    graph (otherwise the state appearing at step 1 is a second XLA compilation)."""
    for group in opt.param_groups:
        for p in group["params"]:
            if p.requires_grad and not opt.state[p]:
                opt.state[p] = {
                    "step": torch.tensor(0.0),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }


def _to(batch: dict[str, torch.Tensor], device: Any) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


def train(ctx: Any, spec_dict: dict[str, Any]) -> dict[str, Any]:
    """Train per `spec_dict` (an ExperimentSpec as a dict), streaming one record per step."""
    global _RUNS_SERVED
    spec = ExperimentSpec.from_dict(spec_dict)
    mode = MODES[spec.mode]
    runs_before, _RUNS_SERVED = _RUNS_SERVED, _RUNS_SERVED + 1
    family = models.get_model(spec.model)
    cfg = family.config(spec.preset, **spec.options)
    batch_size = spec.batch_size or family.default_batch_size(cfg)

    torch.manual_seed(spec.seed)
    model = family.build(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(spec.seed)
    n_batches = min(spec.steps, N_BATCHES)
    cpu_batches = [family.make_batch(cfg, batch_size, gen) for _ in range(n_batches)]
    changed = []  # batches of the new shape, for change="batch_size"
    if spec.change == "batch_size":
        changed = [family.make_batch(cfg, 2 * batch_size, gen) for _ in range(n_batches)]
    elif spec.change == "seq_len":
        changed = [_shorter(b, family.sequence_dim) for b in cpu_batches]
    eval_batch = family.make_batch(cfg, batch_size, torch.Generator().manual_seed(spec.seed + 1))

    hooks = _ChangeHooks(spec.change)
    if mode.runtime == "xla":
        mesh = None
        if spec.mesh:  # SPMD: one mesh for the run, also torch_xla's global mesh
            from . import sharding

            mesh = sharding.make_mesh(spec.mesh)
        step_fn, device, wait, counters = _xla_setup(spec, family, model, hooks, mesh)
    elif mode.runtime == "torch_tpu":  # TorchTPU on a chip (see tpu_workbench.torchtpu)
        from . import torchtpu

        step_fn, device, wait, counters = torchtpu.setup(spec, family, model, hooks,
                                                         _make_step, _optimizer)
    else:
        step_fn, device, wait, counters = _torch_setup(spec, family, model, hooks)
    hooks.device_type = device.type
    batches = [_to(b, device) for b in cpu_batches]
    changed = [_to(b, device) for b in changed]
    if spec.mesh:  # SPMD: lay the batch out over the mesh's data axis (strategy permitting)
        from . import sharding

        batches = [sharding.shard_batch(b, mesh, spec.strategy) for b in batches]
        changed = [sharding.shard_batch(b, mesh, spec.strategy) for b in changed]
        for record in sharding.layout_records(model, batches[0], spec.mesh, spec.strategy):
            ctx.emit({"kind": "layout", **record})
    wait()
    cache_start = _cache_counters() if mode.runtime == "xla" else {}
    compile_log = _compile_log() if mode.runtime == "xla" else CompileLog(None)
    counters.delta()  # start counting from here: moving data is not part of a step

    ctx.emit({"kind": "info", "n_params": n_params, "batch_size": batch_size,
              "device": str(device)})
    hlo_capture = (torchtpu.hlo_capture() if mode.runtime == "torch_tpu" else HLOCapture()) \
        if "hlo" in spec.capture else None
    profiler = (torchtpu.Profiler if mode.runtime == "torch_tpu" else Profiler)(
        ctx.out_dir / "profile", mode.runtime) if "profile" in spec.capture else None
    losses = []
    if profiler:
        profiler.start()
    try:
        for step in range(spec.steps):
            ctx.check_cancel()
            hooks.active = spec.change is not None and step >= spec.change_at
            source = changed if hooks.active and changed else batches
            batch = source[step % len(source)]
            with profiler.step(step) if profiler else contextlib.nullcontext():
                t0 = time.perf_counter()
                loss = step_fn(batch)
                wait()
                wall_ms = (time.perf_counter() - t0) * 1e3
            counts = counters.delta()
            loss_value = float(loss.detach().to("cpu"))
            losses.append(loss_value)
            ctx.emit({"kind": "step", "step": step, "wall_ms": wall_ms, "loss": loss_value,
                      **counts})
            trigger = CHANGES[spec.change] if spec.change and step == spec.change_at else ""
            _emit_compiles(ctx, step, counts, compile_log, mode.runtime, trigger)
    finally:  # a cancelled or failed run still closes its trace (in its -failed folder)
        if profiler:
            profiler.stop()
    if hlo_capture:  # before evaluation, which compiles a graph of its own
        hlo_capture.collect(ctx.out_dir / "hlo")
    if "checkpoint" in spec.capture:  # trained weights, on the CPU, for sampling or inspection
        torch.save({k: v.detach().to("cpu") for k, v in model.state_dict().items()},
                   ctx.out_dir / "model.pt")
    model.eval()
    with torch.no_grad():
        metric = float(family.evaluate(model, _to(eval_batch, device)).to("cpu"))
    compile_log.new_events()  # the evaluation's own graph: not a training step's compile
    return {
        "model": spec.model, "preset": spec.preset, "mode": spec.mode, "steps": spec.steps,
        "batch_size": batch_size, "n_params": n_params,
        "items_per_step": family.items_per_batch(cfg, batch_size), "item_unit": family.item_unit,
        "flops_per_step": family.flops_per_step(cfg, batch_size),
        "metric_name": family.metric_name, "metric": metric,
        "final_loss": losses[-1] if losses else math.nan, "device": str(device),
        "memory": memory_info(device, mode.runtime),
        "cache": cache_info(mode.runtime, cache_start, runs_before),
    }


def _emit_compiles(ctx: Any, step: int, counts: dict[str, float], log: CompileLog,
                   runtime: str, trigger: str = "") -> None:
    """Compile records of one step; `trigger` names what the spec changed at this step."""
    events = log.new_events()
    for event in events:
        ctx.emit({"kind": "compile", "step": step, "count": 1, "trigger": trigger, **event})
    if counts["compiles"] and not events and runtime == "xla":
        ctx.emit({"kind": "compile", "step": step, "count": counts["compiles"], "cause": "",
                  "trigger": trigger,
                  "explanation": f"{counts['compiles']:g} compilation(s); run with "
                  "explain_compiles=True for torch_xla's cause"})


def _shorter(batch: dict[str, torch.Tensor], dim: int | None) -> dict[str, torch.Tensor]:
    """The batch with its sequences cut by a quarter (change="seq_len")."""
    assert dim is not None  # validated: only sequence models offer seq_len
    return {k: v.narrow(dim, 0, v.shape[dim] - v.shape[dim] // 4).clone() for k, v in batch.items()}


_PERSISTENT = ("PersistentCacheMiss", "PersistentCacheHit", "PersistentCacheDeserializeFailure")
_RUNS_SERVED = 0  # train runs this worker process has started (0 for the first: a cold worker)


def _cache_counters() -> dict[str, float]:
    import torch_xla.debug.metrics as met

    names = ("UncachedCompile", "CachedCompile", *_PERSISTENT)
    return {n: met.counter_value(n) or 0 for n in names}


def cache_info(runtime: str, start: dict[str, float], runs_before: int) -> dict[str, Any]:
    """The compilation caches as this run saw them (step 0 to evaluation).

    ``compiles`` (misses of the in-process cache: new executables), ``cache_hits`` (graphs served
    from it), ``cached_graphs`` (held by the worker after the run), ``worker_runs_before`` (0: the
    worker was cold) and, with ``persistent_cache``, what the on-disk cache did. A persistent
    cache that was written but could not be read back is stated in ``persistent_note``.
    """
    out: dict[str, Any] = {"worker_runs_before": runs_before}
    if runtime == "torch_tpu":  # torch.tpu._get_cache_stats(), see tpu_workbench.torchtpu
        from .torchtpu import CacheCounters

        out.update(CacheCounters().summary())
    if runtime != "xla":
        return out
    import torch_xla.runtime as xr

    now = _cache_counters()
    delta = {k: now[k] - start.get(k, 0) for k in now}
    out.update(compiles=delta["UncachedCompile"], cache_hits=delta["CachedCompile"],
               cached_graphs=xr.get_num_cached_compilation_graph())
    folder = os.environ.get("XLA_PERSISTENT_CACHE_PATH")
    if folder:
        files = [p for p in Path(folder).iterdir() if p.is_file()]
        out["persistent"] = {
            "folder": folder, "files": len(files), "bytes": sum(p.stat().st_size for p in files),
            "misses": delta["PersistentCacheMiss"], "hits": delta["PersistentCacheHit"],
            "deserialize_failures": delta["PersistentCacheDeserializeFailure"]}
        out["persistent_note"] = persistent_note(out["persistent"])
    return out


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


def memory_info(device: Any, runtime: str) -> dict[str, Any]:
    """What the backend says about memory, labelled by source: the device allocator where it
    has one (TPU), and this worker's peak RSS (XLA:CPU's "device memory" is host memory)."""
    import resource

    out: dict[str, Any] = {"worker_peak_rss_bytes":
                           resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if runtime == "xla":
        import torch_xla.core.xla_model as xm

        try:
            out["device_memory"] = xm.get_memory_info(device)
            out["device_memory_source"] = "xm.get_memory_info"
        except RuntimeError as exc:  # XLA:CPU: "GetAllocatorStats is not supported"
            out["device_memory"] = None
            out["device_memory_source"] = f"not available on this backend ({exc})"[:160]
    return out


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
            raise RuntimeError("capture='hlo' needs an XLA mode (plain PyTorch compiles no HLO)")
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


class Profiler:
    """Captures a trace of the steps: torch_xla's profiler for XLA modes (an ``.xplane.pb`` and
    a Chrome ``.trace.json.gz`` with one event per executed HLO op), torch.profiler for plain
    PyTorch (a Chrome trace). Each step is marked ``train_step`` with its step number."""

    def __init__(self, folder: Path, runtime: str):
        self.folder = folder
        self.runtime = runtime
        self.torch_prof: Any = None

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.runtime == "xla":
            import torch_xla.debug.profiler as xp

            xp.start_trace(str(self.folder))
        else:
            self.torch_prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU])
            self.torch_prof.__enter__()

    def step(self, step: int) -> Any:
        if self.runtime == "xla":
            import torch_xla

            # xp.StepTrace cannot wrap a torch_xla.compile'd call (it opens an IR scope that
            # the compile's sync rejects); a bare TraceMe marks the step without a scope.
            return torch_xla._XLAC.profiler.TraceMe("train_step", step_num=step, _r=1)
        return torch.profiler.record_function(f"train_step#{step}")

    def stop(self) -> None:
        if self.runtime == "xla":
            import torch_xla.core.xla_model as xm
            import torch_xla.debug.profiler as xp

            xm.wait_device_ops()
            xp.stop_trace()
        else:
            self.torch_prof.__exit__(None, None, None)
            self.torch_prof.export_chrome_trace(str(self.folder / "torch.trace.json"))


_COMPILE_LOG: CompileLog | None = None


def _compile_log() -> CompileLog:
    """One log follower per worker, so explanations can compare with every earlier graph."""
    global _COMPILE_LOG
    if _COMPILE_LOG is None:
        _COMPILE_LOG = CompileLog(os.environ.get("PT_XLA_DEBUG_FILE"))
    return _COMPILE_LOG


class _ChangeHooks:
    """The in-step part of ``spec.change`` ("item", "keep_tensor", "dtype"), switched on at
    change_at."""

    def __init__(self, change: str | None):
        self.change = change
        self.active = False
        self.kept: list[torch.Tensor] = []
        self.device_type = "cpu"

    def forward_context(self) -> Any:
        if self.active and self.change == "dtype":
            return torch.autocast(self.device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def after_loss(self, loss: torch.Tensor) -> None:
        if not self.active:
            return
        if self.change == "item":
            loss.item()  # reading a value mid-step forces XLA to run what was traced so far
        elif self.change == "keep_tensor":
            self.kept[:] = [loss.detach() * 2]  # one more live tensor: a new graph output


def _make_step(family: models.ModelFamily, model: torch.nn.Module, opt: torch.optim.Optimizer,
               hooks: _ChangeHooks) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    def train_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with hooks.forward_context():
            loss = family.loss(model, batch)
        hooks.after_loss(loss)
        loss.backward()
        opt.step()
        return loss

    return train_step


def _optimizer(spec: ExperimentSpec, family: models.ModelFamily,
               model: torch.nn.Module) -> torch.optim.Optimizer:
    # foreach=False: one simple loop per parameter, the same program on every backend.
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr or family.default_lr, foreach=False)
    init_optimizer_state(opt)
    return opt


def _torch_setup(spec: ExperimentSpec, family: models.ModelFamily, model: torch.nn.Module,
                 hooks: _ChangeHooks):
    device = torch.device("cuda" if torch.cuda.is_available() and spec.device != "cpu" else "cpu")
    model.to(device).train()
    opt = _optimizer(spec, family, model)
    counters: NoCounters = NoCounters()
    if spec.mode == "inductor":
        from .paths import cache_dir

        # Set before the first compile: inductor reads it when it first builds code.
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
        step = _make_step(family, torch.compile(model), opt, hooks)
        counters = DynamoCounters()
    else:
        step = _make_step(family, model, opt, hooks)
    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    return step, device, wait, counters


def _xla_setup(spec: ExperimentSpec, family: models.ModelFamily, model: torch.nn.Module,
               hooks: _ChangeHooks, mesh: Any = None):
    import torch_xla
    import torch_xla.core.xla_model as xm

    device = torch_xla.device()
    torch_xla.experimental.eager_mode(spec.mode == "eager")
    model.to(device).train()
    if mesh is not None:
        from . import sharding

        sharding.shard_model(model, mesh, spec.strategy)  # mark_sharding on every parameter
    opt = _optimizer(spec, family, model)
    if mesh is not None:
        sharding.shard_optimizer_state(opt, model, mesh, spec.strategy)
    step = _make_step(family, model, opt, hooks)

    def wait() -> None:
        xm.wait_device_ops()

    if spec.mode == "lazy":
        def lazy_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            loss = step(batch)
            torch_xla.sync()
            return loss
        fn = lazy_step
    elif spec.mode == "compile":
        fn = torch_xla.compile(step, name=f"{spec.model}_train_step")
    elif spec.mode == "dynamo":
        compiled = torch.compile(model, backend="openxla")
        dyn_step = _make_step(family, compiled, opt, hooks)

        def dynamo_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            loss = dyn_step(batch)
            torch_xla.sync()  # the optimizer update runs lazily outside the dynamo graphs
            return loss
        fn = dynamo_step
    else:  # eager: every op is compiled (once) and run as it is called
        fn = step
    with contextlib.suppress(Exception):
        torch_xla.sync()
    return fn, device, wait, XLACounters()
