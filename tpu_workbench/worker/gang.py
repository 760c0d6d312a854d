"""One rank of a gang: what each process ``torchrun`` starts runs (``-m tpu_workbench.worker.gang
JOB``). The parent's half (launch, supervision, records) is :mod:`tpu_workbench.runs.gang`.

Each rank joins the process group (gloo on a CPU; TorchTPU's ``tpu_dist`` on chips, device
``"tpu"``), builds the model and the batches exactly as a one-process run does
(:func:`tpu_workbench.worker.train._batches`, the same seed), lays the model out with its
strategy (:mod:`tpu_workbench.worker.dtensor_train`), trains on its slice of each batch and
writes JSON lines to ``rank<r>.jsonl`` in the job's folder, flushed line by line, which the
parent tails:

- ``hello`` (rank, pid) first; ``progress`` (step, phase) as each phase of a step begins, so a
  stalled gang shows which rank is behind;
- ``step`` per step: ``wall_ms`` (this rank's clock, ended by a device-to-host read of its
  loss) and ``loss`` (the mean over the ranks' batch slices: the whole batch's loss);
- rank 0 only: ``info`` and one ``collective`` per collective of the counted step
  (``CommDebugMode``); every rank ``done`` at the end (rank 0's with the run's summary), or
  ``error`` (what it raised).

``TPU_WORKBENCH_GANG_FAULT=kill:RANK:STEP`` or ``hang:RANK:STEP`` makes that rank kill itself
(SIGKILL) or stop forever as `STEP` begins: the fault tests' way in.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

FAULT_ENV = "TPU_WORKBENCH_GANG_FAULT"
PHASES = ("start", "forward", "backward", "optimizer", "end")


class RankLog:
    """This rank's record file: one JSON object per line, flushed at once."""

    def __init__(self, folder: Path, rank: int):
        self.rank = rank
        self.fh = open(folder / f"rank{rank}.jsonl", "a", buffering=1)  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        self.fh.write(json.dumps({"rank": self.rank, "t": time.time(), **record},
                                 default=str) + "\n")
        self.fh.flush()


def _fault(rank: int, step: int) -> None:
    what, _, where = os.environ.get(FAULT_ENV, "").partition(":")
    if not what or where != f"{rank}:{step}":
        return
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while what == "hang":
        time.sleep(3600)


def _die_with_parent() -> None:
    """Linux: SIGKILL this rank when torchrun dies, so a killed launcher leaves no orphans."""
    import contextlib
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def processes_on_this_host() -> int:
    """The ranks torchrun started on this host (its ``LOCAL_WORLD_SIZE``): what TorchTPU's
    ``set_tpu_launch_env(nproc_per_node=)`` takes, as torchrun's flag of that name does. A
    multi-host gang's ``WORLD_SIZE`` is hosts x that (a v6e-16 plan: 16, not 4)."""
    value = os.environ.get("LOCAL_WORLD_SIZE")
    if value is None:
        raise RuntimeError("LOCAL_WORLD_SIZE is not set: a gang's ranks are started by torchrun, "
                           "which sets it to the processes on each host (--nproc_per_node)")
    if not value.strip().isdigit() or int(value) < 1:
        raise RuntimeError(f"LOCAL_WORLD_SIZE={value!r} is not a positive number of processes "
                           "(torchrun sets it from --nproc_per_node)")
    return int(value)


