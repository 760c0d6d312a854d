"""The fixes that need an edit of the user's file, made on a copy of its text (the user's file is
never written). :func:`edit_for` finds the finding's line again by its code text (nearest to
the line the run named, so an edit made above it, which shifts it, does not lose it) and makes
one mechanical edit, where the step computes the same thing afterwards, or says why it makes
none:

- ``host_read``: a read in a logging statement (``print(f"{loss.item()}")``, ``print(t)``,
  ``logger.info(...)``) runs after the step, in a step closure
  (``xm.add_step_closure(lambda: print(...))``, torch_xla imported on the line before, inside
  the function, so that only a worker imports it); a value read into a name (``v = x.item()``,
  ``.tolist()``, ``.cpu()``, ``.numpy()``, ``.to("cpu")``, ``float(x)``...) stays a tensor on
  the device (``v = x.detach()``): whether that helps depends on what reads ``v`` next, which
  the measured run of the copy shows;
- ``data_dependent``: a reduction over a boolean-mask index (``x[m].sum()``, ``.mean()``) in its
  masked form with a static shape: ``torch.where(m, x, 0).sum()`` (divided by ``(m).sum()``);
- ``fallback``: a median along a dimension, which XLA does not lower, as the lower middle of a
  sort, which it does: ``x.sort(dim=d).values.select(d, (x.shape[d] - 1) // 2)``;
- ``cpu_tensor``: a factory call copied to the device (``torch.arange(n).to(d)``) made there
  (``torch.arange(n, device=d)``); a plain tensor attribute (``self.scale = torch.ones(n)``,
  which ``model.to(device)`` leaves on the CPU) registered as a buffer, which it moves;
- ``float64``: ``torch.float64`` / ``torch.double`` as ``torch.float32``, ``.double()`` as
  ``.float()``;
- ``shapes``: the input made at the line padded up to the next power of two along the dimension
  that changes (``F.pad``), a line inserted after it: a few bucket sizes instead of one per
  batch. The padding is data the model now sees until the model masks it out (an attention
  mask, ``ignore_index``), which only its author can add: the run says whether the loss moved.

Anything else keeps its fix as advice (an edit only the author can judge), with the reason.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import textwrap
import tokenize
from dataclasses import dataclass

IMPORT = "import torch_xla.core.xla_model as xm  # tpu-workbench port: host reads after the step"
_LOGGED = re.compile(r"^(?P<indent>\s*)(?P<call>(?:print|logging\.\w+|logger\.\w+|log\.\w+)"
                     r"\(.*\))$")
_READ_METHODS = ("item", "tolist", "cpu", "numpy", "detach")
_MASKED = re.compile(r"(?P<x>[\w.]+)\[(?P<mask>[^\[\]]+)\]\.(?P<reduce>sum|mean)\(\)")
_MEDIAN = re.compile(r"(?P<x>[\w.]+)\.median\(dim=(?P<dim>-?\d+)\)\.values")
_FACTORY_TO = re.compile(r"(?P<call>torch\.\w+\((?P<args>[^()]*(?:\([^()]*\)[^()]*)*)\))"
                         r"\.to\((?P<device>[^()]+?)\)")
_ATTRIBUTE = re.compile(r"self\.(?P<name>\w+)")
_FLOAT64 = re.compile(r"torch\.(?:float64|double)\b")


@dataclass(frozen=True)
class Edit:
    """One finding's edit: line `line` of the text (whose code was `before`) becomes `after`."""

    kind: str
    line: int
    before: str
    after: list[str]
    what: str

    def apply(self, text: str) -> str:
        lines = text.splitlines(keepends=True)
        lines[self.line - 1:self.line] = [f"{new}\n" for new in self.after]
        return "".join(lines)


def locate(text: str, line: int, code: str) -> int | None:
    """The line of `text` (1-based) whose code is `code` (stripped), the nearest to `line`;
    None where no line holds it."""
    lines = text.splitlines()
    want = code.strip()
    found = [n for n, t in enumerate(lines, 1) if t.strip() == want]
    return min(found, key=lambda n: (abs(n - line), n)) if found else None


def edit_for(kind: str, text: str, line: int, code: str, *, dim: int | None = None
             ) -> tuple[Edit | None, str]:
    """The edit of `text` that fixes the `kind` finding at `line` (whose code is `code`), or
    None and why no edit is made. `dim`: the dimension a ``shapes`` finding's input changes
    along, counted from the end (-1: the last)."""
    at = locate(text, line, code)
    if at is None:
        return None, f"the line `{code}` is no longer in the file"
    made, why = _edit(kind, text, at, dim)
    if made is not None and kind != "shapes" and not _parses(made.after):
        return None, "no mechanical edit of this line (the rewrite would not parse)"
    return made, why


