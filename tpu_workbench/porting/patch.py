"""The fixes that need an edit of the user's file, made on a copy of it.

``port`` runs the copy (``patched/<file>`` beside the report, with ``patched/<file>.diff``) and
fills ``verified`` from that run; the user's file is never written. Only mechanical edits of one
line are made, where the result stays the same:

- a host read in a logging statement (``print(f"{loss.item()}")``) runs after the step, in a
  step closure (``xm.add_step_closure(lambda: print(...))``, torch_xla imported on the line
  before, inside the function, so that only a worker imports it): the value is read once the
  step's program has run, instead of cutting the graph in two to read it;
- ``v = x.item()`` keeps a tensor: ``v = x.detach()``;
- a reduction over a boolean-mask index (``x[m].sum()``, ``x[m].mean()``) becomes its masked
  form with a static shape: ``torch.where(m, x, 0).sum()``, divided by ``(m).sum()`` for a mean;
- a median along a dimension, which XLA does not lower (``x.median(dim=d).values``), becomes the
  lower middle of a sort, which it does: ``x.sort(dim=d).values.select(d, (x.shape[d] - 1) // 2)``.

Anything else keeps its fix as advice (an edit only the author can judge).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EDITABLE = ("host_read", "data_dependent", "fallback")
IMPORT = "import torch_xla.core.xla_model as xm  # tpu-workbench port: host reads after the step"
_LOGGED = re.compile(r"^(?P<indent>\s*)(?P<call>(?:print|logging\.\w+|logger\.\w+|log\.\w+)"
                     r"\(.*\))\s*(?P<comment>#.*)?$")
_ITEM = re.compile(r"^(?P<indent>\s*)(?P<target>[\w.]+\s*=\s*)(?P<value>[\w.]+)\.item\(\)"
                   r"\s*(?P<comment>#.*)?$")
_MASKED = re.compile(r"(?P<x>[\w.]+)\[(?P<mask>[^\[\]]+)\]\.(?P<reduce>sum|mean)\(\)")
_MEDIAN = re.compile(r"(?P<x>[\w.]+)\.median\(dim=(?P<dim>-?\d+)\)\.values")


@dataclass
class Patched:
    """A patched copy's text, its diff against the original, and where each line went."""

    text: str
    diff: str
    edited: dict[int, str]  # original line -> kind of the finding it fixes
    inserted: list[int]  # original lines with an import added before them

    def line(self, original: int) -> int:
        """Where `original` line is in the copy."""
        return original + sum(1 for n in self.inserted if n <= original)


def edit(kind: str, code: str) -> str | None:
    """`code` (one line, its indentation kept) with the fix for `kind`, or None if the fix is
    not mechanical there."""
    body = code.rstrip("\n")
    if kind == "host_read":
        if m := _LOGGED.match(body):
            comment = f"  {m['comment']}" if m["comment"] else ""
            return (f"{m['indent']}{IMPORT}\n"
                    f"{m['indent']}xm.add_step_closure(lambda: {m['call']}){comment}")
        if m := _ITEM.match(body):
            comment = f"  {m['comment']}" if m["comment"] else ""
            return f"{m['indent']}{m['target']}{m['value']}.detach(){comment}"
        return None
    if kind == "data_dependent":
        def masked(m: re.Match[str]) -> str:
            total = f"torch.where({m['mask']}, {m['x']}, 0).sum()"
            return total if m["reduce"] == "sum" else f"({total} / ({m['mask']}).sum())"

        fixed = _MASKED.sub(masked, body)
        return fixed if fixed != body else None
    if kind == "fallback":
        fixed = _MEDIAN.sub(lambda m: f"{m['x']}.sort(dim={m['dim']}).values.select("
                            f"{m['dim']}, ({m['x']}.shape[{m['dim']}] - 1) // 2)", body)
        return fixed if fixed != body else None
    return None


def patch(file: str | Path, frame: Any) -> Patched | None:
    """`file` with every mechanical edit the findings in `frame` (rows of :data:`EDITABLE`
    kinds at lines of this file) call for, or None if there is none."""
    path = Path(file)
    lines = path.read_text().splitlines(keepends=True)
    edited: dict[int, str] = {}
    for row in frame.itertuples():
        if row.kind not in EDITABLE or not row.file or Path(row.file).resolve() != path.resolve():
            continue
        line = int(row.line)
        if not 0 < line <= len(lines) or line in edited:
            continue
        new = edit(row.kind, lines[line - 1])
        if new is not None:
            lines[line - 1] = new + "\n"
            edited[line] = row.kind
    if not edited:
        return None
    text = "".join(lines)
    diff = "".join(difflib.unified_diff(path.read_text().splitlines(keepends=True),
                                        text.splitlines(keepends=True),
                                        f"a/{path.name}", f"b/{path.name}"))
    inserted = sorted(n for n in edited if IMPORT in lines[n - 1])
    return Patched(text, diff, edited, inserted)
