"""What a compiled step runs, kernel by kernel, and what one kernel is made of.

An optimised module's text counts every instruction of every computation: each fusion's own
computation with its own parameters, and on XLA:CPU a ``call`` that splits a fusion over
threads (``parallel_*`` computations holding a ``.clone`` of it). So the text of minGPT tiny's
step holds about 3,500 instructions against 1,900 before optimisation, while it runs about 190
kernels. :func:`kernels` lists those kernels (the entry computation's instructions that do work,
a parallel call as the fusion it wraps); :func:`op_detail` opens one: its line, the
instructions fused into it, and the lines of the model (HLO metadata) that made them.
"""

from __future__ import annotations

import linecache
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..records import require_columns

# Instructions that only name or pass values: no kernel runs for them.
PLUMBING = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast")
KERNEL_COLUMNS = ["module", "name", "kernel", "opcode", "fusion_kind", "shape", "bytes",
                  "ops_inside", "inside", "source", "parallel"]


def _source(row) -> str:
    """``aten__addmm @ linear.py:134`` from an instruction's metadata, or ""."""
    if not row.source_op and not row.source_file:
        return ""
    where = f"{Path(row.source_file).name}:{row.source_line}" if row.source_file else ""
    return " @ ".join(p for p in (row.source_op, where) if p)


def _called_rows(groups: dict[str, pd.DataFrame], computations: list[str]) -> pd.DataFrame:
    """Instructions of `computations` and of everything they call in turn (fusions within a
    parallel call), in order. `groups`: :func:`_by_computation`."""
    seen, todo, parts = set(), list(computations), []
    while todo:
        comp = todo.pop(0)
        if comp in seen or comp not in groups:
            continue
        seen.add(comp)
        rows = groups[comp]
        parts.append(rows)
        for called in rows["called"]:
            todo.extend(called)
    return pd.concat(parts) if parts else next(iter(groups.values())).iloc[:0]


