"""The ``trace`` task: one training step traced by torch_xla on the run's mesh of virtual XLA:CPU
devices and saved as the un-partitioned HLO module proto, for libtpu's compiler
(:mod:`tpu_workbench.tpu_compile`). Nothing runs and nothing is allocated:

* every parameter, buffer, optimizer moment and input is a torch_xla **placeholder** (a
  parameter of the traced program that holds no buffer), so Llama-3-8B's weights cost no RAM,
  and they enter the program as inputs, as on a chip (the compiler's argument bytes are the
  model's state);
* each gets the strategy's sharding as an annotation (``annotate_custom_sharding``; a
  placeholder has no data to reshard), which the TPU compiler's SPMD partitioner reads;
* with ``dtype="bfloat16"`` the step is mixed precision, the workbench's memory convention
  (:data:`tpu_workbench.sharding.CONVENTION`): fp32 weights and optimizer moments, the forward and
  backward under ``torch.autocast`` in bf16.

The proto goes to ``ctx.out_dir / "step.pb"``, and which outputs update which inputs in place
(weights, moments: donated on a chip) to ``aliases.json``; the pending graph is dropped.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from .. import models
from ..runs.spec import ExperimentSpec
from .backend import ChangeHooks, make_step, new_optimizer, optimizer_state

PROTO_FILE = "step.pb"
ALIASES_FILE = "aliases.json"  # [[output index, parameter number]]: updated in place


def _executions() -> int:
    """Programs torch_xla has executed in this process (the trace must add none)."""
    import torch_xla.debug.metrics as met

    return int((met.counter_value("ExecuteReplicated") or 0)
               + (met.counter_value("ExecuteComputation") or 0))


def trace(ctx: Any, spec_dict: dict[str, Any]) -> dict[str, Any]:
    """Trace (never run) one train step of `spec_dict` at global batch ``spec.batch_size`` and
    sequence ``2 * length`` on ``spec.mesh`` with ``spec.strategy``; write its HLO proto."""
    import torch_xla
    import torch_xla.core.xla_builder as xb
    import torch_xla.distributed.spmd as xs

    from kernels.xla_flash import tpu_lowering

    from ..sharding.mesh import batch_partition
    from ..sharding.strategies import buffer_specs, param_specs
    from . import spmd

    spec = ExperimentSpec.from_dict(spec_dict)
    started = time.perf_counter()
    family = models.get_model(spec.model)
    options = dict(spec.options)
    mixed = options.get("dtype") == "bfloat16"
    if mixed:
        options["dtype"] = "float32"  # fp32 master weights; bf16 compute under autocast
    cfg = family.config(spec.preset, **options)
    with torch.device("meta"):
        model = family.build(cfg)
    n_params = models.n_params(model)
    if hasattr(model, "dense_causal_mask"):  # hf:*: a causal mask libtpu compiles reliably
        model.dense_causal_mask = True
    mesh = spmd.make_mesh(spec.mesh)
    executed_before = _executions()

    input_ids: dict[int, int] = {}  # id(tensor) -> its torch_xla id as a graph input

    def placeholder(t: torch.Tensor, partition: Any, parameter: bool = False) -> torch.Tensor:
        out = xb.create_placeholder_tensor(tuple(t.shape), t.dtype)
        if parameter:
            out = torch.nn.Parameter(out, requires_grad=t.requires_grad)
        input_ids[id(out)] = torch_xla._XLAC._xla_get_tensor_id(out)  # before any update
        annotate(out, partition)
        return out

    def annotate(t: torch.Tensor, partition: Any) -> None:
        if t.dim():
            xs.annotate_custom_sharding(t, mesh, tuple(partition) if partition
                                        else (None,) * t.dim())

    specs = param_specs(model, spec.strategy, mesh.mesh_shape)
    spmd.mark_experts(model, spec.strategy, mesh.mesh_shape)
    names = {id(p): n for n, p in model.named_parameters()}
    made: dict[int, torch.nn.Parameter] = {}  # tied weights stay one parameter
    for module in model.modules():
        for key, p in list(module._parameters.items()):
            if p is not None:
                if id(p) not in made:
                    made[id(p)] = placeholder(p, specs[names[id(p)]], parameter=True)
                module._parameters[key] = made[id(p)]
    buffers = buffer_specs(model, spec.strategy, mesh.mesh_shape)
    buffer_list = []
    for name, b in list(model.named_buffers()):
        owner, _, key = name.rpartition(".")
        new = placeholder(b, buffers.get(name))
        model.get_submodule(owner)._buffers[key] = new
        buffer_list.append((new, buffers.get(name)))
    model.train()
    opt = new_optimizer(spec.optimizer, model.parameters(), spec.lr or family.default_lr)
    state_specs: list[tuple[torch.Tensor, Any]] = []

    def moments_of(p: torch.Tensor, partition: Any) -> Callable[..., torch.Tensor]:
        """A moment of weight `p`: an input, sharded as `p` is along the dims it keeps."""
        def zeros(shape: tuple[int, ...], dims: tuple[int, ...]) -> torch.Tensor:
            kept = tuple(partition[d] for d in dims) if partition else None
            t = placeholder(torch.empty(shape, dtype=p.dtype, device="meta"), kept)
            state_specs.append((t, kept))
            return t
        return zeros

    for name, p in model.named_parameters():
        if p.requires_grad:
            opt.state[p] = optimizer_state(spec.optimizer, p, moments_of(p, specs[name]))
            if spec.optimizer == "adafactor":  # a steady step: the first's decay is a constant 0
                opt.state[p]["step"] = 1
    shapes = family.batch_shapes(cfg, spec.batch_size)
    if shapes is None:  # a transformer: token ids and targets of the step's sequences
        seq_len = 2 * int(cfg.length)
        shapes = {k: ((spec.batch_size, seq_len), "int64") for k in "xy"}
    else:
        seq_len = 0
    batch = {k: placeholder(torch.empty(shape, dtype=getattr(torch, dtype), device="meta"),
                            batch_partition(spec.strategy, mesh.mesh_shape, len(shape)))
             for k, (shape, dtype) in shapes.items()}
    autocast = (torch.autocast("xla", dtype=torch.bfloat16) if mixed
                else contextlib.nullcontext())
    with autocast, tpu_lowering():  # Pallas kernels (flash attention) lowered for the TPU
        loss = make_step(family, model, opt, ChangeHooks(None))(batch)
    # The updated state leaves the step sharded as it came in, and in the buffers it came in
    # (torch_xla donates them on a chip): outputs aliased to their inputs.
    updated = [(p, specs[n]) for n, p in model.named_parameters()] + buffer_list + state_specs
    for t, partition in updated:
        annotate(t, partition)
    outputs = [loss] + [t for t, _ in updated]
    graph_inputs, _ = torch_xla._XLAC._get_tensors_xla_device_data_node(outputs)
    number = {tid: i for i, tid in enumerate(graph_inputs)}
    aliases = [[i + 1, number[input_ids[id(t)]]] for i, (t, _) in enumerate(updated)
               if input_ids.get(id(t)) in number]
    proto = torch_xla._XLAC._get_xla_tensors_hlo_proto(outputs)
    torch_xla._XLAC._clear_pending_irs(str(torch_xla.device()))
    (ctx.out_dir / PROTO_FILE).write_bytes(proto)
    (ctx.out_dir / ALIASES_FILE).write_text(json.dumps(aliases))
    return {"model": spec.model, "preset": spec.preset, "n_params": n_params,
            "batch_size": spec.batch_size, "seq_len": seq_len, "mesh": list(spec.mesh),
            "strategy": spec.strategy, "mixed_precision": mixed,
            "executions": _executions() - executed_before, "proto_bytes": len(proto),
            "aliased_outputs": len(aliases),
            "trace_s": time.perf_counter() - started}
