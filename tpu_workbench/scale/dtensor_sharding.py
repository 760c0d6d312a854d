"""Sharding with DTensor, one process per chip: how TorchTPU shards (it has no SPMD controller).

:func:`layout` starts one process per device of the mesh (the launch ``torchrun`` would do:
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``), each builds the model, a
``DeviceMesh`` (``init_device_mesh``) and lays every parameter and input out with
``distribute_tensor`` and the ``Shard``/``Replicate`` placements of the workbench's strategies
(:func:`tpu_workbench.sharding.param_specs`: dp, fsdp, tp, dp_tp). Each process reports what
its device holds; the records have the columns of :func:`tpu_workbench.sharding.layout_frame`,
so :func:`~tpu_workbench.sharding.memory_per_device` and
:func:`tpu_workbench.charts.layout_grid` work on them unchanged.

Devices: on a TPU host the device type is ``"tpu"`` with TorchTPU's ``tpu_dist`` process group
(after ``torch.tpu.distributed.set_tpu_launch_env``) and the processes run under the TorchTPU
interpreter; without a chip, ``"cpu"`` with ``gloo``, in any environment: the same placements,
the same index ranges. Extra columns: ``placements`` (DTensor's, per mesh dim, e.g.
``["Replicate()", "Shard(dim=0)"]``), ``predicted_index`` (the hand-computed range of
:func:`~tpu_workbench.sharding.predicted_layout`) and ``reassembled`` (``full_tensor()`` of the
DTensor equals the original tensor). ``spec`` holds the placements as text. ``shard_shape`` is
the local tensor's real shape (DTensor does not pad a ragged tail, unlike XLA).
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import models, sharding
from ..errors import RunFailed, RunTimeout, SpecError

DEFAULT_TIMEOUT_S = 300.0


def placements(partition: Any, mesh_shape: tuple[int, ...]) -> list[tuple[str, int | None]]:
    """DTensor placements of a workbench partition spec, one per mesh dim, as plain data:
    ``("shard", dim)`` or ``("replicate", None)``. A tensor dim split over two mesh axes
    (fsdp's ``("data", "model")``) is ``Shard(dim)`` on both: DTensor nests them, first mesh
    dim major, as XLA does."""
    names = sharding.axis_names(mesh_shape)
    out: list[tuple[str, int | None]] = [("replicate", None)] * len(mesh_shape)
    for dim, entry in enumerate(partition or ()):
        for axis in sharding.entry_axes(entry):
            out[names.index(axis)] = ("shard", dim)
    return out


def resolve_device(device: str) -> str:
    """``auto``: ``tpu`` where TorchTPU finds a chip, else ``cpu`` (gloo)."""
    from ..environment import torchtpu

    if device == "auto":
        return "tpu" if torchtpu.status().available else "cpu"
    if device == "tpu" and not torchtpu.status().available:
        raise SpecError(f"device='tpu' for DTensor sharding needs TorchTPU on a TPU chip: "
                        f"{torchtpu.status().reason}. Use device='cpu' (gloo processes) instead")
    if device not in ("cpu", "tpu"):
        raise SpecError(f"device {device!r} is not offered for DTensor sharding; use 'auto', "
                        "'cpu' or 'tpu'")
    return device


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def layout(model: str = "mingpt", preset: str = "tiny", mesh: Any = (2, 2),
           strategy: str | None = None, *, device: str = "auto",
           options: dict[str, Any] | None = None, batch_size: int | None = None, seed: int = 0,
           timeout: float = DEFAULT_TIMEOUT_S) -> list[dict[str, Any]]:
    """Lay `model` out on `mesh` with DTensor, one process per device; return layout records
    (one per tensor and device, ``kind="layout"``). Validated first, like a sharded spec."""
    # Validate, start the ranks, collect their records: one launch, read top to bottom.
    from ..environment import torchtpu
    from ..runs.spec import ExperimentSpec

    mesh_shape = sharding.parse_mesh(mesh)
    n = math.prod(mesh_shape)
    spec = ExperimentSpec(model=model, preset=preset, mode="torch_eager", mesh=mesh_shape,
                          num_devices=n, strategy=strategy, options=dict(options or {}),
                          batch_size=batch_size, seed=seed)
    family = models.get_model(model)
    cfg = family.config(preset, **(options or {}))
    # strategy, mesh rank, divisibility: before any process starts
    sharding.validate(mesh_shape, strategy, family, cfg,
                      batch_size or family.default_batch_size(cfg))
    device = resolve_device(device)
    python = torchtpu.worker_python() if device == "tpu" else sys.executable
    with tempfile.TemporaryDirectory(prefix="tpu_workbench_dtensor_") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"spec": spec.to_dict(), "device": device, "out": tmp}))
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
               "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "OMP_NUM_THREADS": "1"}
        # gloo processes need nothing of TorchTPU (and a CPU backward hangs with it loaded and
        # no chip); on a chip torch_tpu registers the "tpu" device only when autoloaded.
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0" if device == "cpu" else "1"
        procs = []
        logs = []
        for rank in range(n):
            log = open(Path(tmp) / f"rank{rank}.log", "w")  # noqa: SIM115 (closed below)
            logs.append(log)
            procs.append(subprocess.Popen(
                [python, "-m", "tpu_workbench.scale.dtensor_sharding", str(job), str(rank)],
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout
        try:
            for rank, proc in enumerate(procs):
                left = deadline - time.monotonic()
                try:
                    code = proc.wait(timeout=max(left, 0.1))
                except subprocess.TimeoutExpired as exc:
                    raise RunTimeout(f"DTensor layout on mesh {sharding.mesh_text(mesh_shape)} "
                                     f"did not finish within {timeout:.0f} s") from exc
                if code != 0:
                    tail = (Path(tmp) / f"rank{rank}.log").read_text()[-3000:]
                    raise RunFailed(f"DTensor layout: rank {rank} of {n} exited with code "
                                    f"{code}:\n{tail}")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for log in logs:
                log.close()
        records = []
        for rank in range(n):
            records += json.loads((Path(tmp) / f"rank{rank}.json").read_text())
    order = {name: i for i, name in enumerate(dict.fromkeys(r["tensor"] for r in records))}
    return sorted(records, key=lambda r: (order[r["tensor"]], r["device"]))


# --------------------------------------------------------------------------------------------
# One rank (a process of its own)
# --------------------------------------------------------------------------------------------
def _rank_main(job_file: str, rank: int) -> None:
    # What one rank does, in order: join the group, build, distribute, report; kept whole.
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from .. import models
    from ..environment import torchtpu
    from ..runs.spec import ExperimentSpec
    from ..worker.gang import processes_on_this_host

    job = json.loads(Path(job_file).read_text())
    spec = ExperimentSpec.from_dict(job["spec"])
    device_type = job["device"]
    world = int(os.environ["WORLD_SIZE"])
    mesh_shape = tuple(spec.mesh)
    if device_type == "tpu":  # TorchTPU: its launch environment, then its process group
        torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=processes_on_this_host())
        backend = torchtpu.DIST_BACKEND
    else:
        backend = "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        mesh = init_device_mesh(device_type, mesh_shape,
                                mesh_dim_names=sharding.axis_names(mesh_shape))
        family = models.get_model(spec.model)
        cfg = family.config(spec.preset, **spec.options)
        batch_size = spec.batch_size or family.default_batch_size(cfg)
        torch.manual_seed(spec.seed)
        model = family.build(cfg)
        batch = family.make_batch(cfg, batch_size, torch.Generator().manual_seed(spec.seed))
        strategy = sharding.strategy_name(spec.strategy)
        specs = sharding.param_specs(model, strategy, mesh_shape)

        def one(name: str, kind: str, t: torch.Tensor, partition: Any) -> dict[str, Any]:
            plan = placements(partition, mesh_shape)
            pl = [Shard(d) if how == "shard" else Replicate() for how, d in plan]
            dt = distribute_tensor(t.detach().to(device_type), mesh, pl)
            local = dt.to_local()
            shape = list(t.shape)
            local_shape, offset = compute_local_shape_and_global_offset(t.shape, mesh, pl)
            dtype = str(t.dtype).removeprefix("torch.")
            rec = sharding.predicted_layout(name, shape, partition, mesh_shape, dtype, kind,
                                            device_prefix=device_type.upper())[rank]
            index = [[int(o), int(o) + int(s)] for o, s in zip(offset, local_shape, strict=True)]
            rec.update(
                kind="layout", predicted_index=rec["index"], index=index,
                index_label=sharding.index_label(index, shape),
                placements=[repr(p) for p in pl], spec=", ".join(repr(p) for p in pl),
                shard_shape=list(local.shape),
                shard_bytes=local.numel() * local.element_size(),
                data_bytes=local.numel() * local.element_size(),
                reassembled=bool(torch.equal(dt.full_tensor().cpu(), t.detach().cpu())),
                backend=f"dtensor:{device_type}")
            return rec

        records = [one(name, "param", p, specs[name]) for name, p in model.named_parameters()]
        for key, t in batch.items():
            part = sharding.batch_partition(strategy, mesh_shape, t.dim()) if t.dim() else ()
            records.append(one(f"batch.{key}", "input", t, part))
        Path(job["out"], f"rank{rank}.json").write_text(json.dumps(records))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(sys.argv[1], int(sys.argv[2]))
