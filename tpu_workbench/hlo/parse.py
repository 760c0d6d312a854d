"""HLO text to a small module model: modules, computations, instructions, shapes (no XLA
needed; the parser the rest of :mod:`tpu_workbench.hlo` builds on)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import WorkbenchError


class HloParseError(WorkbenchError, ValueError):
    """The text is not HLO (or not HLO this parser understands)."""


class CostAnalysisError(WorkbenchError, RuntimeError):
    """XLA's cost analysis could not run (jaxlib missing, or it rejected the text)."""


DTYPE_BITS = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16,
    "s32": 32, "u32": 32, "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64,
    "c64": 64, "c128": 128, "token": 0, "opaque": 0,
}


_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")


COMMENT = re.compile(r"/\*.*?\*/")


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
    for dtype, dims_text in _ARRAY.findall(COMMENT.sub("", strip_layouts(shape))):
        dims = []
        for d in dims_text.split(","):
            d = d.strip().lstrip("<=").strip()
            if d:
                dims.append(int(d) if d.isdigit() else 0)
        leaves.append((dtype, tuple(dims)))
    return leaves


def strip_layouts(shape: str) -> str:
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


CALL_ATTRS = ("calls", "to_apply", "body", "condition", "branch_computations",
              "true_computation", "false_computation", "called_computations")


# Attributes whose computations run as part of the instruction's own work (not a per-element
# scalar reducer like reduce's to_apply): costs inside them belong to the caller.
INLINE_CALLS = {"fusion": ("calls",), "call": ("to_apply",), "async-start": ("calls",),
                 "while": ("body", "condition"), "custom-call": ("called_computations",),
                 "conditional": ("branch_computations", "true_computation",
                                 "false_computation")}


LITERAL_OPS = {"constant", "parameter"}


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
                trips = self.trip_count(inst) if inst.opcode == "while" else None
                edges[comp.name] += callees(inst.opcode, inst.attributes, trips)
        return propagate(self.entry.name, edges)

    def trip_count(self, inst: HloInstruction) -> int:
        """How often a while loop's body runs: XLA's ``known_trip_count``, else read from the
        loop when its condition is ``counter < N`` and its body adds a constant step to the
        counter (the loops the TPU compiler writes, such as its windowed matmuls, which count
        from 0 by 2: a chunk from each side per step), else 1."""
        m = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)',
                      inst.attributes.get("backend_config", ""))
        if m:
            return int(m.group(1))
        comps = {c.name: c for c in self.computations}
        cond = comps.get(next(iter(names(inst.attributes.get("condition", ""))), ""))
        body = comps.get(next(iter(names(inst.attributes.get("body", ""))), ""))
        if cond is None or body is None:
            return 1
        root = _root(cond)
        if root is None or root.opcode != "compare" or len(root.operands) != 2 \
                or root.attributes.get("direction") != "LT":
            return 1
        counter, bound = (_find(cond, n) for n in root.operands)
        if counter is None or counter.opcode != "get-tuple-element" \
                or _constant(bound) is None:
            return 1
        out = _root(body)
        index = int(counter.attributes.get("index", -1))
        if out is None or out.opcode != "tuple" or not 0 <= index < len(out.operands):
            return 1
        update = _find(body, out.operands[index])
        step = None
        if update is not None and update.opcode == "add":
            step = next((_constant(_find(body, n)) for n in update.operands
                         if _constant(_find(body, n)) is not None), None)
        return -(-_constant(bound) // step) if step else 1


def _root(comp: HloComputation) -> HloInstruction | None:
    return next((i for i in comp.instructions if i.is_root), None)


def _find(comp: HloComputation, name: str) -> HloInstruction | None:
    return next((i for i in comp.instructions if i.name == name), None)


def _constant(inst: HloInstruction | None) -> int | None:
    """The value of an integer scalar constant, else None."""
    if inst is None or inst.opcode != "constant":
        return None
    found = re.search(r"constant\((-?\d+)\)", inst.text)
    return int(found.group(1)) if found else None


def names(value: str) -> list[str]:
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
    if opcode in LITERAL_OPS:
        literal = operand_text
    else:
        for piece in _split_top(operand_text):
            piece = COMMENT.sub("", piece).strip()
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
    # One pass over the text, line by line; its state (module, computation) stays in one place.
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
                    f"line {lineno} is not an HLO instruction ({exc}): {clip(stripped)}"
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
                            f"computation '%name (...) -> ... {{'): {clip(stripped)}")
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


def clip(s: str, n: int = 120) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


HloLike = str | HloModule


def as_modules(source: HloLike | Sequence[HloLike]) -> list[HloModule]:
    if isinstance(source, HloModule):
        return [source]
    if isinstance(source, str):
        return parse_modules(source)
    if isinstance(source, Path):
        return parse_modules(source.read_text())
    out: list[HloModule] = []
    for item in source:
        out += as_modules(item)
    return out


def callees(opcode: str, attributes: dict[str, str],
            trips: int | None = None) -> list[tuple[str, int]]:
    """(computation, times per call) that an instruction runs as part of its own work: fused
    and called computations, while bodies (times = `trips`, else XLA's known_trip_count when
    the backend config has it, else 1), conditional branches (each counted once)."""
    if trips is None:
        trips = 1
    if opcode == "while" and trips == 1:
        m = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)',
                      attributes.get("backend_config", ""))
        trips = int(m.group(1)) if m else 1
    out = []
    for key in INLINE_CALLS.get(opcode, ()):
        times = trips if key == "body" else trips + 1 if key == "condition" and trips > 1 else 1
        out += [(name, times) for name in names(attributes.get(key, ""))]
    return out


def propagate(entry: str, edges: dict[str, list[tuple[str, int]]]) -> dict[str, int]:
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