def _parses(lines: list[str]) -> bool:
    try:
        ast.parse(textwrap.dedent("\n".join(lines)))
    except SyntaxError:
        return False
    return True


def _edit(kind: str, text: str, at: int, dim: int | None) -> tuple[Edit | None, str]:
    body = text.splitlines()[at - 1]
    if kind == "host_read":
        return _host_read(body, at)
    if kind == "data_dependent":
        return _replaced(kind, at, body, _MASKED.sub(_masked, body),
                         "the masked form, a static shape", "a boolean-mask selection other "
                         "than a sum or mean of it: keep every element and mask instead "
                         "(torch.where), only you know what the selection feeds")
    if kind == "fallback":
        fixed = _MEDIAN.sub(lambda m: f"{m['x']}.sort(dim={m['dim']}).values.select("
                            f"{m['dim']}, ({m['x']}.shape[{m['dim']}] - 1) // 2)", body)
        return _replaced(kind, at, body, fixed, "the same value from ops XLA lowers",
                         "no mechanical rewrite of this op in ops XLA lowers")
    if kind == "cpu_tensor":
        if made := device_fix(body):
            return Edit(kind, at, body, [made], "made on the device"), ""
        return _buffer(text, body)
    if kind == "float64":
        fixed = _FLOAT64.sub("torch.float32", body).replace(".double()", ".float()")
        return _replaced(kind, at, body, fixed, "float32", "the float64 comes from elsewhere "
                         "(a NumPy array, a Python float list): make it float32 there")
    if kind == "shapes":
        return _pad(text, at, body, dim)
    return None, "no edit of one line fixes this: the fix above is advice"


def _replaced(kind: str, at: int, body: str, fixed: str, what: str, why_not: str
              ) -> tuple[Edit | None, str]:
    return (Edit(kind, at, body, [fixed], what), "") if fixed != body else (None, why_not)


def _masked(m: re.Match[str]) -> str:
    total = f"torch.where({m['mask']}, {m['x']}, 0).sum()"
    return total if m["reduce"] == "sum" else f"({total} / ({m['mask']}).sum())"