def _by_computation(ops: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return dict(iter(ops.groupby("computation", sort=False)))


def _resolve(groups: dict[str, pd.DataFrame], row) -> tuple[object, bool]:
    """The instruction that does the work of an entry instruction: a call XLA:CPU makes to run
    one fusion over several threads is that fusion (its ``.clone``)."""
    if row.opcode != "call":
        return row, False
    inner = _called_rows(groups, list(row.called))
    work = inner[~inner["opcode"].isin(PLUMBING + ("concatenate",))
                 & inner["computation"].isin(row.called)]
    if len(work) and work["opcode"].eq(work["opcode"].iloc[0]).all():
        return next(work.itertuples(index=False)), True
    return row, True


def kernels(ops: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel the module's entry computation runs (columns :data:`KERNEL_COLUMNS`):
    ``name`` the entry instruction, ``kernel`` the instruction that does the work (the fusion a
    parallel ``call`` wraps; ``parallel`` True), ``opcode`` its opcode, ``ops_inside`` the
    instructions fused into it (parameters left out) summed up in ``inside``, ``source`` the
    model lines that made them, most frequent first (HLO metadata; empty without
    ``XLA_HLO_DEBUG``). Input: :func:`tpu_workbench.hlo.instructions`."""
    require_columns(ops, ["module", "computation", "is_entry", "name", "opcode", "called",
                          "fusion_kind", "shape", "bytes", "source_op", "source_file",
                          "source_line"], "kernels")
    rows, groups = [], _by_computation(ops)
    for row in ops[ops["is_entry"] & ~ops["opcode"].isin(PLUMBING)].itertuples(index=False):
        work, parallel = _resolve(groups, row)
        inner = _called_rows(groups, list(work.called)) if work.called else ops.iloc[:0]
        inner = inner[~inner["opcode"].isin(("parameter",))]
        made_of = Counter(inner["opcode"])
        sources = Counter(s for s in map(_source, (inner if len(inner) else pd.DataFrame(
            [work._asdict()])).itertuples(index=False)) if s)
        rows.append({"module": row.module, "name": row.name, "kernel": work.name,
                     "opcode": work.opcode, "fusion_kind": work.fusion_kind,
                     "shape": row.shape, "bytes": int(row.bytes), "ops_inside": len(inner),
                     "inside": ", ".join(f"{k} {v}" for k, v in made_of.most_common()),
                     "source": "; ".join(s for s, _ in sources.most_common()),
                     "parallel": parallel})
    return pd.DataFrame(rows, columns=KERNEL_COLUMNS)


def program_counts(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """How big a step is before and after optimisation, counted three ways, so that the text
    growing under optimisation is not read as the program doubling: instructions in the text,
    of which parameters (every fused computation has its own), and the kernels it runs."""
    def counts(ops: pd.DataFrame) -> dict[str, int]:
        entry = ops[ops["is_entry"]]
        return {"instructions in the text": len(ops),
                "parameters (inputs, and each fusion's own)":
                    int((ops["opcode"] == "parameter").sum()),
                "computations (a fusion or a parallel task is one)":
                    int(ops["computation"].nunique()),
                "kernels the step runs":
                    int((~entry["opcode"].isin(PLUMBING)).sum())}

    b, a = counts(before), counts(after)
    return pd.DataFrame({"": list(b), "before optimisation": list(b.values()),
                         "after optimisation": list(a.values())})


@dataclass(frozen=True)
class OpDetail:
    """One kernel opened up: ``text`` its instruction as compiled, ``inside`` the instructions
    fused into it (name, opcode, shape, source), ``sources`` the model lines that made them
    (``source_op``, ``file``, ``line``, ``count``, ``code``: that line of the file, where it can be
    read here)."""

    name: str
    kernel: str
    text: str
    inside: pd.DataFrame
    sources: pd.DataFrame


def find_kernel(ops: pd.DataFrame, name: str) -> str:
    """The entry instruction whose kernel is `name`: an entry instruction itself, or an
    instruction inside one (a profile names the ``.clone`` a parallel call runs, or an op in a
    fused computation). Raises ValueError naming a few valid names."""
    names = set(ops["name"])
    if name not in names:
        sample = ", ".join(sorted(ops[ops["is_entry"]]["name"])[:5])
        raise ValueError(f"no instruction {name!r} in this module; entry instructions "
                         f"include {sample}")
    row = ops[ops["name"] == name].iloc[0]
    if row["is_entry"]:
        return name
    parents: dict[str, str] = {}
    for r in ops.itertuples(index=False):
        for comp in r.called:
            parents.setdefault(comp, r.name)
    comp, entry = row["computation"], set(ops[ops["is_entry"]]["name"])
    while comp in parents:
        caller = parents[comp]
        if caller in entry:
            return caller
        comp = ops[ops["name"] == caller]["computation"].iloc[0]
    raise ValueError(f"instruction {name!r} is not reached from the entry computation")


def op_detail(ops: pd.DataFrame, name: str) -> OpDetail:
    """Kernel `name` (an entry instruction or anything inside one, see :func:`find_kernel`)
    opened up: its line, what is fused into it and the model lines behind it."""
    entry = find_kernel(ops, name)
    row = next(ops[ops["name"] == entry].itertuples(index=False))
    groups = _by_computation(ops)
    work, _ = _resolve(groups, row)
    inner = _called_rows(groups, list(work.called)) if work.called else pd.DataFrame(
        [work._asdict()])
    inner = inner[inner["opcode"] != "parameter"]
    inside = inner.assign(source=[_source(r) for r in inner.itertuples(index=False)])[
        ["name", "opcode", "shape", "source"]].reset_index(drop=True)
    lines = inner[inner["source_file"] != ""].groupby(
        ["source_op", "source_file", "source_line"], dropna=False).size()
    sources = pd.DataFrame([
        {"source_op": op, "file": short_path(file), "line": None if pd.isna(line) else int(line),
         "count": int(n), "code": linecache.getline(file, int(line)).strip()
         if not pd.isna(line) else ""}
        for (op, file, line), n in lines.sort_values(ascending=False).items()],
        columns=["source_op", "file", "line", "count", "code"])
    return OpDetail(entry, work.name, work.text if work is not row else row.text, inside,
                    sources)


def short_path(path: str) -> str:
    """A source file as a reader recognises it: ``torch/nn/modules/linear.py`` for a package
    file, the path below the working folder for the project's own (``tpu_workbench/...``)."""
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def with_kinds(frame: pd.DataFrame, kernels_frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` (rows named by entry instruction, column ``name``: :func:`per_op_cost`, a
    profile joined to it) with ``kind``: the opcode of the kernel each row runs, so that an
    XLA:CPU parallel ``call`` reads as the fusion it runs."""
    kinds = dict(zip(kernels_frame["name"], kernels_frame["opcode"], strict=True))
    return frame.assign(kind=[kinds.get(n, op) for n, op in
                              zip(frame["name"], frame["opcode"], strict=True)])
