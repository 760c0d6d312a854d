"""What an HLO module costs: analytic dot/conv FLOPs, XLA's own cost analysis (jaxlib), and a
per-instruction estimate of FLOPs and bytes for roofline points."""

from __future__ import annotations

import contextlib
import math
import re
from typing import Any

import pandas as pd

from .frames import instructions
from .parse import (
    LITERAL_OPS,
    CostAnalysisError,
    HloInstruction,
    HloLike,
    HloModule,
    HloParseError,
    as_modules,
    callees,
    clip,
    propagate,
    shape_info,
    strip_layouts,
)


def _dims_lookup(df: pd.DataFrame) -> dict[tuple[str, str], tuple[int, ...] | None]:
    return {(m, n): d for m, n, d in zip(df["module"], df["name"], df["dims"], strict=True)}


def _int_list(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", text or "")]


def instruction_flops(opcode: str, attributes: dict[str, str],
                      result_dims: tuple[int, ...] | None,
                      lhs_dims: tuple[int, ...] | None,
                      rhs_dims: tuple[int, ...] | None) -> float:
    """Analytic FLOPs of one dot (2 * result elements * contracted size) or convolution
    (2 * result elements * kernel elements / output features), else 0."""
    if result_dims is None:
        return 0.0
    out = math.prod(result_dims)
    if opcode == "dot":
        if lhs_dims is None:
            return math.nan
        k = math.prod(lhs_dims[i] for i in _int_list(attributes.get("lhs_contracting_dims", ""))
                      if i < len(lhs_dims))
        return 2.0 * out * k
    if opcode == "convolution":
        if rhs_dims is None:
            return math.nan
        labels = attributes.get("dim_labels", "")
        kernel = labels.split("_")[1].split("->")[0] if "_" in labels else ""
        o = rhs_dims[kernel.index("o")] if "o" in kernel and len(kernel) == len(rhs_dims) \
            else rhs_dims[-1]
        return 2.0 * out * math.prod(rhs_dims) / max(o, 1)
    return 0.0


def dot_flops(source: Any) -> pd.DataFrame:
    """Analytic FLOPs of every dot and convolution that runs, one row each.

    Columns: module, computation, name, opcode, shape, lhs_dims, rhs_dims, flops_each, times,
    flops (= flops_each * times), source_op. ``times`` is how often the computation holding the
    op runs per execution (from :meth:`HloModule.multiplicity`): ops in unreachable or scalar
    reducer computations count 0. Total: ``dot_flops(text)["flops"].sum()``.

    dot: 2 * (result elements) * (product of lhs contracting dims) = 2*M*N*K (with batch dims).
    convolution: 2 * (result elements) * (kernel elements / output features) (padding counted,
    so it can be above XLA's own count, which skips padded taps).
    """
    if isinstance(source, pd.DataFrame):
        df = source
        times = _multiplicity_from_frame(df)
    else:
        mods = as_modules(source)
        df = instructions(mods)
        times = {(m.name, c): t for m in mods for c, t in m.multiplicity().items()}
    lookup = _dims_lookup(df)
    rows = []
    sub = df[df["opcode"].isin(["dot", "convolution"])]
    for r in sub.itertuples(index=False):
        lhs = lookup.get((r.module, r.operands[0])) if r.operands else None
        rhs = lookup.get((r.module, r.operands[1])) if len(r.operands) > 1 else None
        each = instruction_flops(r.opcode, r.attributes, r.dims, lhs, rhs)
        n = times.get((r.module, r.computation), 1)
        rows.append({"module": r.module, "computation": r.computation, "name": r.name,
                     "opcode": r.opcode, "shape": r.shape, "lhs_dims": lhs, "rhs_dims": rhs,
                     "flops_each": each, "times": n, "flops": each * n,
                     "source_op": r.source_op})
    cols = ["module", "computation", "name", "opcode", "shape", "lhs_dims", "rhs_dims",
            "flops_each", "times", "flops", "source_op"]
    return pd.DataFrame(rows, columns=cols)


def _multiplicity_from_frame(df: pd.DataFrame) -> dict[tuple[str, str], int]:
    """:meth:`HloModule.multiplicity` computed from an instructions frame."""
    out: dict[tuple[str, str], int] = {}
    for module, mdf in df.groupby("module", sort=False):
        comps = list(dict.fromkeys(mdf["computation"]))
        entry = mdf.loc[mdf["is_entry"], "computation"]
        edges: dict[str, list[tuple[str, int]]] = {c: [] for c in comps}
        for r in mdf.itertuples(index=False):
            edges[r.computation] += callees(r.opcode, r.attributes)
        counts = propagate(entry.iloc[0] if len(entry) else comps[-1], edges)
        out.update({(module, c): counts.get(c, 0) for c in comps})
    return out






_CPU_CLIENT: Any = None


def _xla() -> tuple[Any, Any]:
    """(xla_extension module, a CPU client) from jaxlib; CostAnalysisError if unavailable."""
    global _CPU_CLIENT
    try:
        import jax
        from jax._src.lib import xla_client as xc
    except ImportError as exc:
        raise CostAnalysisError(
            f"XLA's cost analysis needs jax/jaxlib (pip install 'torch-xla[pallas]'): {exc}"
        ) from None
    if _CPU_CLIENT is None:
        # only the CPU backend: never let this process grab a TPU the workers need (a no-op
        # when the caller already initialised jax's backends)
        with contextlib.suppress(Exception):
            jax.config.update("jax_platforms", "cpu")
        _CPU_CLIENT = jax.devices("cpu")[0].client
    return xc._xla, _CPU_CLIENT


def cost_analysis(text: str | HloModule) -> dict[str, Any]:
    """XLA's ``HloCostAnalysis`` of a whole module, via jaxlib 0.7.1.

    Returns ``flops``, ``transcendentals``, ``bytes_accessed`` (operands + outputs of every op,
    as XLA's cost model counts them), ``bytes_accessed_output`` and ``raw`` (jaxlib's dict).
    Both ``before_optimizations`` and XLA:CPU ``cpu_after_optimizations`` dumps parse; for an
    SPMD module the after-optimisation text gives per-device costs. XLA counts a while loop's
    body once, whatever its trip count (:func:`dot_flops` multiplies by ``known_trip_count``).
    Raises :class:`CostAnalysisError` when jaxlib is missing or rejects the text.
    """
    hlo_text = text.text if isinstance(text, HloModule) else text
    if not isinstance(hlo_text, str) or not hlo_text.strip():
        raise HloParseError("cost_analysis needs non-empty HLO text")
    ext, client = _xla()
    try:
        module = ext.hlo_module_from_text(hlo_text)
    except Exception as exc:  # noqa: BLE001 - jaxlib raises XlaRuntimeError/ValueError
        raise CostAnalysisError(f"jaxlib could not parse the HLO text: {clip(str(exc), 400)}"
                                ) from None
    try:
        raw = dict(ext.hlo_module_cost_analysis(client, module))
    except Exception as exc:  # noqa: BLE001
        raise CostAnalysisError(f"XLA's cost analysis failed: {clip(str(exc), 400)}") from None
    return {"flops": float(raw.get("flops", 0.0)),
            "transcendentals": float(raw.get("transcendentals", 0.0)),
            "bytes_accessed": float(raw.get("bytes accessed", 0.0)),
            "bytes_accessed_output": float(raw.get("bytes accessedout{}", math.nan)),
            "raw": raw}


FREE_OPS = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
            "opt-barrier", "partition-id", "replica-id", "add-dependency", "domain"}


