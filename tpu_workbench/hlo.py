"""HLO explorer: parse XLA's HLO text into DataFrames, count FLOPs and collectives, diff modules.

Everything here reads HLO *text* (what ``capture=("hlo",)`` copies into a run's ``hlo/`` folder,
or ``torch_xla._XLAC._get_xla_tensors_hlo``) and is plain Python + pandas: no torch_xla import.
jax/jaxlib (torch_xla's ``[pallas]`` extra) is imported lazily, only for XLA's own cost analysis.

Main entry points:

- :func:`parse_hlo` -> :class:`HloModule` (computations, instructions, header attributes);
  :func:`instructions` -> one row per instruction (columns below).
- :func:`summary` -> dict: ops by opcode, fusions by kind, collectives, FLOPs, bytes.
- :func:`collectives` -> one row per collective op, replica groups expanded (iota form too).
- :func:`cost_analysis` -> XLA's ``HloCostAnalysis`` of the whole module (via jaxlib 0.7.1).
- :func:`per_op_cost` -> FLOPs and bytes per top-level instruction of the entry computation
  (fusions, calls, dots...), for a roofline chart.
- :func:`dot_flops` -> analytic 2*M*N*K of every dot/convolution.
- :func:`diff` / :func:`diff_modules` -> opcode and collective counts of two modules (or lists).
- :func:`load_run_hlo`, :func:`read_hlo`, :func:`main_module`, :func:`memory_report`,
  :func:`search`: files of a run, the memory-usage report, a searchable listing.
- :func:`add_arguments` / :func:`run`: the ``tpu-workbench hlo`` command.

Columns of :func:`instructions`:

=================  ============================================================================
module             the module's name (``HloModule`` line)
computation        the computation holding the instruction
is_entry           True in the entry computation (the program XLA runs)
is_root            True for the computation's ROOT instruction
name               instruction name, without ``%``
opcode             ``dot``, ``fusion``, ``all-reduce``...
shape              result shape text without layout, e.g. ``f32[8,128]`` or ``(f32[2], s32[])``
dtype              element type of an array result (``f32``, ``bf16``...), ``tuple`` for tuples
dims               tuple of ints for an array result, None for a tuple
elements           number of elements of the result (sum over a tuple's leaves)
bytes              size of the result in bytes (sum over a tuple's leaves)
fusion_kind        ``kLoop``, ``kInput``, ``kOutput``, ``kCustom`` for fusions, else ""
called             computations the instruction calls (``calls=``, ``to_apply=``, ``body=``...)
operands           names of the operands
source_op          ``metadata={op_type=...}`` (the aten op torch_xla lowered), else ""
source_file        ``metadata={source_file=...}`` (needs ``XLA_HLO_DEBUG=1``), else ""
source_line        ``metadata={source_line=...}``, else None
replica_groups     the ``replica_groups=`` text of a collective (``source_target_pairs=`` for a
                   collective-permute), else ""
attributes         dict of every ``key=value`` attribute, values as text
line               1-based line number in the text
=================  ============================================================================

Which text for FLOPs: jaxlib 0.7.1 parses both ``before_optimizations`` and XLA:CPU's
``cpu_after_optimizations`` dumps (checked on minGPT, the MLP and a 2x4 SPMD program). The
*before* text gives the model's logical FLOPs; the *after* text gives what the optimised (and,
with SPMD, per-device partitioned) program computes. :func:`summary` reports both XLA's count
(``xla_flops``, when jaxlib is there) and the analytic dot/convolution count (``dot_flops``,
always).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import SpecError, WorkbenchError


class HloParseError(WorkbenchError, ValueError):
    """The text is not HLO (or not HLO this parser understands)."""


class CostAnalysisError(WorkbenchError, RuntimeError):
    """XLA's cost analysis could not run (jaxlib missing, or it rejected the text)."""


# -- shapes ---------------------------------------------------------------------------------------

DTYPE_BITS = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16,
    "s32": 32, "u32": 32, "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64,
    "c64": 64, "c128": 128, "token": 0, "opaque": 0,
}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")
_COMMENT = re.compile(r"/\*.*?\*/")


def dtype_bits(dtype: str) -> int:
    """Bits per element of an HLO element type (``f8e4m3fn`` and other fp8 types: 8)."""
    if dtype in DTYPE_BITS:
        return DTYPE_BITS[dtype]
    if dtype.startswith("f8") or dtype.startswith("f4") or dtype.startswith("f6"):
        return int(dtype[1])
    return 0


