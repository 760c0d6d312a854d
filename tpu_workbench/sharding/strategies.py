"""Which partition spec each parameter and buffer gets under a strategy, the plan of a
model's parameters, and the validation of a strategy on a mesh (no torch_xla)."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import SpecError

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn

from .embedding import table_specs, validate_embedding
from .mesh import (
    ALL_STRATEGIES,
    EMBEDDING_STRATEGIES,
    TP_STRATEGIES,
    TWO_D_STRATEGIES,
    Partition,
    _all_devices,
    axis_names,
    axis_product,
    batch_axes,
    batch_ways,
    mesh_text,
    parse_mesh,
    partition_text,
    strategy_name,
)

# Layers whose input is split (row-parallel: their output is all-reduced); every other Linear is
# column-parallel. minGPT and Transformers' GPT-2: attn.c_proj, mlp.c_proj; Transformers' Llama,
# Qwen2, Gemma-2: self_attn.o_proj, mlp.down_proj (q/k/v/gate/up column-parallel); diffusers'
# attention: to_out.0.
ROW_PARALLEL = ("attn.c_proj", "mlp.c_proj", "self_attn.o_proj", "mlp.down_proj", "to_out.0")


def _conv1d_type() -> type | None:
    """Transformers' ``Conv1D`` (GPT-2's Linear, weight stored [in, out]) where transformers is
    loaded; a model that holds one has loaded it."""
    return getattr(sys.modules.get("transformers.pytorch_utils"), "Conv1D", None)


def _tp_partition(module: nn.Module, path: str, pname: str, shape: tuple[int, ...],
                  m: int) -> Partition | None:
    from torch import nn

    def divisible(n: int) -> bool:
        return n % m == 0

    conv1d = _conv1d_type()
    if conv1d is not None and isinstance(module, conv1d):  # a Linear with its weight transposed
        if any(path.endswith(s) for s in ROW_PARALLEL):
            if pname == "weight" and divisible(shape[0]):
                return ("model", None)  # [in, out]: split the input features
            return None
        if pname == "weight" and divisible(shape[1]):
            return (None, "model")
        if pname == "bias" and divisible(shape[0]):
            return ("model",)
        return None
    if isinstance(module, nn.Linear):
        if any(path.endswith(s) for s in ROW_PARALLEL):
            if pname == "weight" and divisible(shape[1]):
                return (None, "model")
            return None  # the bias is added after the all-reduce: replicated
        if pname == "weight" and divisible(shape[0]):
            return ("model", None)  # column-parallel (also lm_head-like layers where divisible)
        if pname == "bias" and divisible(shape[0]):
            return ("model",)
        return None
    if isinstance(module, nn.modules.batchnorm._NormBase | nn.GroupNorm) and len(shape) == 1 \
            and divisible(shape[0]):
        # Channel norms after a conv split on its output channels: weight, bias and running
        # statistics split the same way. (Left replicated, the running statistics came back
        # split after step 0 and the step compiled a second time.)
        return ("model",)
    if isinstance(module, nn.Embedding) and pname == "weight" and divisible(shape[0]):
        return ("model", None)  # vocab-parallel
    if isinstance(module, nn.Conv2d | nn.ConvTranspose2d) and divisible(
            module.out_channels):
        if pname == "weight" and isinstance(module, nn.Conv2d):
            return ("model", None, None, None)  # [out, in, kh, kw]: split output channels
        if pname == "weight":  # ConvTranspose2d: [in, out, kh, kw]
            return (None, "model", None, None)
        if pname == "bias":
            return ("model",)
    return None


def _fsdp_partition(shape: tuple[int, ...], mesh_shape: Sequence[int]) -> Partition | None:
    n = math.prod(mesh_shape)
    for i, size in enumerate(shape):
        if size % n == 0:
            return tuple(_all_devices(mesh_shape) if j == i else None for j in range(len(shape)))
    return None


def _also_on_data(part: Partition | None, shape: tuple[int, ...],
                  data: int) -> Partition | None:
    """`part` (a split over the model axis, or None) with one more dim split over the data
    axis: the first whole dim the data axis divides (FSDP inside each model shard)."""
    part = tuple(part) if part else (None,) * len(shape)
    for i, size in enumerate(shape):
        if part[i] is None and size % data == 0 and data > 1:
            return part[:i] + ("data",) + part[i + 1:]
    return part if any(e is not None for e in part) else None


def is_experts(module: nn.Module) -> bool:
    """A mixture-of-experts layer's stacked experts (Transformers' ``*Experts``: a
    ``gate_up_proj`` of shape (experts, 2 * inner, hidden) and a ``down_proj``)."""
    from torch import nn

    return isinstance(getattr(module, "gate_up_proj", None), nn.Parameter) and isinstance(
        getattr(module, "down_proj", None), nn.Parameter)


def _ep_partition(module: nn.Module, shape: tuple[int, ...],
                  mesh_shape: Sequence[int]) -> Partition | None:
    """ep: an experts stack split on its expert dim over the model axis (and a weight dim over
    the data axis); any other weight as fsdp over every device."""
    if is_experts(module) and len(shape) == 3 and shape[0] % mesh_shape[1] == 0:
        return _also_on_data(("model", None, None), shape, mesh_shape[0])
    return _fsdp_partition(shape, mesh_shape)


def param_specs(model: nn.Module, strategy: str | None,
                mesh_shape: Sequence[int]) -> dict[str, Partition | None]:
    """Partition spec of every parameter of `model` (None: replicated), by module path.

    Pure torch (no torch_xla): works on a model built on the ``meta`` device. Tied weights
    appear once, under their first name (minGPT's ``lm_head.weight`` is ``transformer.wte``'s).
    """
    strategy = strategy_name(strategy)
    mesh_shape = tuple(mesh_shape)
    axis_names(mesh_shape)  # checks the rank
    if strategy in TWO_D_STRATEGIES and len(mesh_shape) != 2:
        raise SpecError(f"strategy {strategy!r} needs a 2-D mesh (data, model), got mesh "
                        f"{mesh_text(mesh_shape)}")
    out: dict[str, Partition | None] = {}
    if strategy in EMBEDDING_STRATEGIES:  # the declared tables split, the rest data parallel
        axes = getattr(model, "embedding_axes", None)
        if not axes:
            raise SpecError(f"strategy {strategy!r} splits embedding tables, but this model "
                            "declares none (an embedding_axes attribute); use dp, fsdp, tp or "
                            "dp_tp")
        tables = table_specs(axes, strategy, mesh_shape)
        return {name: tables.get(name) for name, _ in model.named_parameters()}
    seen: set[int] = set()
    for path, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            name = f"{path}.{pname}" if path else pname
            shape = tuple(p.shape)
            if strategy == "dp":
                spec = None
            elif strategy == "fsdp":
                spec = _fsdp_partition(shape, mesh_shape)
            elif strategy == "ep":
                spec = _ep_partition(module, shape, mesh_shape)
            else:
                spec = _tp_partition(module, path, pname, shape, mesh_shape[1])
                if strategy == "fsdp_tp":
                    spec = _also_on_data(spec, shape, mesh_shape[0])
            out[name] = spec
    return out


def buffer_specs(model: nn.Module, strategy: str | None,
                 mesh_shape: Sequence[int]) -> dict[str, Partition | None]:
    """Partition spec of every floating-point buffer (BatchNorm's running statistics...) by the
    rule of a parameter of its shape in its module. Integer buffers (counters), scalars and masks
    are not listed: :func:`shard_model` marks them replicated."""
    strategy = strategy_name(strategy)
    mesh_shape = tuple(mesh_shape)
    out: dict[str, Partition | None] = {}
    for path, module in model.named_modules():
        for bname, b in module.named_buffers(recurse=False):
            if b is None or not b.is_floating_point() or not b.dim():
                continue
            name = f"{path}.{bname}" if path else bname
            shape = tuple(b.shape)
            if strategy == "dp" or strategy in EMBEDDING_STRATEGIES:
                out[name] = None
            elif strategy in ("fsdp", "ep"):
                out[name] = _fsdp_partition(shape, mesh_shape)
            else:
                out[name] = _tp_partition(module, path, bname, shape, mesh_shape[1])
    return out


def plan(model: str, preset: str, mesh_shape: Sequence[int], strategy: str | None = None,
         options: dict[str, Any] | None = None) -> pd.DataFrame:
    """The partition spec each parameter would get, without running anything.

    Builds the model on the ``meta`` device (no memory, no torch_xla). Columns: ``tensor``,
    ``shape``, ``dtype``, ``partition``, ``pieces`` (how many slices), ``params``, ``bytes`` (in
    the parameter's own dtype: an ``options={"dtype": "bfloat16"}`` hf:* model's are 2 each),
    ``shard_shape`` and ``bytes_per_device`` (the largest slice, padded).
    """
    import pandas as pd
    import torch

    from .. import models

    family = models.get_model(model)
    cfg = family.config(preset, **(options or {}))
    mesh_shape = parse_mesh(mesh_shape)
    with torch.device("meta"):
        net = family.build(cfg)
    params = dict(net.named_parameters())
    rows = []
    for name, part in param_specs(net, strategy, mesh_shape).items():
        shape = list(params[name].shape)
        size = params[name].element_size()
        pieces = [axis_product(e, mesh_shape) for e in (part or (None,) * len(shape))]
        n = math.prod(shape)
        shard = [-(-s // k) for s, k in zip(shape, pieces, strict=True)]
        rows.append({"tensor": name, "shape": shape,
                     "dtype": str(params[name].dtype).removeprefix("torch."),
                     "partition": partition_text(part), "pieces": math.prod(pieces),
                     "params": n, "bytes": size * n, "shard_shape": shard,
                     "bytes_per_device": size * math.prod(shard)})
    return pd.DataFrame(rows)


def strategies_for(family: Any, cfg: Any, mesh_shape: Sequence[int] | None = None,
                   batch_size: int | None = None) -> list[str]:
    """The strategies that apply to a family's config: every one, but the embedding strategies
    only where it declares embedding tables and ``ep`` only where it has experts. With
    `mesh_shape`, only those :func:`validate` accepts on that mesh at `batch_size` (default the
    family's): no 2-D strategy on a 1-D mesh, no tensor parallelism its widths do not divide."""
    tables = family.embedding_tables(cfg)
    names = [s for s in ALL_STRATEGIES if (tables or s not in EMBEDDING_STRATEGIES)
             and (s != "ep" or family.expert_count(cfg))]
    if mesh_shape is None:
        return names
    batch = family.default_batch_size(cfg) if batch_size is None else batch_size

    def valid(strategy: str) -> bool:
        try:
            validate(mesh_shape, strategy, family, cfg, batch)
        except SpecError:
            return False
        return True

    return [s for s in names if valid(s)]


def model_strategies(model: str, preset: str = "tiny",
                     mesh_shape: Sequence[int] | None = None) -> list[str]:
    """:func:`strategies_for` of model `model` (a name of :func:`tpu_workbench.model_names`)
    at `preset`: what a page offers and runs side by side for that model."""
    from ..models import get_model

    family = get_model(model)
    return strategies_for(family, family.config(preset), mesh_shape)


def _nearest_multiples(n: int, k: int) -> str:
    lo, hi = (n // k) * k, (n // k + 1) * k
    return f"{lo} or {hi}" if lo > 0 else f"{hi}"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def validate(mesh_shape: Sequence[int], strategy: str | None, family: Any, cfg: Any,
             batch_size: int) -> None:
    """Check a strategy on a mesh for a model family's config and batch; raise SpecError naming
    the fix. `family` is a :class:`~tpu_workbench.models.base.ModelFamily` (its
    ``model_axis_widths`` says what tensor parallelism must divide); imports no torch_xla."""
    if strategy is not None and not isinstance(strategy, str):  # [..] is unhashable
        raise SpecError(f"strategy must be None or one of {', '.join(ALL_STRATEGIES)} (a "
                        "string), "
                        f"got {strategy!r}")
    strategy = strategy_name(strategy)
    mesh = tuple(mesh_shape)
    if len(mesh) not in (1, 2):
        raise SpecError(f"mesh {mesh_text(mesh)} has {len(mesh)} axes; meshes here have 1 axis "
                        "(data,) like (8,) or 2 axes (data, model) like (2, 4)")
    if strategy in TWO_D_STRATEGIES and len(mesh) != 2:
        raise SpecError(f"strategy {strategy!r} needs a 2-D mesh (data, model), e.g. (2, 4) or "
                        f"(1, {mesh[0]}); got mesh {mesh_text(mesh)}. dp and fsdp take a 1-D mesh")
    if strategy in EMBEDDING_STRATEGIES:
        validate_embedding(strategy, mesh, family, cfg)
    axes = batch_axes(strategy, mesh)
    if axes:
        k = batch_ways(strategy, mesh)
        if batch_size % k:
            # Say how many ways the batch is split and of how many devices: on mesh 3x3 the data
            # axis is 3 of the 9 devices (each batch slice is copied over the model axis).
            where = f"{' x '.join(axes)} {'axes' if len(axes) > 1 else 'axis'}"
            n = math.prod(mesh)
            of = f"all {n} devices" if k == n else f"{k} of the mesh's {n} devices"
            raise SpecError(
                f"batch_size={batch_size} does not divide over the {where} of mesh "
                f"{mesh_text(mesh)}: strategy {strategy!r} splits the batch {k} ways (the "
                f"{where}: {of}); batch sizes that would divide are multiples of {k}, e.g. "
                f"{_nearest_multiples(batch_size, k)}")
    if strategy == "ep":
        experts = family.expert_count(cfg)
        m = mesh[1] if len(mesh) == 2 else 1
        if not experts:
            raise SpecError(f"strategy 'ep' splits a mixture-of-experts layer's experts, but "
                            f"{family.name} has none; use fsdp, tp, dp_tp or fsdp_tp "
                            "(hf:mixtral has experts)")
        if experts % m:
            raise SpecError(f"strategy 'ep' splits {family.name}'s {experts} experts over the "
                            f"model axis of mesh {mesh_text(mesh)}, but {m} does not divide "
                            f"{experts}; use a mesh whose model axis divides {experts}")
    widths = family.model_axis_widths(cfg) if strategy in TP_STRATEGIES else {}
    m = mesh[1] if len(mesh) == 2 else 1
    bad = {k: v for k, v in widths.items() if v % m}
    if bad:
        n = math.prod(mesh)
        ok = [d for d in _divisors(math.gcd(*widths.values())) if n % d == 0]
        meshes = ", ".join(f"{n // d}x{d}" for d in ok)
        names = " and ".join(widths)
        raise SpecError(
            f"strategy {strategy!r} splits {family.name}'s {names} {m} ways over the model "
            f"axis of mesh {mesh_text(mesh)} ({m} of its {n} devices), but "
            + ", ".join(f"{k}={v}" for k, v in bad.items())
            + f" is not divisible by {m}"
            # Grouped-query attention: the KV heads, fewer than the query heads, bind first.
            + (" (each device holds whole KV heads)" if any("key_value" in k for k in bad) else "")
            + f"; valid model axes divide {names}: "
            + f"meshes {meshes}, or options whose {names} divide by {m}")