ELEMENTWISE_OPS = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs",
                   "compare", "select", "clamp", "remainder", "sign", "floor", "ceil",
                   "round-nearest-afz", "round-nearest-even", "and", "or", "xor", "not"}


TRANSCENDENTAL_OPS = {"exponential", "exponential-minus-one", "log", "log-plus-one", "tanh",
                      "logistic", "erf", "sqrt", "rsqrt", "cbrt", "power", "sine", "cosine", "tan",
                      "atan2"}


def _estimate(mod: HloModule, inst: HloInstruction) -> tuple[float, float]:
    """(flops, transcendentals) of one instruction, computations it runs included: dots and
    convolutions analytically, 1 per result element of an elementwise op, 1 per input element
    of a reduce."""
    flops = trans = 0.0
    work = [(inst, 1)]
    while work:
        ins, times = work.pop()
        if ins.opcode in ("dot", "convolution"):
            lhs = _inst_dims(mod, ins, 0)
            rhs = _inst_dims(mod, ins, 1)
            res = shape_info(ins.shape)[1]
            f = instruction_flops(ins.opcode, ins.attributes, res, lhs, rhs)
            flops += 0.0 if math.isnan(f) else f * times
        elif ins.opcode in ELEMENTWISE_OPS:
            flops += shape_info(ins.shape)[2] * times
        elif ins.opcode in TRANSCENDENTAL_OPS:
            trans += shape_info(ins.shape)[2] * times
        elif ins.opcode in ("reduce", "reduce-window") and ins.operands:
            src = mod.instruction(ins.operands[0])
            if src is not None:
                flops += shape_info(src.shape)[2] * times
        for callee, n in callees(ins.opcode, ins.attributes):
            try:
                comp = mod.computation(callee)
            except KeyError:
                continue
            work += [(i, times * n) for i in comp.instructions]
    return flops, trans