def main(job_file: str) -> None:
    # Join, build, lay out, train, report: one rank's life, top to bottom.
    _die_with_parent()
    job = json.loads(Path(job_file).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    log = RankLog(Path(job["out"]), rank)
    log.write({"kind": "hello", "pid": os.getpid()})
    try:
        summary = _train(job, rank, world, log)
        log.write({"kind": "done", "summary": summary if rank == 0 else None})
    except BaseException as exc:
        log.write({"kind": "error", "etype": type(exc).__name__, "message": str(exc),
                   "traceback": traceback.format_exc()})
        raise


def _train(job: dict[str, Any], rank: int, world: int, log: RankLog) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from .. import models, sharding
    from ..environment import torchtpu
    from ..environment.runtimes import Runtime
    from ..runs.spec import MODES, ExperimentSpec
    from . import dtensor_train as dt
    from .backend import make_optimizer
    from .train import _batches

    spec = ExperimentSpec.from_dict(job["spec"])
    device = job["device"]
    if device == "tpu":  # TorchTPU: its launch environment, then its process group
        torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=processes_on_this_host())
    dist.init_process_group(torchtpu.DIST_BACKEND if device == "tpu" else "gloo",
                            rank=rank, world_size=world)
    try:
        started = time.perf_counter()
        mesh_shape = tuple(spec.mesh)
        strategy = sharding.strategy_name(spec.strategy)
        family = models.get_model(spec.model)
        cfg = family.config(spec.preset, **spec.options)
        batch_size = spec.batch_size or family.default_batch_size(cfg)
        torch.manual_seed(spec.seed)  # the same weights on every rank, as in one process
        model = family.build(cfg)
        n_params = models.n_params(model)
        cpu_batches, _, eval_batches = _batches(spec, family, cfg, batch_size)
        index, parts = dt.batch_slice(strategy, mesh_shape, rank)
        batches = [{k: v.to(device) for k, v in dt.local_batch(b, index, parts).items()}
                   for b in cpu_batches]
        model.to(device).train()
        meshes = dt.make_meshes(device, mesh_shape, strategy)
        net = dt.apply(strategy, model, meshes)
        opt = make_optimizer(spec, family, net)
        if spec.mode == "tpu_compile":
            net = torch.compile(net, backend="tpu")
        elif MODES[spec.mode].runtime is Runtime.TORCH_TPU:
            torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, torchtpu.MODE_EAGER[spec.mode]))
        if rank == 0:
            log.write({"kind": "info", "n_params": n_params, "batch_size": batch_size,
                       "device": device, "build_s": time.perf_counter() - started,
                       "processes": world, "strategy": strategy})
        counted = min(1, spec.steps - 1)  # step 1: past FSDP's and DDP's first-step set-up
        losses = []
        for step in range(spec.steps):
            _fault(rank, step)
            log.write({"kind": "progress", "step": step, "phase": "start"})
            batch = batches[step % len(batches)]
            comm = dt.Collectives() if step == counted else None
            t0 = time.perf_counter()
            if comm is not None:
                with comm:
                    loss = _step(family, net, opt, batch, log, step, strategy, meshes)
            else:
                loss = _step(family, net, opt, batch, log, step, strategy, meshes)
            local = float(loss.detach().to("cpu"))  # the wait: a device-to-host read
            wall_ms = (time.perf_counter() - t0) * 1e3
            mean = torch.tensor([local], dtype=torch.float64)
            dist.all_reduce(mean)  # after the clock: every rank's slice, averaged
            losses.append(float(mean) / world)
            log.write({"kind": "step", "step": step, "wall_ms": wall_ms, "loss": losses[-1],
                       "local_loss": local, "compiles": 0, "cached": 0, "compile_ms": 0.0,
                       "executions": 0, "comm_debug": comm is not None})
            if comm is not None and rank == 0:
                for row in comm.rows:
                    log.write({"kind": "collective", "step": step, **row})
        net.eval()
        with torch.no_grad(), dt.loss_context():
            metric = float(torch.stack([
                family.evaluate(net, {k: v.to(device) for k, v in b.items()}).to("cpu")
                for b in eval_batches]).mean())
        return {
            "model": spec.model, "preset": spec.preset, "mode": spec.mode, "steps": spec.steps,
            "batch_size": batch_size, "n_params": n_params,
            "items_per_step": family.items_per_batch(cfg, batch_size),
            "item_unit": family.item_unit,
            "flops_per_step": family.flops_per_step(cfg, batch_size),
            "metric_name": family.metric_name, "metric": metric,
            "final_loss": losses[-1] if losses else float("nan"), "device": device,
            "strategy": strategy, "mesh": list(mesh_shape), "processes": world,
            "dist_backend": dist.get_backend(), "build_s": 0.0,
            "memory": {"worker_peak_rss_bytes": _peak_rss()}}
    finally:
        dist.destroy_process_group()


def _step(family: Any, net: Any, opt: Any, batch: dict[str, Any], log: RankLog, step: int,
          strategy: str, meshes: dict[str, Any]) -> Any:
    from . import dtensor_train as dt

    opt.zero_grad(set_to_none=True)
    log.write({"kind": "progress", "step": step, "phase": "forward"})
    with dt.loss_context():
        loss = family.loss(net, batch)
    log.write({"kind": "progress", "step": step, "phase": "backward"})
    loss.backward()
    dt.sync_gradients(strategy, net, meshes)
    log.write({"kind": "progress", "step": step, "phase": "optimizer"})
    opt.step()
    log.write({"kind": "progress", "step": step, "phase": "end"})
    return loss


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


if __name__ == "__main__":
    main(sys.argv[1])
