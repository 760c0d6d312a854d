"""One rank of a TorchTitan gang: what each process ``torchrun`` starts runs (``-m
tpu_workbench.worker.titan JOB``) for a :class:`~tpu_workbench.titan.spec.TitanSpec`. The
parent's half is :mod:`tpu_workbench.runs.gang`, as for the workbench's own DTensor ranks.

The rank runs TorchTitan's own ``Trainer``, built by TorchTitan's own ``ConfigManager`` from the
command line :func:`tpu_workbench.titan.spec.command` makes of the TOML, and adds only what a
launcher must:

- the device: TorchTitan picks the first accelerator torch reports and falls back to
  ``"cuda"`` with none; here it is set to ``cpu`` (gloo, a device module that answers
  TorchTitan's memory questions with "not measured") or, on a TPU VM, to TorchTPU's ``tpu``
  (``tpu_dist``, its device module through ``torch.accelerator``; not checked here: no chip);
- the data: the workbench's text and tokenizer (:mod:`tpu_workbench.titan.data`) registered in
  TorchTitan's own dataset table, read by its own dataset and tokenizer classes;
- two fixes for a CPU over gloo: FSDP2's gradient reduction as a plain sum (gloo has no
  PREMUL_SUM; TorchTitan divides by the token count itself, so the sum is what it asks for),
  and ``torch.distributed.set_timeout``, which TorchTitan 0.3.0 calls after the first step and
  torch 2.13 does not have (its private ``_set_pg_timeout`` does the same);
- the records: TorchTitan's metrics logger is replaced by one that writes this rank's records
  (the workbench's ``step`` and ``heldout`` kinds, :mod:`tpu_workbench.records`) to the file the
  parent tails, with this rank's own step time and memory.

:data:`RELIES_ON` lists every TorchTitan and torch name this module (and the override) uses;
``tests_torchtpu/test_titan.py`` looks each one up, so a release that moves one fails there.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

from .gang import RankLog, _die_with_parent, _fault, processes_on_this_host

RELIES_ON: tuple[str, ...] = (
    "torchtitan.tools.utils.device_type",
    "torchtitan.tools.utils.device_module",
    "torchtitan.config.ConfigManager",
    "torchtitan.config.override",
    "torchtitan.hf_datasets.DatasetConfig",
    "torchtitan.hf_datasets.text_datasets.DATASETS",
    "torchtitan.components.tokenizer.HuggingFaceTokenizer",
    "torchtitan.components.metrics.BaseLogger",
    "torchtitan.components.metrics.MetricsProcessor.log",
    "torchtitan.components.metrics.MetricsProcessor.log_validation",
    "torchtitan.models.common.attention.FlexAttention.Config",
    "torchtitan.models.common.attention.ScaledDotProductAttention.Config",
    "torchtitan.trainer.Trainer.train",
    "torchtitan.trainer.Trainer.train_step",
    "torchtitan.trainer.Trainer.close",
    "torch.distributed.fsdp.FSDPModule.set_force_sum_reduction_for_comms",
    "torch.distributed.distributed_c10d._set_pg_timeout",
    "torch.distributed.tensor.DTensor.from_local",
    # the TPU device module (_tpu_module)
    "torch.accelerator.set_device_index", "torch.accelerator.device_count",
    "torch.accelerator.current_device_index", "torch.accelerator.synchronize",
    "torch.accelerator.reset_peak_memory_stats", "torch.accelerator.empty_cache",
    "torch.accelerator.memory_stats", "torch.accelerator.is_available",
)
TRAIN_DATA, HELDOUT_DATA = "workbench_train", "workbench_heldout"


def main(job_file: str) -> None:
    _die_with_parent()
    job = json.loads(Path(job_file).read_text())
    from ..titan.spec import TitanSpec, rank_job

    # the job file holds the spec; the rest is derived here (a launch plan's host too)
    job.update(rank_job(TitanSpec.from_dict(job["spec"]), job.get("dump_to", job["out"])))
    rank = int(os.environ["RANK"])
    log = RankLog(Path(job["out"]), rank)
    log.write({"kind": "hello", "pid": os.getpid()})
    try:
        summary = _train(job, rank, log)
        log.write({"kind": "done", "summary": summary if rank == 0 else None})
    except BaseException as exc:
        log.write({"kind": "error", "etype": type(exc).__name__, "message": str(exc),
                   "traceback": traceback.format_exc()})
        raise


def _train(job: dict[str, Any], rank: int, log: RankLog) -> dict[str, Any]:
    # Hugging Face's libraries read the cache and offline switches at import.
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                      HF_DATASETS_CACHE=job["datasets_cache"])
    import torch

    device = job["device"]
    _set_device(device)  # before anything else of TorchTitan reads the device
    _register_data(job["assets"])
    _shim_set_timeout()
    from torchtitan.config import ConfigManager

    started = time.perf_counter()
    if device == "tpu":  # TorchTPU's launch environment and process group (see the module doc)
        torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=processes_on_this_host())
        torch.distributed.init_process_group("tpu_dist")
    config = ConfigManager().parse_args(job["args"])
    trainer = config.build()
    if torch.distributed.get_backend() == "gloo":
        _sum_gradients(trainer)
    recorder = Recorder(log, rank, trainer, job["label"])
    trainer.metrics_processor.logger = recorder
    train_step = trainer.train_step

    def timed_step(data_iterator):
        step = trainer.step - 1  # Trainer.train counts from 1; records from 0
        _fault(rank, step)
        log.write({"kind": "progress", "step": step, "phase": "start"})
        recorder.t0 = time.perf_counter()  # the step's end: TorchTitan logs its loss (a sync)
        train_step(data_iterator)
        log.write({"kind": "progress", "step": step, "phase": "end"})

    trainer.train_step = timed_step
    build_s = time.perf_counter() - started
    if rank == 0:
        log.write({"kind": "info", "n_params": recorder.n_params, "device": device,
                   "build_s": build_s, "processes": int(os.environ["WORLD_SIZE"]),
                   "strategy": job["label"]})
    try:
        trainer.train()
    finally:
        trainer.close()
    summary = recorder.summary(job, build_s)
    torch.distributed.destroy_process_group()
    return summary


def _set_device(device: str) -> None:
    import torchtitan.tools.utils as utils

    utils.device_type = device
    utils.device_module = _tpu_module() if device == "tpu" else _cpu_module()


def _tpu_module() -> types.SimpleNamespace:
    """What TorchTitan asks its device module, for TorchTPU: through ``torch.accelerator``
    (torch_tpu 0.2.0's own ``torch.tpu.device_count()`` and ``current_device()`` raise from
    user code; notes/torch_tpu.md), its name and properties from ``torch.tpu``. Not run here:
    no chip."""
    import torch

    acc = torch.accelerator
    return types.SimpleNamespace(
        set_device=lambda device=None: acc.set_device_index(getattr(device, "index", device)),
        device_count=acc.device_count, current_device=acc.current_device_index,
        get_device_name=lambda device=None: torch.tpu.get_device_name(),
        get_device_properties=lambda device=None: torch.tpu.get_device_properties(),
        synchronize=lambda device=None: acc.synchronize(),
        reset_peak_memory_stats=lambda device=None: acc.reset_peak_memory_stats(),
        empty_cache=acc.empty_cache, memory_stats=lambda device=None: acc.memory_stats(),
        is_available=acc.is_available)


def _cpu_module() -> types.SimpleNamespace:
    """What TorchTitan asks its device module, answered for a CPU: one device, no allocator
    statistics (its memory columns then read -1: not measured; the records carry this rank's
    own figures instead)."""
    import psutil

    props = types.SimpleNamespace(total_memory=psutil.virtual_memory().total, name="cpu")
    return types.SimpleNamespace(
        set_device=lambda device=None: None, device_count=lambda: 1,
        current_device=lambda: 0, get_device_name=lambda device=None: "cpu",
        get_device_properties=lambda device=None: props, synchronize=lambda device=None: None,
        reset_peak_memory_stats=lambda device=None: None, empty_cache=lambda: None,
        memory_stats=lambda device=None: {}, is_available=lambda: True)


def _register_data(assets: dict[str, str]) -> None:
    from datasets import load_dataset
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    for name, folder in ((TRAIN_DATA, assets["train"]), (HELDOUT_DATA, assets["heldout"])):
        DATASETS[name] = DatasetConfig(path=folder,
                                       loader=lambda path: load_dataset(path, split="train"),
                                       sample_processor=lambda sample: sample["text"])


def _shim_set_timeout() -> None:
    import torch.distributed as dist

    if not hasattr(dist, "set_timeout"):
        from torch.distributed.distributed_c10d import _set_pg_timeout

        dist.set_timeout = lambda timeout, group=None: _set_pg_timeout(timeout, group)


def _sum_gradients(trainer: Any) -> None:
    from torch.distributed.fsdp import FSDPModule

    for part in trainer.model_parts:
        for module in part.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)


def _local_bytes(tensors) -> int:
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


class Recorder:
    """TorchTitan's metrics logger (``MetricsProcessor.logger``) turned into this rank's
    records: a ``step`` record per training step, a ``heldout`` record per validation."""

    def __init__(self, log: RankLog, rank: int, trainer: Any, label: str):
        self.out, self.rank, self.trainer, self.label = log, rank, trainer, label
        self.t0 = time.perf_counter()
        self.losses: list[float] = []
        self.heldout: list[tuple[int, float]] = []
        params = [p for m in trainer.model_parts for p in m.parameters()]
        self.n_params = sum(p.numel() for p in params)  # DTensors count their global size
        self.param_bytes = _local_bytes(params)

    def memory(self) -> dict[str, int]:
        """This rank's own share: its parameters, gradients and optimizer state (the local
        shards, measured from the tensors), and the process's resident memory."""
        import resource

        import psutil

        params = [p for m in self.trainer.model_parts for p in m.parameters()]
        optimizers = getattr(self.trainer.optimizers, "optimizers", [])
        state = [v for opt in optimizers for s in opt.state.values() for v in s.values()
                 if hasattr(v, "numel") and v.dim() > 0]
        return {"param_bytes": _local_bytes(params),
                "grad_bytes": _local_bytes(p.grad for p in params),
                "optimizer_bytes": _local_bytes(state),
                "rss_bytes": psutil.Process().memory_info().rss,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """TorchTitan's ``logger.log(metrics, step)``: its metrics of one step (every rank
        logs, log_freq is 1), or of one validation (``validation_metrics/*``)."""
        index = step - 1
        if "validation_metrics/loss" in metrics:
            loss = float(metrics["validation_metrics/loss"])
            self.heldout.append((index, loss))
            if self.rank == 0:
                self.out.write({"kind": "heldout", "step": index, "loss": loss,
                                "strategy": self.label})
            return
        loss = float(metrics["loss_metrics/global_avg_loss"])
        self.losses.append(loss)
        memory_gib = float(metrics.get("memory/max_reserved(GiB)", -1))
        lr = next((float(v) for k, v in metrics.items() if k.startswith("lr/")), float("nan"))
        self.out.write({
            "kind": "step", "step": index, "wall_ms": (time.perf_counter() - self.t0) * 1e3,
            "loss": loss,
            "local_loss": None, "max_rank_loss": float(metrics["loss_metrics/global_max_loss"]),
            "grad_norm": float(metrics["grad_norm"]), "lr": lr,
            "tokens_per_s": float(metrics["throughput(tps)"]),
            "titan_step_ms": float(metrics["time_metrics/end_to_end(s)"]) * 1e3,
            "data_ms": float(metrics["time_metrics/data_loading(s)"]) * 1e3,
            "device_memory_gib": memory_gib if memory_gib >= 0 else None,
            "compiles": 0, "cached": 0, "compile_ms": 0.0, "executions": 0,
            "strategy": self.label, "per_rank": self.memory()})

    def close(self) -> None:
        pass

    def summary(self, job: dict[str, Any], build_s: float) -> dict[str, Any]:
        heldout = self.heldout
        return {
            "model": job["spec"]["model"], "preset": job["spec"]["preset"],
            "mode": job["spec"]["mode"], "steps": len(self.losses),
            "n_params": self.n_params, "strategy": self.label,
            "first_loss": self.losses[0] if self.losses else float("nan"),
            "final_loss": self.losses[-1] if self.losses else float("nan"),
            "heldout_first": heldout[0][1] if heldout else float("nan"),
            "heldout_last": heldout[-1][1] if heldout else float("nan"),
            "metric_name": "held-out loss",
            "metric": heldout[-1][1] if heldout else float("nan"),
            "items_per_step": job["tokens_per_step"], "item_unit": "tokens",
            "batch_size": job["global_batch"], "local_batch": job["local_batch"],
            "seq_len": job["seq_len"], "degrees": job["degrees"], "device": job["device"],
            "dist_backend": _backend(), "processes": int(os.environ["WORLD_SIZE"]),
            "torchtitan": _titan_version(), "torchtitan_args": job["args"],
            "notes": job["notes"],
            "build_s": build_s, "memory": self.memory(),
        }


def _backend() -> str:
    import torch.distributed as dist

    return str(dist.get_backend()) if dist.is_initialized() else ""


def _titan_version() -> str:
    from importlib import metadata

    return metadata.version("torchtitan")


if __name__ == "__main__":
    main(sys.argv[1])