def _inst_dims(mod: HloModule, inst: HloInstruction, i: int) -> tuple[int, ...] | None:
    if i >= len(inst.operands):
        return None
    if inst.operand_shapes[i]:
        return shape_info(inst.operand_shapes[i])[1]
    src = mod.instruction(inst.operands[i])
    return shape_info(src.shape)[1] if src is not None else None


def _operand_shape(mod: HloModule, inst: HloInstruction, i: int) -> str | None:
    if inst.operand_shapes[i]:
        return inst.operand_shapes[i]
    src = mod.instruction(inst.operands[i])
    return src.shape if src is not None else None


def _bytes_touched(mod: HloModule, inst: HloInstruction) -> int:
    """Bytes of the distinct operands plus the result."""
    total = shape_info(inst.shape)[3]
    for name in dict.fromkeys(inst.operands):
        shape = _operand_shape(mod, inst, inst.operands.index(name))
        if shape is not None:
            total += shape_info(shape)[3]
    return total


def _mini_module(mod: HloModule, inst: HloInstruction) -> str:
    """A module whose entry runs only `inst` on parameters, with the computations it calls."""
    needed: set[str] = set()
    stack = list(inst.called)
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        try:
            comp = mod.computation(name)
        except KeyError:
            continue
        needed.add(name)
        for i in comp.instructions:
            stack += i.called
    head = f"HloModule cost_{inst.name}"
    for key in ("num_partitions", "replica_count"):
        if key in mod.attributes:
            head += f", {key}={mod.attributes[key]}"
    lines = [head, ""]
    for comp in mod.computations:
        if comp.name in needed:
            header = comp.lines[0].lstrip()
            if header.startswith("ENTRY"):
                header = header[len("ENTRY"):].lstrip()
            lines += [header, *comp.lines[1:], ""]
    params, names = [], {}
    for i, operand in enumerate(inst.operands):
        if operand in names:
            continue
        shape = _operand_shape(mod, inst, i)
        if shape is None:
            raise KeyError(operand)
        names[operand] = f"%p{len(names)}"
        params.append(f"  {names[operand]} = {shape} parameter({len(names) - 1})")
    attrs = ", ".join(f"{k}={v}" if v else k for k, v in inst.attributes.items()
                      if k not in ("control-predecessors", "metadata", "sharding"))
    args = ", ".join(names[o] for o in inst.operands)
    body = f"  ROOT %{inst.name} = {inst.shape} {inst.opcode}({args})"
    if inst.opcode in LITERAL_OPS:
        body = f"  ROOT %{inst.name} = {inst.shape} {inst.opcode}({inst.literal})"
    lines += ["ENTRY %cost_entry {", *params, body + (", " + attrs if attrs else ""), "}"]
    return "\n".join(lines) + "\n"