def shape_leaves(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """``(dtype, dims)`` of every array in a shape text (one for an array, several for a tuple).

    Dynamic dimensions (``<=8``) count at their bound; layouts (``{1,0}``) are ignored.
    """
    leaves = []
    for dtype, dims_text in _ARRAY.findall(_COMMENT.sub("", _strip_layouts(shape))):
        dims = []
        for d in dims_text.split(","):
            d = d.strip().lstrip("<=").strip()
            if d:
                dims.append(int(d) if d.isdigit() else 0)
        leaves.append((dtype, tuple(dims)))
    return leaves


def _strip_layouts(shape: str) -> str:
    """Remove ``{1,0}`` / ``{1,0:T(8,128)}`` layouts after array shapes."""
    out, i, n = [], 0, len(shape)
    while i < n:
        c = shape[i]
        if c == "{" and i > 0 and shape[i - 1] == "]":
            depth = 0
            while i < n:
                if shape[i] == "{":
                    depth += 1
                elif shape[i] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                i += 1
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def shape_info(shape: str) -> tuple[str, tuple[int, ...] | None, int, int]:
    """``(dtype, dims, elements, bytes)`` of a shape text; dtype ``tuple`` and dims None for a
    tuple (elements and bytes summed over its leaves)."""
    leaves = shape_leaves(shape)
    is_tuple = shape.lstrip().startswith("(")
    elements = sum(math.prod(d) for _, d in leaves)
    nbytes = sum(math.ceil(math.prod(d) * dtype_bits(t) / 8) for t, d in leaves)
    if is_tuple or not leaves:
        return ("tuple" if is_tuple else ""), None, elements, nbytes
    dtype, dims = leaves[0]
    return dtype, dims, elements, nbytes


# -- text scanning --------------------------------------------------------------------------------

_OPEN = {"(": ")", "[": "]", "{": "}"}


def _skip_quoted(s: str, i: int) -> int:
    """At a quote or ``/*`` comment starting at ``s[i]``: the index of its last character."""
    n = len(s)
    if s[i] == '"':
        i += 1
        while i < n and s[i] != '"':
            i += 2 if s[i] == "\\" else 1
        return i
    end = s.find("*/", i + 2)
    return n if end < 0 else end + 1


def _match_close(s: str, i: int) -> int:
    """Index of the bracket closing ``s[i]`` (nested brackets and quoted strings skipped)."""
    stack = []
    n = len(s)
    while i < n:
        c = s[i]
        if c == '"' or s.startswith("/*", i):
            i = _skip_quoted(s, i)
        elif c in _OPEN:
            stack.append(_OPEN[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return i
        i += 1
    return -1


def _split_top(s: str, sep: str = ",") -> list[str]:
    """Split at `sep` outside brackets and quotes."""
    parts, depth, start, i, n = [], 0, 0, 0, len(s)
    while i < n:
        c = s[i]
        if c == '"' or s.startswith("/*", i):
            i = _skip_quoted(s, i)
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(s[start:i])
            start = i + 1
        i += 1
    parts.append(s[start:])
    return [p.strip() for p in parts if p.strip()]


def _split_shape(rest: str) -> tuple[str, str]:
    """Split ``"f32[8]{0} add(...)..."`` into the shape text and what follows."""
    rest = rest.lstrip()
    if rest.startswith("("):
        end = _match_close(rest, 0)
        if end < 0:
            raise ValueError("unbalanced tuple shape")
        return rest[: end + 1], rest[end + 1:]
    # an array shape: up to the first space outside brackets (layouts hold no spaces, but
    # TPU tilings may: stop at a space at depth 0)
    depth = 0
    for i, c in enumerate(rest):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == " " and depth == 0:
            return rest[:i], rest[i:]
    return rest, ""


# -- the module model -----------------------------------------------------------------------------

CALL_ATTRS = ("calls", "to_apply", "body", "condition", "branch_computations",
              "true_computation", "false_computation", "called_computations")
# Attributes whose computations run as part of the instruction's own work (not a per-element
# scalar reducer like reduce's to_apply): costs inside them belong to the caller.
_INLINE_CALLS = {"fusion": ("calls",), "call": ("to_apply",), "async-start": ("calls",),
                 "while": ("body", "condition"), "custom-call": ("called_computations",),
                 "conditional": ("branch_computations", "true_computation",
                                 "false_computation")}
_LITERAL_OPS = {"constant", "parameter"}


@dataclass
class HloInstruction:
    name: str
    opcode: str
    shape: str  # with layout, as printed
    operands: list[str]
    operand_shapes: list[str | None]
    attributes: dict[str, str]
    attr_text: str  # the raw ", key=value..." tail, for rebuilding the line
    literal: str  # the operand text of a constant/parameter
    is_root: bool
    line: int
    text: str

    @property
    def called(self) -> list[str]:
        out = []
        for key in CALL_ATTRS:
            if key in self.attributes:
                out += [c.strip().lstrip("%") for c in
                        self.attributes[key].strip("{}").split(",") if c.strip()]
        return out

    @property
    def metadata(self) -> dict[str, str]:
        return parse_metadata(self.attributes.get("metadata", ""))


@dataclass
class HloComputation:
    name: str
    is_entry: bool
    line: int
    header: str
    instructions: list[HloInstruction] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def root(self) -> HloInstruction | None:
        for inst in self.instructions:
            if inst.is_root:
                return inst
        return self.instructions[-1] if self.instructions else None


@dataclass
class HloModule:
    """One parsed HLO module: header attributes and computations in printed order."""

    name: str
    attributes: dict[str, str]
    computations: list[HloComputation]
    text: str

    @property
    def entry(self) -> HloComputation:
        for comp in self.computations:
            if comp.is_entry:
                return comp
        return self.computations[-1]  # XLA prints the entry last

    def computation(self, name: str) -> HloComputation:
        return self._by_name()[name]

    def _by_name(self) -> dict[str, HloComputation]:
        cache = self.__dict__.get("_comp_cache")
        if cache is None:
            cache = self.__dict__["_comp_cache"] = {c.name: c for c in self.computations}
        return cache

    def instruction(self, name: str) -> HloInstruction | None:
        cache = self.__dict__.get("_inst_cache")
        if cache is None:
            cache = self.__dict__["_inst_cache"] = {
                i.name: i for c in self.computations for i in c.instructions}
        return cache.get(name)

    @property
    def num_partitions(self) -> int:
        return int(self.attributes.get("num_partitions", "1"))

    @property
    def replica_count(self) -> int:
        return int(self.attributes.get("replica_count", "1"))

    def multiplicity(self) -> dict[str, int]:
        """How many times each computation runs per execution of the entry, following fusions,
        calls, while bodies (``known_trip_count`` times when XLA recorded it, else once) and
        conditionals (each branch once). Scalar
        reducers (``to_apply`` of reduce, all-reduce, scatter...) and unreachable computations
        get 0."""
        edges: dict[str, list[tuple[str, int]]] = {c.name: [] for c in self.computations}
        for comp in self.computations:
            for inst in comp.instructions:
                edges[comp.name] += _callees(inst.opcode, inst.attributes)
        return _propagate(self.entry.name, edges)


def _names(value: str) -> list[str]:
    return [c.strip().lstrip("%") for c in value.strip("{}").split(",") if c.strip()]


_METADATA = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s}]+)')


