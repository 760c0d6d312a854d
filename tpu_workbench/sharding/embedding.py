"""The embedding strategies (``table``, ``row``, ``column``): which dim of a family's declared
embedding tables each splits over every device, and their checks (pure Python, no torch).

A family declares its tables (:meth:`~tpu_workbench.models.base.ModelFamily.embedding_tables`)
and its module carries the same as ``embedding_axes`` (parameter name -> the role of each dim:
``table``, ``row``, ``column``), so no strategy names a model. Every other parameter is
replicated and the batch is split over every device: the dense layers are data parallel.

What GSPMD can express: one program runs on every device, and each device holds a buffer of
each parameter's per-device shape. ``row`` and ``column`` split a table's dim like any other
tensor. Whole tables on one device each (``table``) need the tables stacked into one tensor
whose leading, table dim is split: a table kept as its own parameter cannot live on one device
only (a ``{maximal device=k}`` sharding still allocates it on all of them). Stacking pads every
table to the largest one's rows, which the per-chip memory shows. SparseCore (v5p, v6e), where
a TPU serves embedding lookups in hardware, is not reachable from torch_xla.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

from ..errors import SpecError
from .mesh import Partition, _all_devices, mesh_text


def embedding_partition(roles: Sequence[str], strategy: str, mesh_shape: Sequence[int],
                        name: str = "table") -> Partition:
    """The partition of a table parameter whose dims have `roles` under an embedding
    `strategy`: the dim of the strategy's role over every device, the others whole."""
    role = strategy  # each embedding strategy splits the dim its name says
    if role not in roles:
        raise SpecError(f"strategy {strategy!r} splits the {role} dim of embedding tables, but "
                        f"{name!r} has dims {', '.join(roles)}: {_why(role)}")
    return tuple(_all_devices(mesh_shape) if r == role else None for r in roles)


def _why(role: str) -> str:
    if role == "table":
        return ("whole tables per device need the tables stacked into one tensor split on its "
                "table dim (under GSPMD every device holds a buffer of every parameter)")
    return f"it has no {role} dim"


def table_specs(axes: Mapping[str, Sequence[str]], strategy: str,
                mesh_shape: Sequence[int]) -> dict[str, Partition]:
    """Partition of every declared table parameter (`axes`: name -> dim roles)."""
    return {name: embedding_partition(roles, strategy, mesh_shape, name)
            for name, roles in axes.items()}


def _multiples(n: int, k: int) -> str:
    lo, hi = (n // k) * k, (n // k + 1) * k
    return f"{lo} or {hi}" if lo > 0 else f"{hi}"


def validate_embedding(strategy: str, mesh_shape: Sequence[int], family: Any, cfg: Any) -> None:
    """Raise SpecError where an embedding `strategy` cannot split `family`'s tables on a mesh:
    no tables declared, no stacked table dim for ``table``, rows (``row``) or the width
    (``column``) that do not divide by the device count. ``table`` may leave some devices
    fewer tables (the stack is padded)."""
    tables = family.embedding_tables(cfg)
    n = math.prod(mesh_shape)
    if not tables:
        raise SpecError(f"strategy {strategy!r} splits embedding tables, but model "
                        f"{family.name!r} declares none (a family's embedding_tables, e.g. "
                        "dlrm's); use dp, fsdp, tp or dp_tp")
    role = strategy
    for t in tables:
        if role not in t.axes:
            extra = getattr(family, "table_wise_options", None)
            raise SpecError(f"strategy {strategy!r} on model {family.name!r}: {t.param!r} has "
                            f"dims {', '.join(t.axes)}; {_why(role)}"
                            + ("; model option " + ", ".join(f"{k}={v}" for k, v in extra.items())
                               + " stacks them" if extra else ""))
        if role == "row":
            bad = [r for r in dict.fromkeys(t.rows) if r % n]
            if bad:
                r = bad[0]
                raise SpecError(
                    f"strategy 'row' splits each table's rows {n} ways over mesh "
                    f"{mesh_text(mesh_shape)}, but {t.param!r} has a table of {r} rows, not "
                    f"divisible by {n}; rows that would divide: multiples of {n}, e.g. "
                    f"{_multiples(r, n)} (model option row_multiple={n} pads every table), or "
                    f"a mesh of {', '.join(str(d) for d in _divisors(math.gcd(*t.rows)) if d > 1)} "
                    "devices")
        if role == "column" and t.dim % n:
            raise SpecError(
                f"strategy 'column' splits the embedding width {t.dim} of {t.param!r} {n} ways "
                f"over mesh {mesh_text(mesh_shape)}, but {t.dim} is not divisible by {n}; "
                f"widths that would divide: {_multiples(t.dim, n)}, or a mesh of "
                f"{', '.join(str(d) for d in _divisors(t.dim) if d > 1)} devices")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 4096) + 1) if n % d == 0][:12]


def table_sizes(model: str, preset: str, options: dict[str, Any] | None = None) -> pd.DataFrame:
    """Every embedding table of a family's preset, largest first: ``table`` (its index),
    ``param``, ``rows`` (as allocated), ``dim``, ``mb`` (fp32 weights) and ``share`` (of all the
    model's parameters, counted on the meta device). Empty for a family without tables."""
    import pandas as pd

    from .. import models

    family = models.get_model(model)
    tables = family.embedding_tables(family.config(preset, **(options or {}))) or []
    total = models.count_params(model, preset, options)
    rows = [{"table": i, "param": t.param, "rows": r, "dim": t.dim, "mb": r * t.dim * 4 / 1e6,
             "share": r * t.dim / total}
            for i, (t, r) in enumerate((t, r) for t in tables for r in t.rows)]
    frame = pd.DataFrame(rows, columns=["table", "param", "rows", "dim", "mb", "share"])
    return frame.sort_values("rows", ascending=False, kind="stable", ignore_index=True)


LOOKUP_OPS = ("gather", "scatter", "dynamic-slice", "dynamic-update-slice")


def lookup_ops(result: Any, hlo_text: str | None = None) -> pd.DataFrame:
    """The gathers and scatters of a run's compiled train step (after optimisation; needs
    ``capture=("hlo",)``), or of `hlo_text`: the lookups of embedding rows and, in the
    backward, the scatter-adds of their gradients into the tables. Columns: ``opcode``,
    ``shape`` (per device under SPMD), ``bytes``, ``source_op``, ``source`` (file:line)."""
    from .. import hlo
    from .memory import step_file

    if hlo_text is None:
        step = step_file(Path(result.out_dir) / "hlo", "after_optimizations.txt")
        if step is None:
            raise ValueError("no after-optimisations HLO of the train step; run with "
                             "capture=('hlo',)")
        hlo_text = step.read_text()
    frame = hlo.instructions(hlo_text)
    frame = frame[frame["opcode"].isin(LOOKUP_OPS)].copy()
    frame["source"] = [f"{Path(f).name}:{int(n)}" if isinstance(f, str) and f and n == n
                       else "" for f, n in zip(frame["source_file"], frame["source_line"],
                                               strict=True)]
    return frame[["opcode", "shape", "bytes", "source_op", "source"]].reset_index(drop=True)


__all__ = ["LOOKUP_OPS", "embedding_partition", "lookup_ops", "table_sizes", "table_specs",
           "validate_embedding"]
