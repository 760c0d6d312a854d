"""The ``cost`` task: compile one training step on the run's mesh of virtual devices without
running it, so XLA dumps the SPMD-partitioned program a TPU slice would get.

Nothing is materialised that the compiler does not need: the model is built on the meta device
and each parameter gets uninitialised storage (no init kernels), placed and sharded one by one; the
batch is random token ids of the asked sequence length; the step (forward, backward, AdamW) is
traced lazily and handed to ``torch_xla._XLAC._xla_warm_up_cache``, which compiles the graph
into the in-process cache (and XLA's dump folder) without executing it (torch_xla's dynamo bridge
uses it the same way). Adam's moments are left for the traced step to create, so they need no
device buffers (the compiled step then reads zeros instead of the moments: the planner states
it). The pending graph is dropped afterwards, and the task reports how many executions ran
(0: checked by the tests).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .. import models
from ..runs.spec import ExperimentSpec
from .backend import ChangeHooks, make_step


def _executions() -> int:
    import torch_xla.debug.metrics as met

    return int((met.counter_value("ExecuteReplicated") or 0)
               + (met.counter_value("ExecuteComputation") or 0))


def cost(ctx: Any, spec_dict: dict[str, Any]) -> dict[str, Any]:
    """Compile (never run) one train step of `spec_dict` at batch ``spec.batch_size`` (global)
    and sequence ``2 * length`` (the task's ``length`` option: the whole sorting sequence, so
    any even length can be asked for) on ``spec.mesh`` with ``spec.strategy``; the HLO goes to
    ``ctx.out_dir / "hlo"``. Returns counts and timings of the compile."""
    import torch_xla
    from torch_xla.backends import get_mat_mul_precision

    from . import spmd
    from .xla import HLOCapture

    spec = ExperimentSpec.from_dict(spec_dict)
    started = time.perf_counter()
    family = models.get_model(spec.model)
    cfg = family.config(spec.preset, **spec.options)
    with torch.device("meta"):
        model = family.build(cfg)
    n_params = models.n_params(model)
    seq_len = 2 * int(cfg.length)
    device = torch_xla.device()
    capture = HLOCapture()
    executed_before = _executions()
    mesh = spmd.make_mesh(spec.mesh)
    _place_sharded(model, mesh, spec.strategy, device)
    spmd.shard_model(model, mesh, spec.strategy)  # buffers (parameters keep their sharding)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr or family.default_lr, foreach=False)
    vocab = family.block_shape(cfg).vocab
    gen = torch.Generator().manual_seed(spec.seed)
    batch = {k: torch.randint(vocab, (spec.batch_size, seq_len), generator=gen) for k in "xy"}
    batch = spmd.shard_batch({k: v.to(device) for k, v in batch.items()}, mesh, spec.strategy)
    build_s = time.perf_counter() - started
    loss = make_step(family, model, opt, ChangeHooks(None))(batch)
    outputs = [loss, *model.parameters(), *model.buffers(),
               *(v for state in opt.state.values() for v in state.values()
                 if isinstance(v, torch.Tensor) and v.device.type == "xla")]
    t0 = time.perf_counter()
    torch_xla._XLAC._xla_warm_up_cache(outputs, [])
    compile_s = time.perf_counter() - t0
    torch_xla._XLAC._clear_pending_irs(str(device))
    executions = _executions() - executed_before
    files = capture.collect(ctx.out_dir / "hlo")
    return {"model": spec.model, "preset": spec.preset, "n_params": n_params,
            "batch_size": spec.batch_size, "seq_len": seq_len, "mesh": list(spec.mesh),
            "strategy": spec.strategy, "executions": executions, "build_s": build_s,
            "compile_s": compile_s, "hlo_files": files,
            "mat_mul_precision": get_mat_mul_precision()}


def _place_sharded(model: torch.nn.Module, mesh: Any, strategy: str | None,
                   device: Any) -> None:
    """Give the meta model's parameters uninitialised storage on the XLA device, one at a time
    and sharded as they go (a whole model on the CPU, then on the device, then resharded would
    hold it three times: Llama-3-8B's embeddings alone are 2 GB in bf16)."""
    from ..sharding.strategies import param_specs
    from .spmd import _mark

    specs = param_specs(model, strategy, mesh.mesh_shape)
    names = {id(p): n for n, p in model.named_parameters()}
    done: dict[int, torch.nn.Parameter] = {}  # tied weights stay one parameter
    for module in model.modules():
        for key, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in done:
                t = torch.empty(p.shape, dtype=p.dtype).to(device)
                _mark(t, mesh, specs[names[id(p)]])
                done[id(p)] = torch.nn.Parameter(t, requires_grad=p.requires_grad)
            module._parameters[key] = done[id(p)]
        for key, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[key] = torch.empty(b.shape, dtype=b.dtype).to(device)