def parse_metadata(text: str) -> dict[str, str]:
    """``{op_type="aten__mm" source_line=12}`` -> ``{"op_type": "aten__mm", "source_line":
    "12"}``."""
    return {k: (v[1:-1] if v.startswith('"') else v) for k, v in _METADATA.findall(text)}


_INST = re.compile(r"^\s*(ROOT\s+)?(%?[\w.\-]+)\s*=\s*(.*)$")
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(.*)\{\s*$")


def _parse_instruction(line: str, lineno: int) -> HloInstruction:
    m = _INST.match(line)
    if not m:
        raise ValueError("not an instruction")
    is_root, name, rest = bool(m.group(1)), m.group(2).lstrip("%"), m.group(3)
    shape, rest = _split_shape(rest)
    rest = rest.lstrip()
    om = re.match(r"([\w\-]+)\(", rest)
    if not om:
        raise ValueError("no opcode(...) after the shape")
    opcode = om.group(1)
    close = _match_close(rest, om.end() - 1)
    if close < 0:
        raise ValueError("unbalanced operand list")
    operand_text = rest[om.end(): close]
    attr_text = rest[close + 1:]
    operands: list[str] = []
    operand_shapes: list[str | None] = []
    literal = ""
    if opcode in _LITERAL_OPS:
        literal = operand_text
    else:
        for piece in _split_top(operand_text):
            piece = _COMMENT.sub("", piece).strip()
            if not piece:
                continue
            head, _, last = piece.rpartition(" ")
            operands.append(last.lstrip("%"))
            operand_shapes.append(head.strip() or None)
    attributes = {}
    for piece in _split_top(attr_text):
        key, eq, value = piece.partition("=")
        attributes[key.strip()] = value.strip() if eq else ""
    return HloInstruction(name, opcode, shape.strip(), operands, operand_shapes, attributes,
                          attr_text, literal, is_root, lineno, line.rstrip())


def parse_hlo(text: str) -> HloModule:
    """Parse one module of HLO text (``HloModule ...`` then its computations).

    Raises :class:`HloParseError` naming the line when the text is not HLO.
    """
    if isinstance(text, HloModule):
        return text
    if not isinstance(text, str):
        raise HloParseError(f"expected HLO text (a str), got {type(text).__name__}")
    if not text.strip():
        raise HloParseError("the HLO text is empty")
    if "\n" not in text.strip() and len(text) < 4096 and Path(text.strip()).is_file():
        raise HloParseError(f"{text.strip()!r} is a file name, not HLO text; pass "
                            "Path(...) or its read_text()")
    name, attributes = "", {}
    computations: list[HloComputation] = []
    current: HloComputation | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if current is not None:
            current.lines.append(line)
            if stripped.startswith("}"):  # "}" or "}, execution_thread=..."
                computations.append(current)
                current = None
                continue
            if not stripped or stripped.startswith("//"):
                continue
            try:
                current.instructions.append(_parse_instruction(line, lineno))
            except ValueError as exc:
                raise HloParseError(
                    f"line {lineno} is not an HLO instruction ({exc}): {_clip(stripped)}"
                ) from None
            continue
        if not stripped or stripped.startswith("//"):
            continue
        if stripped.startswith("HloModule "):
            if name:
                if computations:
                    break  # a second module: parse_modules() splits them
                raise HloParseError(f"line {lineno}: a second HloModule line before any "
                                    "computation")
            head = stripped[len("HloModule "):]
            parts = _split_top(head)
            name = parts[0] if parts else ""
            for piece in parts[1:]:
                key, _, value = piece.partition("=")
                attributes[key.strip()] = value.strip()
            continue
        m = _COMP.match(stripped)
        if m and not line[:1].isspace():
            current = HloComputation(m.group(2), bool(m.group(1)), lineno, stripped)
            current.lines.append(line)
            continue
        if computations or name:
            # trailer sections some XLA versions print (FileNames, StackFrames...) are skipped
            continue
        raise HloParseError(f"line {lineno} is not HLO (expected 'HloModule <name>' or a "
                            f"computation '%name (...) -> ... {{'): {_clip(stripped)}")
    if current is not None:
        raise HloParseError(f"computation {current.name!r} opened at line {current.line} is "
                            "never closed with '}'")
    if not computations:
        raise HloParseError("no HLO computation found in the text (expected 'ENTRY %main "
                            "(...) -> ... {' and instruction lines)")
    if not name:
        name = next((c.name for c in computations if c.is_entry), computations[-1].name)
    return HloModule(name, attributes, computations, text)


def parse_modules(text: str) -> list[HloModule]:
    """Every module of a text holding several (``XLA_SAVE_TENSORS_FILE`` style dumps)."""
    chunks = re.split(r"(?m)^(?=HloModule )", text)
    chunks = [c for c in chunks if c.strip()]
    if len(chunks) <= 1:
        return [parse_hlo(text)]
    return [parse_hlo(c) for c in chunks if c.lstrip().startswith("HloModule ")]


def _clip(s: str, n: int = 120) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


HloLike = str | HloModule


def _modules(source: HloLike | Sequence[HloLike]) -> list[HloModule]:
    if isinstance(source, HloModule):
        return [source]
    if isinstance(source, str):
        return parse_modules(source)
    if isinstance(source, Path):
        return parse_modules(source.read_text())
    out: list[HloModule] = []
    for item in source:
        out += _modules(item)
    return out


# -- instructions frame ---------------------------------------------------------------------------

COLUMNS = ["module", "computation", "is_entry", "is_root", "name", "opcode", "shape", "dtype",
           "dims", "elements", "bytes", "fusion_kind", "called", "operands", "source_op",
           "source_file", "source_line", "replica_groups", "attributes", "line"]


def instructions(source: HloLike | Sequence[HloLike]) -> pd.DataFrame:
    """One row per instruction of every computation (columns: see the module docstring).

    `source`: HLO text, a parsed :class:`HloModule`, or a list of them. ``df.attrs["modules"]``
    keeps each module's header attributes (``num_partitions``...).
    """
    rows = []
    headers = {}
    for mod in _modules(source):
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
                    "shape": _COMMENT.sub("", _strip_layouts(inst.shape)).replace("  ", " "),
                    "dtype": dtype, "dims": dims, "elements": elements, "bytes": nbytes,
                    "fusion_kind": inst.attributes.get("kind", "") if inst.opcode == "fusion"
                    else "",
                    "called": inst.called, "operands": list(inst.operands),
                    "source_op": meta.get("op_type", ""),
                    "source_file": meta.get("source_file", ""),
                    "source_line": int(line) if line and line.isdigit() else None,
                    "replica_groups": groups if _collective_kind(inst.opcode) else "",
                    "attributes": dict(inst.attributes), "line": inst.line,
                })
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["source_line"] = df["source_line"].astype("Int64")
    df.attrs["modules"] = headers
    return df


