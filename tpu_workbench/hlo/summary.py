"""One module summarised (instructions, ops, fusions, FLOPs, collectives), and the diff of two."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pandas as pd

from .cost import cost_analysis, dot_flops
from .frames import as_frame, collectives, instructions, op_counts
from .parse import CostAnalysisError, HloLike, as_modules


def summary(source: Any, cost: bool = True, frame: pd.DataFrame | None = None
            ) -> dict[str, Any]:
    """Key figures of one module (or several, summed): a JSON-ready dict.

    Keys: modules, num_modules, num_partitions, replica_count, computations, instructions,
    entry_instructions, ops_by_opcode (all computations), entry_ops_by_opcode, fusions_by_kind,
    collectives ({kind: {count, bytes, replica_groups}}), collective_count, collective_bytes,
    dot_flops (analytic, always), xla_flops / xla_bytes_accessed / xla_transcendentals (XLA's cost
    analysis; None when `cost` is False, jaxlib is missing or `source` is a DataFrame, with the
    reason in cost_error). `frame`: :func:`instructions` of `source`, when the caller has it
    (parsing a training step's HLO takes about half a second).
    """
    texts: list[str] = []
    if isinstance(source, pd.DataFrame):
        df = source
    else:
        mods = as_modules(source)
        texts = [m.text for m in mods]
        df = instructions(mods) if frame is None else frame
    headers = df.attrs.get("modules", {})
    coll = collectives(df)
    by_kind: dict[str, dict[str, Any]] = {}
    for kind, g in coll.groupby("kind", sort=False):
        by_kind[str(kind)] = {"count": len(g), "bytes": int(g["bytes"].sum()),
                              "replica_groups": sorted({json.dumps(x) for x in
                                                        g["replica_groups"]})}
    for v in by_kind.values():
        v["replica_groups"] = [json.loads(x) for x in v["replica_groups"]]
    fusions = df[df["opcode"] == "fusion"]["fusion_kind"].value_counts()
    modules = list(dict.fromkeys(df["module"]))
    out: dict[str, Any] = {
        "modules": modules, "num_modules": len(modules),
        "num_partitions": max((int(h.get("num_partitions", 1)) for h in headers.values()),
                              default=None),
        "replica_count": max((int(h.get("replica_count", 1)) for h in headers.values()),
                             default=None),
        "computations": int(df[["module", "computation"]].drop_duplicates().shape[0]),
        "instructions": len(df), "entry_instructions": int(df["is_entry"].sum()),
        "ops_by_opcode": op_counts(df), "entry_ops_by_opcode": op_counts(df, "entry"),
        "fusions_by_kind": {str(k): int(v) for k, v in fusions.items()},
        "collectives": by_kind, "collective_count": len(coll),
        "collective_bytes": int(coll["bytes"].sum()) if len(coll) else 0,
        "dot_flops": float(dot_flops(df)["flops"].sum()),
        "xla_flops": None, "xla_bytes_accessed": None, "xla_transcendentals": None,
        "cost_error": None,
    }
    if not cost:
        out["cost_error"] = "not asked for (cost=False)"
    elif not texts:
        out["cost_error"] = "XLA's cost analysis needs the HLO text, not a DataFrame"
    else:
        try:
            costs = [cost_analysis(t) for t in texts]
            out["xla_flops"] = sum(c["flops"] for c in costs)
            out["xla_bytes_accessed"] = sum(c["bytes_accessed"] for c in costs)
            out["xla_transcendentals"] = sum(c["transcendentals"] for c in costs)
        except CostAnalysisError as exc:
            out["cost_error"] = str(exc)
    return out


DIFF_COLUMNS = ["kind", "item", "a", "b", "delta", "status"]


def diff(a: Any, b: Any, label_a: str = "a", label_b: str = "b",
         scope: str = "all") -> pd.DataFrame:
    """Compare two modules (or two lists of modules, e.g. dynamo's several graphs per step with
    lazy's one): counts per opcode and per collective kind on each side.

    Columns: kind (``modules``, ``collective`` or ``op``), item (opcode or collective kind; the
    ``modules`` row counts the modules on each side), a, b (counts), delta (b - a), status
    (``added``, ``removed``, ``changed``, ``same``). Rows: modules, then collectives, then ops by
    largest change. ``df.attrs`` holds label_a and label_b. `scope`: ``all`` computations or
    ``entry`` only (see :func:`op_counts`).
    """
    df_a, df_b = as_frame(as_modules(a) if not isinstance(a, pd.DataFrame) else a), \
        as_frame(as_modules(b) if not isinstance(b, pd.DataFrame) else b)
    rows = [_diff_row("modules", "modules", df_a["module"].nunique(), df_b["module"].nunique())]
    ca, cb = collectives(df_a)["kind"].value_counts(), collectives(df_b)["kind"].value_counts()
    for kind in sorted(set(ca.index) | set(cb.index)):
        rows.append(_diff_row("collective", kind, ca.get(kind, 0), cb.get(kind, 0)))
    oa, ob = op_counts(df_a, scope), op_counts(df_b, scope)
    ops = [_diff_row("op", op, oa.get(op, 0), ob.get(op, 0)) for op in set(oa) | set(ob)]
    ops.sort(key=lambda r: (-abs(r["delta"]), -max(r["a"], r["b"]), r["item"]))
    out = pd.DataFrame(rows + ops, columns=DIFF_COLUMNS)
    out.attrs.update(label_a=label_a, label_b=label_b)
    return out


def diff_modules(list_a: Sequence[HloLike], list_b: Sequence[HloLike], label_a: str = "a",
                 label_b: str = "b", scope: str = "all") -> pd.DataFrame:
    """:func:`diff` of two lists of modules (counts summed per side; the ``modules`` row gives
    how many modules each side compiled)."""
    return diff(list(list_a), list(list_b), label_a, label_b, scope)


def _diff_row(kind: str, item: str, a: int, b: int) -> dict[str, Any]:
    a, b = int(a), int(b)
    status = "same" if a == b else "added" if a == 0 else "removed" if b == 0 else "changed"
    return {"kind": kind, "item": item, "a": a, "b": b, "delta": b - a, "status": status}
