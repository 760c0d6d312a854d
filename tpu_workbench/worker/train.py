"""The training loop that runs inside a worker, the same for every runtime.

One ``kind="step"`` record is streamed per training step, after waiting for the device (the
columns are documented in :mod:`tpu_workbench.records`); for every XLA compilation a
``kind="compile"`` record follows its step's record (see :mod:`tpu_workbench.worker.recompiles`),
then one ``kind="fallback"`` record per op that ran outside XLA and one ``kind="graph_break"``
record per graph break Dynamo made (both read after the step's clock stopped). On a TPU with
libtpu's monitoring SDK a ``kind="tpu_metrics"`` record follows a step at most every 0.5 s
(:mod:`tpu_workbench.worker.monitoring`).
What differs between runtimes is the :class:`~tpu_workbench.worker.backend.Backend` object.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import torch

from .. import models
from ..runs.spec import CHANGES, ExperimentSpec
from .backend import Backend, Batch, ChangeHooks
from .monitoring import ChipMonitor

# Distinct generated training batches, cycled through and all moved to the device up front (no
# host-to-device copy inside a timed step): as many as the run has steps, up to MAX_BATCHES and
# BATCH_MEMORY bytes. Eight batches, as before, let a short ResNet run memorise 64 images and
# score at chance on new ones.
MAX_BATCHES = 64
BATCH_MEMORY = 256 * 2**20
_RUNS_SERVED = 0  # train runs this worker process has started (0 for the first: a cold worker)


def _shorter(batch: Batch, dim: int | None) -> Batch:
    """The batch with its sequences cut by a quarter (change="seq_len")."""
    assert dim is not None  # validated: only sequence models offer seq_len
    return {k: v.narrow(dim, 0, v.shape[dim] - v.shape[dim] // 4).clone() for k, v in batch.items()}


def _nbytes(batch: Batch) -> int:
    return sum(v.numel() * v.element_size() for v in batch.values())


def _batches(spec: ExperimentSpec, family: Any, cfg: Any,
             batch_size: int) -> tuple[list[Batch], list[Batch], list[Batch]]:
    """The run's generated batches on the CPU: training, after ``spec.change`` (batch_size,
    seq_len; else none), and the held-out evaluation set (:func:`evaluation_batches`)."""
    gen = torch.Generator().manual_seed(spec.seed)
    batches = [family.make_batch(cfg, batch_size, gen)]  # steps=0 (a layout only) places one
    wanted = min(spec.steps, MAX_BATCHES, max(1, BATCH_MEMORY // max(_nbytes(batches[0]), 1)))
    batches += [family.make_batch(cfg, batch_size, gen) for _ in range(wanted - 1)]
    changed: list[Batch] = []
    if spec.change == "batch_size":
        changed = [family.make_batch(cfg, 2 * batch_size, gen) for _ in batches]
    elif spec.change == "seq_len":
        changed = [_shorter(b, family.sequence_dim) for b in batches]
    return batches, changed, evaluation_batches(spec, family, cfg, batch_size)


def evaluation_batches(spec: ExperimentSpec, family: Any, cfg: Any,
                       batch_size: int) -> list[Batch]:
    """The held-out set: at least ``family.eval_items`` items (512 by default, so an accuracy's
    sampling noise is about 2 points) in batches of the run's size, drawn with their own seed."""
    gen = torch.Generator().manual_seed(spec.seed + 1)
    return [family.make_batch(cfg, batch_size, gen)
            for _ in range(-(-family.eval_items // batch_size))]


def _evaluate(family: Any, model: torch.nn.Module, batches: list[Batch],
              device: torch.device) -> float:
    """The family's metric of the trained `model` over the held-out `batches` (equal sizes, so
    the mean of the batches' metrics), on `device` (the model moves there: training is over)."""
    model.eval()
    with torch.no_grad():
        model.to(device)
        return float(family.evaluate_batches(
            model, [{k: v.to(device) for k, v in b.items()} for b in batches]))


def train(ctx: Any, spec_dict: dict[str, Any], backend: Backend) -> dict[str, Any]:
    """Train per `spec_dict` (an ExperimentSpec as a dict) on `backend`, streaming one record
    per step; return the run's summary."""
    global _RUNS_SERVED
    spec = ExperimentSpec.from_dict(spec_dict)
    started = time.perf_counter()
    runs_before, _RUNS_SERVED = _RUNS_SERVED, _RUNS_SERVED + 1
    family = models.get_model(spec.model)
    cfg = family.config(spec.preset, **spec.options)
    batch_size = spec.batch_size or family.default_batch_size(cfg)
    torch.manual_seed(spec.seed)
    model = family.build(cfg)
    n_params = models.n_params(model)
    cpu_batches, cpu_changed, eval_batches = _batches(spec, family, cfg, batch_size)

    hooks = ChangeHooks(spec.change)
    step_fn = backend.setup(spec, family, model, hooks)
    hooks.device_type = backend.device.type
    batches = [backend.place(b) for b in cpu_batches]
    changed = [backend.place(b) for b in cpu_changed]
    for record in backend.layout_records(model, batches[0]):
        ctx.emit({"kind": "layout", **record})
    backend.start_counting()
    build_s = time.perf_counter() - started  # model, batches, backend setup, placement
    ctx.emit({"kind": "info", "n_params": n_params, "batch_size": batch_size,
              "device": str(backend.device), "build_s": build_s})
    if spec.steps == 0:  # the layout alone (records above): nothing to train or evaluate
        return {"model": spec.model, "preset": spec.preset, "mode": spec.mode, "steps": 0,
                "batch_size": batch_size, "n_params": n_params, "device": str(backend.device),
                "build_s": build_s}
    hlo_capture = backend.hlo_capture() if "hlo" in spec.capture else None
    profiler = backend.profiler(ctx.out_dir / "profile") if "profile" in spec.capture else None
    # libtpu's live metrics of the run's chips; unavailable (and why) without a chip
    monitor = ChipMonitor(chips=backend.chips())
    losses = _steps(ctx, spec, backend, step_fn, hooks, batches, changed, profiler, monitor)
    if hlo_capture:  # before evaluation, which compiles a graph of its own
        hlo_capture.collect(ctx.out_dir / "hlo")
    if "checkpoint" in spec.capture:  # trained weights, on the CPU, for sampling or inspection
        torch.save({k: v.detach().to("cpu") for k, v in model.state_dict().items()},
                   ctx.out_dir / "model.pt")
    metric = _evaluate(family, model, eval_batches, backend.evaluation_device())
    backend.after_evaluation()
    return {
        "model": spec.model, "preset": spec.preset, "mode": spec.mode, "steps": spec.steps,
        "batch_size": batch_size, "n_params": n_params,
        "items_per_step": family.items_per_batch(cfg, batch_size), "item_unit": family.item_unit,
        "flops_per_step": family.flops_per_step(cfg, batch_size),
        "metric_name": family.metric_name, "metric": metric,
        "eval_items": len(eval_batches) * batch_size,
        "final_loss": losses[-1] if losses else math.nan, "device": str(backend.device),
        "memory": backend.memory_info(), "cache": backend.cache_info(runs_before),
        "build_s": build_s, "chip_metrics": monitor.summary(),
    }


def _steps(ctx: Any, spec: ExperimentSpec, backend: Backend, step_fn: Any, hooks: ChangeHooks,
           batches: list[Batch], changed: list[Batch], profiler: Any,
           monitor: ChipMonitor | None = None) -> list[float]:
    """The timed steps: the clock stops only after the device finished the step (the backend's
    ``wait``, which on TorchTPU ends with a device-to-host read of the loss); chip metrics are
    sampled after the clock stopped."""
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
                backend.wait(loss)
                wall_ms = (time.perf_counter() - t0) * 1e3
            marks = backend.wait_marks(t0)  # TorchTPU: when synchronize() alone returned
            counts = backend.step_counts()
            loss_value = float(loss.detach().to("cpu"))
            losses.append(loss_value)
            outside, outside_records = backend.step_fallbacks(step)  # after reading the loss
            ctx.emit({"kind": "step", "step": step, "wall_ms": wall_ms, "loss": loss_value,
                      **marks, **counts, **outside})
            chip = monitor.sample(step, force=step == spec.steps - 1) if monitor else None
            if chip:
                ctx.emit(chip)
            trigger = CHANGES[spec.change] if spec.change and step == spec.change_at else ""
            for record in backend.compile_records(step, counts, trigger):
                ctx.emit(record)
            for record in outside_records:
                ctx.emit(record)
    finally:  # a cancelled or failed run still closes its trace (in its -failed folder)
        if profiler:
            profiler.stop()
    return losses