def _as_frame(source: Any) -> pd.DataFrame:
    return source if isinstance(source, pd.DataFrame) else instructions(source)


def op_counts(source: Any, scope: str = "all") -> dict[str, int]:
    """Instructions per opcode, most frequent first. `scope`: ``all`` computations (fused ones
    included: what the program does), or ``entry`` (top level: fusions, calls, copies...)."""
    df = _as_frame(source)
    if scope == "entry":
        df = df[df["is_entry"]]
    elif scope != "all":
        raise ValueError(f"scope must be 'all' or 'entry', got {scope!r}")
    return {k: int(v) for k, v in df["opcode"].value_counts().items()}


# -- collectives ----------------------------------------------------------------------------------

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                    "collective-permute", "collective-broadcast", "ragged-all-to-all")


def _collective_kind(opcode: str) -> str:
    """The collective kind of an opcode (``all-reduce-start`` -> ``all-reduce``), or ""."""
    base = opcode.removesuffix("-start").removesuffix("-done")
    return base if base in COLLECTIVE_KINDS else ""


def parse_replica_groups(text: str) -> list[list[int]]:
    """Expand a ``replica_groups=`` value into explicit groups.

    ``{{0,1,2,3},{4,5,6,7}}`` -> [[0,1,2,3],[4,5,6,7]]; the iota form ``[2,4]<=[8]`` ->
    the same; ``[4,2]<=[2,4]T(1,0)`` -> [[0,4],[1,5],[2,6],[3,7]]; ``{}`` -> [] (one group of
    every device). Also reads ``source_target_pairs={{0,1},{1,2}}``.
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
    if text.startswith("{"):
        groups = re.findall(r"\{([\d,\s]*)\}", text[1:-1] if text.endswith("}") else text)
        return [[int(x) for x in g.split(",") if x.strip()] for g in groups]
    raise HloParseError(f"cannot read replica groups {text!r}")


def collectives(source: Any) -> pd.DataFrame:
    """One row per collective: kind, name, opcode, bytes, dtype, shape, replica_groups (list of
    lists), group_size, num_groups, groups_text, computation, module, source_op.

    Async pairs count once (the ``-start``; ``-done`` rows are dropped). ``bytes`` is the size of
    the collective's result (for an async start's tuple, its largest element). An empty
    ``replica_groups`` means one group of every device: group_size is then the module's
    ``num_partitions * replica_count`` when known.
    """
    df = _as_frame(source)
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
                     "source_op": r.source_op})
    cols = ["kind", "name", "opcode", "bytes", "dtype", "shape", "replica_groups", "group_size",
            "num_groups", "groups_text", "computation", "module", "source_op"]
    return pd.DataFrame(rows, columns=cols)


# -- FLOPs ----------------------------------------------------------------------------------------


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
        mods = _modules(source)
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
            edges[r.computation] += _callees(r.opcode, r.attributes)
        counts = _propagate(entry.iloc[0] if len(entry) else comps[-1], edges)
        out.update({(module, c): counts.get(c, 0) for c in comps})
    return out


def _callees(opcode: str, attributes: dict[str, str]) -> list[tuple[str, int]]:
    """(computation, times per call) that an instruction runs as part of its own work: fused
    and called computations, while bodies (times = XLA's known_trip_count when the backend
    config has it, else 1), conditional branches (each counted once)."""
    trips = 1
    if opcode == "while":
        m = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)',
                      attributes.get("backend_config", ""))
        trips = int(m.group(1)) if m else 1
    out = []
    for key in _INLINE_CALLS.get(opcode, ()):
        times = trips if key == "body" else trips + 1 if key == "condition" and trips > 1 else 1
        out += [(name, times) for name in _names(attributes.get(key, ""))]
    return out


def _propagate(entry: str, edges: dict[str, list[tuple[str, int]]]) -> dict[str, int]:
    """Times each computation runs when `entry` runs once, over the call DAG `edges` (callee,
    times per run of the caller)."""
    order: list[str] = []  # reverse post-order: callers before callees
    seen: set[str] = set()
    stack: list[tuple[str, int]] = [(entry, 0)]
    while stack:
        comp, i = stack.pop()
        if i == 0:
            if comp in seen:
                continue
            seen.add(comp)
        callees = [c for c, _ in edges.get(comp, []) if c in edges]
        if i < len(callees):
            stack.append((comp, i + 1))
            if callees[i] not in seen:
                stack.append((callees[i], 0))
        else:
            order.append(comp)
    counts = dict.fromkeys(edges, 0)
    counts[entry] = 1
    for comp in reversed(order):
        for callee, times in edges.get(comp, []):
            if callee in counts:
                counts[callee] += counts[comp] * times
    return counts


# -- XLA's cost analysis (jaxlib) -----------------------------------------------------------------

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
        raise CostAnalysisError(f"jaxlib could not parse the HLO text: {_clip(str(exc), 400)}"
                                ) from None
    try:
        raw = dict(ext.hlo_module_cost_analysis(client, module))
    except Exception as exc:  # noqa: BLE001
        raise CostAnalysisError(f"XLA's cost analysis failed: {_clip(str(exc), 400)}") from None
    return {"flops": float(raw.get("flops", 0.0)),
            "transcendentals": float(raw.get("transcendentals", 0.0)),
            "bytes_accessed": float(raw.get("bytes accessed", 0.0)),
            "bytes_accessed_output": float(raw.get("bytes accessedout{}", math.nan)),
            "raw": raw}


# -- per-instruction cost (roofline points) -------------------------------------------------------

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
        for callee, n in _callees(ins.opcode, ins.attributes):
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
    if inst.opcode in _LITERAL_OPS:
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
    for mod in _modules(source):
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
                            f"XLA's cost analysis of {inst.name} failed: {_clip(str(exc), 300)}"
                        ) from None
            meta = inst.metadata
            line = meta.get("source_line")
            rows.append({
                "module": mod.name, "name": inst.name, "opcode": inst.opcode,
                "fusion_kind": inst.attributes.get("kind", "") if inst.opcode == "fusion"
                else "",
                "called": inst.called, "shape": _strip_layouts(inst.shape), "flops": flops,
                "bytes": nbytes, "transcendentals": trans,
                "intensity": flops / nbytes if nbytes else math.nan, "method": used,
                "flops_est": flops_est, "bytes_est": bytes_est,
                "source_op": meta.get("op_type", ""), "source_file": meta.get("source_file", ""),
                "source_line": int(line) if line and line.isdigit() else None})
    df = pd.DataFrame(rows, columns=PER_OP_COLUMNS)
    df["source_line"] = df["source_line"].astype("Int64")
    return df


per_fusion_cost = per_op_cost  # the name the issue uses


# -- summary and diff -----------------------------------------------------------------------------


def summary(source: Any, cost: bool = True) -> dict[str, Any]:
    """Key figures of one module (or several, summed): a JSON-ready dict.

    Keys: modules, num_modules, num_partitions, replica_count, computations, instructions,
    entry_instructions, ops_by_opcode (all computations), entry_ops_by_opcode, fusions_by_kind,
    collectives ({kind: {count, bytes, replica_groups}}), collective_count, collective_bytes,
    dot_flops (analytic, always), xla_flops / xla_bytes_accessed / xla_transcendentals (XLA's cost
    analysis; None when `cost` is False, jaxlib is missing or `source` is a DataFrame, with the
    reason in cost_error).
    """
    texts: list[str] = []
    if isinstance(source, pd.DataFrame):
        df = source
    else:
        mods = _modules(source)
        texts = [m.text for m in mods]
        df = instructions(mods)
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
    df_a, df_b = _as_frame(_modules(a) if not isinstance(a, pd.DataFrame) else a), \
        _as_frame(_modules(b) if not isinstance(b, pd.DataFrame) else b)
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


# -- files of a run -------------------------------------------------------------------------------

FILE_COLUMNS = ["module_id", "module", "stage", "backend", "pass_index", "file", "path", "bytes"]
_FILE = re.compile(r"^module_(\d+)\.(.+)\.txt$")
_STAGES = [  # (suffix regex on what follows the module name, stage)
    (re.compile(r"^(?:(\w+?)_)?after_optimizations-memory-usage-report$"), "memory-usage-report"),
    (re.compile(r"^(?:(\w+?)_)?after_optimizations-buffer-assignment$"), "buffer-assignment"),
    (re.compile(r"^(?:(\w+?)_)?after_optimizations$"), "after_optimizations"),
    (re.compile(r"^()before_optimizations$"), "before_optimizations"),
]
_PASS = re.compile(r"^(.+)\.(\d{4})\.([\w\-]+)\.after_([\w\-]+)\.before_([\w\-]+)$")


def classify_file(filename: str) -> dict[str, Any] | None:
    """module_id, module, stage, backend and pass_index of an XLA dump file name, or None.

    ``module_0001.step.1935.cpu_after_optimizations.txt`` -> stage ``after_optimizations``,
    backend ``cpu``; ``module_0000.m.61.0001.spmd-partitioner.after_spmd-partitioning.before_...``
    -> stage ``spmd-partitioning``; ``...after_sharding-propagation.before_spmd-partitioning``
    -> ``sharding-propagation``.
    """
    m = _FILE.match(filename)
    if not m:
        return None
    module_id, rest = int(m.group(1)), m.group(2)
    pm = _PASS.match(rest)
    if pm:
        return {"module_id": module_id, "module": pm.group(1), "stage": pm.group(4),
                "backend": "", "pass_index": int(pm.group(2))}
    for pattern, stage in _STAGES:
        name, _, suffix = rest.rpartition(".")
        sm = pattern.match(suffix)
        if sm and name:
            return {"module_id": module_id, "module": name, "stage": stage,
                    "backend": sm.group(1) or "", "pass_index": None}
    return None


def load_run_hlo(result_or_dir: Any) -> pd.DataFrame:
    """The HLO files of a run: a :class:`~tpu_workbench.runner.RunResult` (or its ``out_dir``,
    or a folder of XLA dump files). One row per file, ordered by module and stage.

    Columns: module_id (XLA's compile order), module (the HloModule name), stage
    (``before_optimizations``, ``after_optimizations``, ``memory-usage-report``,
    ``buffer-assignment``, ``sharding-propagation``, ``spmd-partitioning``), backend (``cpu``,
    ``tpu``... for after-optimisation files), pass_index, file, path, bytes.
    """
    folder = getattr(result_or_dir, "out_dir", result_or_dir)
    if folder is None:
        raise SpecError("this run has no output folder (it saved no results)")
    folder = Path(folder)
    if (folder / "hlo").is_dir():
        folder = folder / "hlo"
    if not folder.is_dir():
        raise SpecError(f"no HLO folder at {str(folder)!r}; run with capture=('hlo',)")
    rows = []
    for path in sorted(folder.iterdir()):
        info = classify_file(path.name)
        if info is None or not path.is_file():
            continue
        rows.append({**info, "file": path.name, "path": str(path),
                     "bytes": path.stat().st_size})
    order = {s: i for i, s in enumerate(["before_optimizations", "sharding-propagation",
                                         "spmd-partitioning", "after_optimizations",
                                         "memory-usage-report", "buffer-assignment"])}
    df = pd.DataFrame(rows, columns=FILE_COLUMNS)
    if len(df):
        df = df.assign(_o=df["stage"].map(order)).sort_values(
            ["module_id", "_o", "pass_index"]).drop(columns="_o").reset_index(drop=True)
    df["pass_index"] = df["pass_index"].astype("Int64")
    return df


def read_hlo(files: pd.DataFrame, stage: str = "after_optimizations") -> list[str]:
    """Texts of every module at `stage`, in compile order (`files` from :func:`load_run_hlo`)."""
    sub = files[files["stage"] == stage]
    return [Path(p).read_text() for p in sub["path"]]


def main_module(files: pd.DataFrame, stage: str = "after_optimizations") -> str:
    """Text of the biggest module at `stage`: the training step (the other modules of a run are
    small: moving data to the device, the optimizer's first state...)."""
    sub = files[files["stage"] == stage]
    if not len(sub):
        stages = sorted(set(files["stage"]))
        raise SpecError(f"no {stage!r} HLO among the run's files (stages: {stages})")
    return Path(sub.loc[sub["bytes"].idxmax(), "path"]).read_text()


_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
_ALLOC = re.compile(r"allocation (\d+): size ([\d.]+)(B|KiB|MiB|GiB|TiB)?,?\s*(.*?):?\s*$")


def memory_report(text: str) -> dict[str, Any]:
    """Parse an ``*after_optimizations-memory-usage-report.txt``.

    Returns ``total_bytes`` (``Total bytes used: N``) and ``allocations``: a DataFrame with
    allocation, size_bytes, kind (``parameter``, ``preallocated-temp``, ``constant``,
    ``output``, ``thread-local``, ``temp``), parameter (its number), shape, maybe_live_out,
    description.
    """
    m = re.search(r"Total bytes used:\s*(\d+)", text or "")
    if not m:
        raise HloParseError("not an XLA memory-usage report: no 'Total bytes used: N' line")
    rows = []
    for line in text.splitlines():
        am = _ALLOC.search(line)
        if not am:
            continue
        desc = am.group(4).strip()
        pm = re.search(r"parameter (\d+)", desc)
        sm = re.search(r"shape \|([^|]*)\|", desc)
        kind = ("parameter" if pm else "preallocated-temp" if "preallocated-temp" in desc
                else "constant" if "constant" in desc else "thread-local"
                if "thread-local" in desc else "output" if "output" in desc else "temp")
        rows.append({"allocation": int(am.group(1)),
                     "size_bytes": int(round(float(am.group(2)) * _UNITS[am.group(3) or "B"])),
                     "kind": kind, "parameter": int(pm.group(1)) if pm else None,
                     "shape": sm.group(1) if sm else "",
                     "maybe_live_out": "maybe-live-out" in desc, "description": desc})
    cols = ["allocation", "size_bytes", "kind", "parameter", "shape", "maybe_live_out",
            "description"]
    allocs = pd.DataFrame(rows, columns=cols)
    allocs["parameter"] = allocs["parameter"].astype("Int64")
    return {"total_bytes": int(m.group(1)), "allocations": allocs}


def search(source: HloLike | Sequence[HloLike], pattern: str, regex: bool = True,
           case: bool = False) -> pd.DataFrame:
    """Instruction lines matching `pattern` (a regex, or plain text if it is not a valid one):
    columns module, computation, line, name, opcode, text. An empty pattern matches all."""
    flags = 0 if case else re.IGNORECASE
    try:
        rx = re.compile(pattern if regex else re.escape(pattern), flags)
    except re.error:
        rx = re.compile(re.escape(pattern), flags)
    rows = []
    for mod in _modules(source):
        for comp in mod.computations:
            for inst in comp.instructions:
                if rx.search(inst.text):
                    rows.append({"module": mod.name, "computation": comp.name,
                                 "line": inst.line, "name": inst.name, "opcode": inst.opcode,
                                 "text": inst.text.strip()})
    return pd.DataFrame(rows, columns=["module", "computation", "line", "name", "opcode", "text"])


# -- the `tpu-workbench hlo` command --------------------------------------------------------------


def parse_mesh(text: str | None) -> tuple[int, ...] | None:
    """``"2x4"`` or a named mesh (``v6e-8``) -> (2, 4); None or "" -> None; SpecError otherwise."""
    if text is None or not str(text).strip():
        return None
    from .sharding import parse_mesh as sharding_parse_mesh

    return sharding_parse_mesh(str(text))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``tpu-workbench hlo``."""
    parser.add_argument("--model", default="mingpt", help="model family (default: mingpt)")
    parser.add_argument("--preset", default="tiny", help="size preset (default: tiny)")
    parser.add_argument("--mode", default="compile",
                        help="XLA execution mode: eager, lazy, compile (default) or dynamo")
    parser.add_argument("--mesh", default=None,
                        help="SPMD device mesh, e.g. 2x4 (needs --strategy); default: no mesh")
    parser.add_argument("--strategy", default=None, help="sharding strategy, e.g. dp, tp, fsdp")
    parser.add_argument("--steps", type=int, default=2, help="training steps (default: 2)")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True, help="output folder")


def spec_from_args(args: argparse.Namespace):
    """The validated ExperimentSpec of ``tpu-workbench hlo`` (SpecError on bad input)."""
    from .spec import MODES, ExperimentSpec

    mesh = parse_mesh(getattr(args, "mesh", None))
    mode = MODES.get(args.mode)
    if mode is not None and mode.runtime != "xla":
        xla_modes = [m for m, v in MODES.items() if v.runtime == "xla"]
        raise SpecError(f"mode {args.mode!r} runs on plain PyTorch and compiles no HLO; use one "
                        f"of {', '.join(xla_modes)}")
    extra: dict[str, Any] = {}
    if mesh is not None:
        extra["num_devices"] = math.prod(mesh)
    spec = ExperimentSpec(model=args.model, preset=args.preset, mode=args.mode, steps=args.steps,
                          batch_size=getattr(args, "batch_size", None), mesh=mesh,
                          strategy=getattr(args, "strategy", None), capture=("hlo",), **extra)
    return spec.validate()


def write_run_hlo(files: pd.DataFrame, out: Path) -> dict[str, Any]:
    """Copy a run's HLO texts into ``out/hlo/``, write ``out/ops.csv`` (every instruction of the
    main module after optimisation) and ``out/summary.json``; return the summary."""
    (out / "hlo").mkdir(exist_ok=True)
    for path in files["path"]:
        shutil.copy2(path, out / "hlo" / Path(path).name)
    modules = []
    for module_id, group in files.groupby("module_id", sort=True):
        entry: dict[str, Any] = {"module_id": int(module_id), "module": group["module"].iloc[0],
                                 "files": list(group["file"])}
        for stage in ("before_optimizations", "after_optimizations"):
            sub = group[group["stage"] == stage]
            if len(sub):
                s = summary(Path(sub["path"].iloc[0]).read_text())
                entry[stage] = s
        mem = group[group["stage"] == "memory-usage-report"]
        if len(mem):
            entry["memory_total_bytes"] = memory_report(
                Path(mem["path"].iloc[0]).read_text())["total_bytes"]
        modules.append(entry)
    stage = "after_optimizations" if (files["stage"] == "after_optimizations").any() \
        else "before_optimizations"
    main_text = main_module(files, stage)
    main = parse_hlo(main_text)
    ops = instructions(main).drop(columns=["attributes"])
    tmp = out / "ops.csv.tmp"
    ops.to_csv(tmp, index=False)
    tmp.replace(out / "ops.csv")
    result = {"main_module": main.name, "main_stage": stage, "num_modules": len(modules),
              "modules": modules}
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(result, indent=2, default=str))
    tmp.replace(out / "summary.json")
    return result


def _fmt_flops(v: float | None) -> str:
    if v is None:
        return "n/a"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:,.3f} {unit}FLOP"
    return f"{v:,.0f} FLOP"


def run(args: argparse.Namespace) -> int:
    """``tpu-workbench hlo``: run a spec with HLO capture; write the HLO, ops.csv, summary.json."""
    from .paths import writable_folder
    from .runner import run as run_spec

    spec = spec_from_args(args)  # bad model/mode/mesh fail here, before any worker starts
    out = writable_folder(args.out)
    print(f"running {spec.model}/{spec.preset} mode={spec.mode} steps={spec.steps}"
          + (f" mesh={'x'.join(map(str, spec.mesh))} strategy={spec.strategy}" if spec.mesh
             else "") + " with HLO capture...", file=sys.stderr)
    result = run_spec(spec)
    files = load_run_hlo(result)
    if not len(files):
        raise SpecError(f"the run compiled no HLO that XLA dumped (folder {result.out_dir})")
    info = write_run_hlo(files, out)
    main = next(m for m in info["modules"] if m["module"] == info["main_module"])
    s = main.get(info["main_stage"], {})
    before = main.get("before_optimizations", {})
    print(f"{info['num_modules']} module(s) compiled; main: {info['main_module']} "
          f"({s.get('instructions', 0)} instructions, {s.get('num_partitions') or 1} "
          "partition(s))")
    top = [(op, n) for op, n in s.get("ops_by_opcode", {}).items()
           if op not in ("parameter", "constant")][:10]
    print("top ops (all computations, parameters and constants left out): "
          + ", ".join(f"{op} {n}" for op, n in top))
    if s.get("fusions_by_kind"):
        print("fusions: " + ", ".join(f"{k} {n}" for k, n in s["fusions_by_kind"].items()))
    per_device = " (per device)" if (s.get("num_partitions") or 1) > 1 else ""
    print(f"FLOPs: analytic dot/conv {_fmt_flops(s.get('dot_flops'))}{per_device}; XLA cost "
          f"analysis {_fmt_flops(before.get('xla_flops'))} before / "
          f"{_fmt_flops(s.get('xla_flops'))}{per_device} after optimisation"
          + (f" ({s['cost_error']})" if s.get("cost_error") else ""))
    if s.get("collectives"):
        for kind, c in s["collectives"].items():
            print(f"collectives: {kind} x{c['count']} ({c['bytes']:,} bytes), replica groups "
                  + "; ".join(json.dumps(g) for g in c["replica_groups"]))
    else:
        print("collectives: none")
    print(f"wrote {out / 'hlo'} ({len(files)} files), {out / 'ops.csv'}, "
          f"{out / 'summary.json'}")
    return 0
