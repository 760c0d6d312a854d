"""HLO as DataFrames: every instruction, op counts, and the collectives with their replica
groups."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ..records import require_columns
from .parse import (
    COMMENT,
    HloLike,
    HloParseError,
    as_modules,
    dtype_bits,
    shape_info,
    shape_leaves,
    strip_layouts,
)

COLUMNS = ["module", "computation", "is_entry", "is_root", "name", "opcode", "shape", "dtype",
           "dims", "elements", "bytes", "fusion_kind", "called", "operands", "source_op",
           "source_file", "source_line", "replica_groups", "attributes", "line", "text"]


def instructions(source: HloLike | Sequence[HloLike]) -> pd.DataFrame:
    """One row per instruction of every computation (columns: see the module docstring).

    `source`: HLO text, a parsed :class:`HloModule`, or a list of them. ``df.attrs["modules"]``
    keeps each module's header attributes (``num_partitions``...).
    """
    rows = []
    headers = {}
    for mod in as_modules(source):
        headers[mod.name] = dict(mod.attributes)
        for comp in mod.computations:
            for inst in comp.instructions:
                dtype, dims, elements, nbytes = shape_info(inst.shape)
                meta = inst.metadata
                line = meta.get("source_line")
                groups = inst.attributes.get("replica_groups",
                                             inst.attributes.get("source_target_pairs", ""))
                rows.append({
                    "module": mod.name, "computation": comp.name, "is_entry": comp.is_entry,
                    "is_root": inst.is_root, "name": inst.name, "opcode": inst.opcode,
                    "shape": COMMENT.sub("", strip_layouts(inst.shape)).replace("  ", " "),
                    "dtype": dtype, "dims": dims, "elements": elements, "bytes": nbytes,
                    "fusion_kind": inst.attributes.get("kind", "") if inst.opcode == "fusion"
                    else "",
                    "called": inst.called, "operands": list(inst.operands),
                    "source_op": meta.get("op_type", ""),
                    "source_file": meta.get("source_file", ""),
                    "source_line": int(line) if line and line.isdigit() else None,
                    "replica_groups": groups if _collective_kind(inst.opcode) else "",
                    "attributes": dict(inst.attributes), "line": inst.line,
                    "text": inst.text.strip(),
                })
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["source_line"] = df["source_line"].astype("Int64")
    df.attrs["modules"] = headers
    return df


def as_frame(source: Any) -> pd.DataFrame:
    return source if isinstance(source, pd.DataFrame) else instructions(source)


def op_counts(source: Any, scope: str = "all") -> dict[str, int]:
    """Instructions per opcode, most frequent first. `scope`: ``all`` computations (fused ones
    included: what the program does), or ``entry`` (top level: fusions, calls, copies...)."""
    df = as_frame(source)
    if scope == "entry":
        df = df[df["is_entry"]]
    elif scope != "all":
        raise ValueError(f"scope must be 'all' or 'entry', got {scope!r}")
    return {k: int(v) for k, v in df["opcode"].value_counts().items()}


COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                    "collective-permute", "collective-broadcast", "ragged-all-to-all")


def _collective_kind(opcode: str) -> str:
    """The collective kind of an opcode (``all-reduce-start`` -> ``all-reduce``), or ""."""
    base = opcode.removesuffix("-start").removesuffix("-done")
    return base if base in COLLECTIVE_KINDS else ""


def parse_replica_groups(text: str) -> list[list[int]]:
    """Expand a ``replica_groups=`` value into explicit groups.

    ``{{0,1,2,3},{4,5,6,7}}`` -> [[0,1,2,3],[4,5,6,7]]; the iota form ``[2,4]<=[8]`` ->
    the same; ``[4,2]<=[2,4]T(1,0)`` -> [[0,4],[1,5],[2,6],[3,7]]; libtpu's
    ``mesh['a'=2,'b'=4] {'b'}`` -> [[0,1,2,3],[4,5,6,7]] (``{'a'}``: [[0,4],[1,5],...]);
    ``{}`` -> [] (one group of every device). Also reads ``source_target_pairs={{0,1},{1,2}}``.
    """
    text = text.strip()
    if not text or text == "{}":
        return []
    m = re.fullmatch(r"\[([\d,\s]+)\]<=\[([\d,\s]+)\](?:T\(([\d,\s]+)\))?", text)
    if m:
        import numpy as np

        shape = [int(x) for x in m.group(1).split(",")]
        reshape = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(math.prod(reshape)).reshape(reshape)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        if len(shape) != 2:
            shape = [math.prod(shape[:-1]), shape[-1]]
        return ids.reshape(shape).tolist()
    m = re.fullmatch(r"mesh\[([^\]]*)\]\s*\{([^}]*)\}", text)
    if m:  # newer XLA (libtpu): mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, devices in mesh order
        import numpy as np

        axes = [(name, int(size)) for name, size in re.findall(r"'([^']+)'=(\d+)", m.group(1))]
        chosen = re.findall(r"'([^']+)'", m.group(2))
        names = [a for a, _ in axes]
        if not axes or any(c not in names for c in chosen):
            raise HloParseError(f"cannot read replica groups {text!r}")
        ids = np.arange(math.prod(s for _, s in axes)).reshape([s for _, s in axes])
        keep = [names.index(c) for c in chosen]
        ids = ids.transpose([i for i in range(len(axes)) if i not in keep] + keep)
        return ids.reshape(-1, math.prod(ids.shape[len(axes) - len(keep):])).tolist()
    if text.startswith("{"):
        groups = re.findall(r"\{([\d,\s]*)\}", text[1:-1] if text.endswith("}") else text)
        return [[int(x) for x in g.split(",") if x.strip()] for g in groups]
    raise HloParseError(f"cannot read replica groups {text!r}")


def collectives(source: Any) -> pd.DataFrame:
    """One row per collective: kind, name, opcode, bytes, dtype, shape, replica_groups (list of
    lists), group_size, num_groups, groups_text, computation, module, source_op, source_file,
    source_line (the aten op and Python line behind it, where the HLO has metadata).

    Async pairs count once (the ``-start``; ``-done`` rows are dropped). ``bytes`` is the size of
    the collective's result (for an async start's tuple, its largest element). An empty
    ``replica_groups`` means one group of every device: group_size is then the module's
    ``num_partitions * replica_count`` when known.
    """
    df = as_frame(source)
    headers = df.attrs.get("modules", {})
    rows = []
    for r in df.itertuples(index=False):
        kind = _collective_kind(r.opcode)
        if not kind or r.opcode.endswith("-done"):
            continue
        groups = parse_replica_groups(r.replica_groups)
        head = headers.get(r.module, {})
        devices = int(head.get("num_partitions", 1)) * int(head.get("replica_count", 1))
        if groups:
            size, n = (2, len(groups)) if kind == "collective-permute" else \
                (len(groups[0]), len(groups))
        else:
            size, n = (devices if head else None), 1
        nbytes = r.bytes
        if r.opcode.endswith("-start") and r.dtype == "tuple":
            leaves = shape_leaves(r.shape)
            nbytes = max((math.ceil(math.prod(d) * dtype_bits(t) / 8) for t, d in leaves),
                         default=0)
        rows.append({"kind": kind, "name": r.name, "opcode": r.opcode, "bytes": int(nbytes),
                     "dtype": r.dtype, "shape": r.shape, "replica_groups": groups,
                     "group_size": size, "num_groups": n, "groups_text": r.replica_groups,
                     "computation": r.computation, "module": r.module,
                     "source_op": r.source_op, "source_file": r.source_file,
                     "source_line": r.source_line})
    cols = ["kind", "name", "opcode", "bytes", "dtype", "shape", "replica_groups", "group_size",
            "num_groups", "groups_text", "computation", "module", "source_op", "source_file",
            "source_line"]
    return pd.DataFrame(rows, columns=cols)


def fusion_table(ops: pd.DataFrame) -> pd.DataFrame:
    """Fusions of the entry computation: name, fusion_kind, shape, bytes, called, and the ops
    inside each fused computation (``fused_ops``, ``fused_count``).

    Input: :func:`tpu_workbench.hlo.instructions`.
    """
    require_columns(ops, ["opcode", "is_entry", "name", "fusion_kind", "called", "computation",
                   "module"], "fusion_table")
    inner = ops[ops["opcode"] != "parameter"].groupby(["module", "computation"])["opcode"]
    inside = {k: v.value_counts().to_dict() for k, v in inner}
    rows = []
    for r in ops[ops["opcode"].isin(["fusion", "call"])].itertuples(index=False):
        fused: dict[str, int] = {}
        for comp in r.called:
            for op, n in inside.get((r.module, comp), {}).items():
                fused[op] = fused.get(op, 0) + int(n)
        rows.append({"module": r.module, "computation": r.computation, "name": r.name,
                     "opcode": r.opcode, "fusion_kind": r.fusion_kind,
                     "shape": r.shape, "bytes": r.bytes, "called": ", ".join(r.called),
                     "fused_count": sum(fused.values()),
                     "fused_ops": ", ".join(f"{k} {v}" for k, v in
                                            sorted(fused.items(), key=lambda kv: -kv[1]))})
    cols = ["module", "computation", "name", "opcode", "fusion_kind", "shape", "bytes", "called",
            "fused_count", "fused_ops"]
    return pd.DataFrame(rows, columns=cols)


def collective_table(coll: pd.DataFrame) -> pd.DataFrame:
    """Collectives grouped by kind and replica groups: count, total bytes, group size -- from
    :func:`tpu_workbench.hlo.collectives`."""
    require_columns(coll, ["kind", "name", "replica_groups", "bytes", "group_size", "num_groups"],
             "collective_table")
    if not len(coll):
        return pd.DataFrame(columns=["kind", "replica_groups", "count", "bytes", "group_size",
                                     "num_groups"])
    g = coll.assign(replica_groups=[str(x) for x in coll["replica_groups"]]).groupby(
        ["kind", "replica_groups"], sort=False)
    out = g.agg(count=("name", "size"), bytes=("bytes", "sum"), group_size=("group_size", "first"),
                num_groups=("num_groups", "first")).reset_index()
    return out