def split_comment(line: str) -> tuple[str, str]:
    """`line` without its trailing comment (right spaces stripped), and the comment ("" where
    there is none); a ``#`` inside a string is no comment."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.rstrip("\n") + "\n").readline))
    except (tokenize.TokenError, SyntaxError):
        return line.rstrip(), ""
    comment = next((t for t in tokens if t.type == tokenize.COMMENT), None)
    if comment is None:
        return line.rstrip(), ""
    return line[:comment.start[1]].rstrip(), comment.string


def _host_read(body: str, at: int) -> tuple[Edit | None, str]:
    code, comment = split_comment(body)
    comment = f"  {comment}" if comment else ""
    if m := _LOGGED.match(code):
        return Edit("host_read", at, body, [
            f"{m['indent']}{IMPORT}",
            f"{m['indent']}xm.add_step_closure(lambda: {m['call']}){comment}"],
            "logged after the step, in a step closure"), ""
    if kept := _kept(code):
        return Edit("host_read", at, body, [f"{kept}{comment}"], "kept on the device"), ""
    if re.match(r"\s*(?:if|elif|while|assert)\b", code):
        return None, ("the value drives the step's control flow: keep the decision on the "
                      "device (torch.where(cond, a, b)) or take it after the step")
    return None, ("the read is part of a larger expression: only you know where its value is "
                  "needed (keep it a tensor up to there)")


def _kept(code: str) -> str:
    """`code`, an assignment of a value read to the host (``v = x.item()``, ``.tolist()``,
    ``.cpu()``, ``.numpy()``, ``.to("cpu")``, ``float(x)``, ``int(x)``, ``bool(x)``), with the
    tensor kept instead (``v = x.detach()``); "" for any other line."""
    stripped = code.strip()
    try:
        statement = ast.parse(stripped).body[0]
    except (SyntaxError, IndexError):
        return ""
    if not isinstance(statement, ast.Assign | ast.AnnAssign) or statement.value is None:
        return ""
    value, read = statement.value, False
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
            and value.func.id in ("float", "int", "bool") and len(value.args) == 1 \
            and not value.keywords:
        value, read = value.args[0], True
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and (
            (value.func.attr in _READ_METHODS and not value.args and not value.keywords)
            or (value.func.attr == "to" and _to_cpu(value))):
        read = read or value.func.attr != "detach"
        value = value.func.value
    if not read:
        return ""
    inner = ast.get_source_segment(stripped, value) or ""
    if not isinstance(value, ast.Name | ast.Attribute | ast.Call | ast.Subscript):
        inner = f"({inner})"
    indent = code[:len(code) - len(code.lstrip())]
    return f"{indent}{stripped[:statement.value.col_offset]}{inner}.detach()"


def _to_cpu(call: ast.Call) -> bool:
    args = list(call.args) + [k.value for k in call.keywords if k.arg == "device"]
    return len(args) == 1 and isinstance(args[0], ast.Constant) and args[0].value == "cpu"


def device_fix(code: str) -> str:
    """The line with its factory call made on the device (``torch.f(...).to(d)`` ->
    ``torch.f(..., device=d)``), or "" where the change is not that mechanical."""
    match = _FACTORY_TO.search(code)
    if not match or "device=" in match["args"]:
        return ""
    args = match["args"].strip()
    made = f"{match['call'][:-1]}{', ' if args else ''}device={match['device'].strip()})"
    return code.replace(match.group(0), made)


def _buffer(text: str, body: str) -> tuple[Edit | None, str]:
    """A plain tensor attribute the line uses, registered as a (non-persistent) buffer where it
    is assigned (``self.x = torch.f(...)`` -> ``self.register_buffer("x", torch.f(...),
    persistent=False)``), so ``model.to(device)`` moves it."""
    for name in dict.fromkeys(m["name"] for m in _ATTRIBUTE.finditer(body)):
        made = re.compile(rf"^(?P<indent>\s*)self\.{name}\s*=\s*(?P<value>torch\.\w+\(.*\))"
                          r"\s*(?P<comment>#.*)?$")
        for n, line in enumerate(text.splitlines(), 1):
            if m := made.match(line):
                comment = f"  {m['comment']}" if m["comment"] else ""
                return Edit("cpu_tensor", n, line, [
                    f'{m["indent"]}self.register_buffer("{name}", {m["value"]}, '
                    f"persistent=False){comment}"],
                    f"self.{name} registered as a buffer"), ""
    return None, ("a tensor made without device=: make it on the device of the step's "
                  "tensors (device=x.device)")


def _pad(text: str, at: int, body: str, dim: int | None) -> tuple[Edit | None, str]:
    """A line after the statement at `at` (``name = ...``) padding ``name`` along `dim` up to
    the next power of two."""
    why = ("pad the input to a few bucket sizes where it is made, and mask the padding out of "
           "the loss")
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None, why
    node = next((n for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and n.lineno == at and len(n.targets) == 1
                 and isinstance(n.targets[0], ast.Name)), None)
    if node is None or dim is None or dim >= 0 or not re.search(r"^\s*import torch\b", text,
                                                                  re.M):
        return None, why
    name, end = node.targets[0].id, node.end_lineno or at
    size = f"{name}.shape[{dim}]"
    # F.pad's pairs start at the last dim: one (0, 0) per dim after `dim` (counted from the end)
    trailing = "(0, 0) * " + str(-dim - 1) + " + " if dim < -1 else ""
    indent = body[:len(body) - len(body.lstrip())]
    pad = (f"{indent}{name} = torch.nn.functional.pad({name}, {trailing}(0, (1 << ({size} - 1)"
           f".bit_length()) - {size}))  # tpu-workbench port: pad to a power of two")
    lines = text.splitlines()
    return Edit("shapes", end, lines[end - 1], [lines[end - 1], pad],
                f"{name} padded along dim {dim} to a power of two"), ""


def line_map(old: str, new: str) -> dict[int, list[int]]:
    """Each line of `old` (1-based) -> its lines in `new`: an unchanged line where it moved to,
    an edited line to the lines that replaced it."""
    out: dict[int, list[int]] = {}
    matcher = difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        made = list(range(j1 + 1, j2 + 1))
        for k in range(i2 - i1):
            if tag == "equal":
                out[i1 + k + 1] = [j1 + k + 1]
            else:  # the last old line of the block takes what is left of the new ones
                out[i1 + k + 1] = (made[k:k + 1] if k < i2 - i1 - 1 else made[k:]) or [j2]
    return out


def diff(old: str, new: str, name: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True), f"a/{name}", f"b/{name}"))