PER_OP_COLUMNS = ["module", "name", "opcode", "fusion_kind", "called", "shape", "flops",
                  "bytes", "transcendentals", "intensity", "method", "flops_est", "bytes_est",
                  "source_op", "source_file", "source_line"]


def per_op_cost(source: HloLike, method: str = "auto") -> pd.DataFrame:
    """FLOPs and bytes of every top-level instruction of the entry computation (fusions, calls,
    dots, copies, collectives...; free ops such as parameter, bitcast, tuple are left out).

    ``method="xla"``: XLA's HloCostAnalysis (jaxlib) of a small module made of the instruction
    alone, its operands as parameters and the computations it calls: XLA's own per-op figures.
    ``method="estimate"``: no jaxlib; dots/convolutions analytically plus 1 FLOP per element of
    elementwise ops and per reduced element; bytes = distinct operands + result (no cache reuse:
    an upper bound of HBM traffic). ``"auto"``: XLA where jaxlib can, else the estimate, per row.

    Columns: module, name, opcode, fusion_kind, called, shape, flops, bytes, transcendentals,
    intensity (flops / bytes), method (``xla`` or ``estimate``: which one filled flops/bytes),
    flops_est, bytes_est, source_op, source_file, source_line.
    """
    if method not in ("auto", "xla", "estimate"):
        raise ValueError(f"method must be 'auto', 'xla' or 'estimate', got {method!r}")
    rows = []
    ext = client = None
    if method != "estimate":
        try:
            ext, client = _xla()
        except CostAnalysisError:
            if method == "xla":
                raise
    for mod in as_modules(source):
        for inst in mod.entry.instructions:
            if inst.opcode in FREE_OPS:
                continue
            flops_est, trans_est = _estimate(mod, inst)
            bytes_est = float(_bytes_touched(mod, inst))
            flops, nbytes, trans, used = flops_est, bytes_est, trans_est, "estimate"
            if ext is not None:
                try:
                    raw = ext.hlo_module_cost_analysis(
                        client, ext.hlo_module_from_text(_mini_module(mod, inst)))
                    flops = float(raw.get("flops", 0.0))
                    nbytes = float(raw.get("bytes accessed", 0.0))
                    trans = float(raw.get("transcendentals", 0.0))
                    used = "xla"
                except Exception as exc:  # noqa: BLE001 - fall back to the estimate
                    if method == "xla":
                        raise CostAnalysisError(
                            f"XLA's cost analysis of {inst.name} failed: {clip(str(exc), 300)}"
                        ) from None
            meta = inst.metadata
            line = meta.get("source_line")
            rows.append({
                "module": mod.name, "name": inst.name, "opcode": inst.opcode,
                "fusion_kind": inst.attributes.get("kind", "") if inst.opcode == "fusion"
                else "",
                "called": inst.called, "shape": strip_layouts(inst.shape), "flops": flops,
                "bytes": nbytes, "transcendentals": trans,
                "intensity": flops / nbytes if nbytes else math.nan, "method": used,
                "flops_est": flops_est, "bytes_est": bytes_est,
                "source_op": meta.get("op_type", ""), "source_file": meta.get("source_file", ""),
                "source_line": int(line) if line and line.isdigit() else None})
    df = pd.DataFrame(rows, columns=PER_OP_COLUMNS)
    df["source_line"] = df["source_line"].astype("Int64")
    return df
