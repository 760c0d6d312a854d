"""What a fix measurably did: the run of a patched copy (:mod:`.patch`, run by
:mod:`.report`) against the run before it, each figure from the two runs' own records
(:func:`.findings.figures`). A fix is **verified** only when the number it targets moved the
right way and the step got no slower (:data:`.findings.STATUSES`); otherwise the row says what
to try instead (:func:`instead_for`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from .findings import LOGGED, LOWERED_FORMS, figures

MIN_TIMED = 3  # timed steps on each side before a fix is called slower


@dataclass
class Variant:
    """One measured run: the model as written or a patched copy. `lines` maps each line of the
    original file to its lines in this variant's file (the identity for the original)."""

    name: str
    records: list[dict[str, Any]]
    file: str = ""
    lines: dict[int, list[int]] = field(default_factory=dict)

    def at(self, line: int) -> list[int]:
        return self.lines.get(line, [line])

    def failure(self) -> dict[str, Any] | None:
        return next((e for e in self.records if e.get("kind") == "port_event"
                     and e.get("event") == "crash"), None)


def judge(row: Any, before: Variant, after: Variant, fix: str) -> dict[str, Any]:
    """What the fix of `row` (a :func:`findings` row) did: `after` is `before` with that one
    edit (`fix`, in words). Returns ``status``, ``verified`` (the measured text), ``instead``
    and ``cost_s``; each figure from the runs' own records."""
    crash = after.failure()
    if crash is not None:
        at = f" at line {crash['line']}" if crash.get("line") else ""
        return {"status": "failed", "cost_s": math.nan,
                "verified": f"{fix}: the patched copy fails{at}: "
                            f"{crash.get('reason', crash.get('op', ''))}",
                "instead": instead_for(row, "it does not run")}
    b, a = figures(before.records, before.name), figures(after.records, after.name)
    kind, line = row["kind"], int(row["line"])
    counts = {"steady compilations": (b["compiles"], a["compiles"]),
              "executions per step": (b["executions"], a["executions"]),
              "device-to-host transfers per step": (b["from_device"], a["from_device"]),
              "host-to-device transfers per step": (b["to_device"], a["to_device"])}
    same = _same(b["losses"], a["losses"])
    if kind == "host_read":
        here = (_reads(before, before.at(line)), _reads(after, after.at(line)))
        target = (f"executions and transfers in the step at this line {here[0]:g} -> "
                  f"{here[1]:g} per step")
        moved = _moved(before, after, line)
        helped = here[1] == 0 and (a["executions"] < b["executions"]
                                   or a["from_device"] < b["from_device"])
        why = (f"the read moved to {moved}" if moved else
               "the step's executions and transfers did not drop")
    elif kind == "shapes":
        target = f"steady compilations {b['compiles']} -> {a['compiles']}"
        helped, why = a["compiles"] < b["compiles"], "the compilations did not drop"
    elif kind in ("data_dependent", "cpu_tensor", "float64"):
        n = (_calls(before, kind, before.at(line)), _calls(after, kind, after.at(line)))
        target = f"{kind.replace('_', '-')} ops at this line {n[0]:g} -> {n[1]:g} per step"
        helped = n[1] == 0 and n[0] > 0
        if kind == "cpu_tensor":
            helped = helped and a["to_device"] <= b["to_device"]
        why = "the line still does it"
    elif kind == "fallback":
        op = re.search(r"aten::(\w+)", row["evidence"])
        name = op[1] if op else ""
        n = (b["cpu_ops"].get(name, 0.0), a["cpu_ops"].get(name, 0.0))
        target = f"aten::{name} runs on the CPU {n[0]:g} -> {n[1]:g} per step"
        helped, why = n[1] == 0 and n[0] > 0, "the op still runs on the CPU"
    else:
        return {"status": "not tried", "verified": "", "instead": instead_for(row, ""),
                "cost_s": math.nan}
    # slower: every timed step after above every one before, with enough of them that noise
    # alone rarely does that (3 against 3: 1 in 20; the default 6 steps time 4: 1 in 70)
    slower = min(a["timed"], b["timed"]) >= MIN_TIMED and a["step_min"] > b["step_max"]
    cost = b["step_s"] - a["step_s"]
    status = "hurt" if helped and slower else "verified" if helped else "did not help"
    parts = [target] + [f"{name} {x:g} -> {y:g}" for name, (x, y) in counts.items()
                        if (x, y) != (0, 0) and not target.startswith(name)]
    parts.append(f"median step {b['step_s']:.4f} -> {a['step_s']:.4f} s (timed steps "
                 f"{b['step_min']:.4f}..{b['step_max']:.4f} -> {a['step_min']:.4f}.."
                 f"{a['step_max']:.4f})")
    parts.append(f"loss {_mean(b['losses']):.4f} -> {_mean(a['losses']):.4f}"
                 + ("" if same else " (the result changed" + (
                     ": the padding is data the model sees until it masks it out)"
                     if kind == "shapes" else ")")))
    on_top = "" if before.name == "as written" else f" (on top of: {before.name})"
    text = f"{fix}{on_top}: " + "; ".join(parts)
    instead = "" if status == "verified" else instead_for(
        row, why if status == "did not help" else "the step got slower")
    return {"status": status, "verified": text, "instead": instead,
            "cost_s": cost if math.isfinite(cost) else math.nan}


def judge_break(row: Any, after: Variant, fix: str) -> dict[str, Any]:
    """A Dynamo finding (`row`, seen as written) at a line another finding's fix edited: gone
    or still there in the copy's own Dynamo pass (`after`)."""
    lines = set(after.at(int(row["line"])))
    ran = any(r.get("kind") == "port_dynamo" and r["event"] == "ran" for r in after.records)
    left = sum(1 for r in after.records if r.get("kind") == "port_dynamo"
               and r["event"] != "ran" and int(r.get("line") or 0) in lines)
    gone = ran and not left and after.failure() is None
    return {"status": "verified" if gone else "did not help", "cost_s": math.nan,
            "verified": f"{fix}: Dynamo's findings at this line 1 -> "
                        f"{left if ran else 'not run'}",
            "instead": "" if gone else instead_for(row, "Dynamo still stops here")}


def instead_for(row: Any, why: str = "") -> str:
    """What to try for `row`'s finding, after `why` (the reason its fix was not kept)."""
    kind, code = row["kind"], str(row["code"])
    what = {
        "host_read": "read it after the step: return the tensor from the step and read it "
                     "after torch_xla.sync() (or in xm.add_step_closure), or log it every N "
                     "steps; keep a decision on the device with torch.where",
        "shapes": "pad where the batch is made to a few bucket sizes, with an attention mask "
                  "or ignore_index so the padding does not change the loss; or sort by length "
                  "into buckets",
        "data_dependent": "keep every element and mask: torch.where(mask, x, fill), sums over "
                          "the mask; nonzero_static / a fixed-size top-k where indices are "
                          "needed",
        "cpu_tensor": "make the tensor on the device (device=x.device) or register it as a "
                      "buffer",
        "float64": "make it float32 where it is created (a NumPy array: .astype(np.float32))",
        "fallback": "rewrite it in ops XLA lowers"
                    + (f" ({LOWERED_FORMS[m[1]]})" if (m := re.search(
                        r"aten::(\w+)", str(row["evidence"]))) and m[1] in LOWERED_FORMS
                       else "") + ", or move it out of the step",
        "graph_break": "move what Dynamo cannot trace out of the compiled function",
        "dynamo_crash": "move what Dynamo cannot trace out of the compiled function",
        "crash": "fix the error first",
    }.get(kind, "")
    if kind == "host_read" and LOGGED.search(code):
        what = "log every N steps (the value of the last step) instead of every step"
    return f"{why}: {what}" if why else what


def _reads(variant: Variant, lines: list[int]) -> float:
    """Executions plus transfers per step in the step at `lines` of `variant`'s file."""
    return sum(r["reads"] + r["from_device"] for r in variant.records
               if r.get("kind") == "port_line" and r["variant"] == variant.name
               and r["phase"] == "step" and int(r["line"]) in lines
               and (not variant.file or r["file"] == variant.file))


def _moved(before: Variant, after: Variant, line: int) -> str:
    """The lines of `after` that read in the step where `before`'s did not (other than `line`)."""
    def reading(variant: Variant) -> dict[int, str]:
        return {int(r["line"]): r["code"] for r in variant.records
                if r.get("kind") == "port_line" and r["variant"] == variant.name
                and r["phase"] == "step" and r["asks"] and (r["reads"] or r["from_device"])
                and (not variant.file or r["file"] == variant.file)}

    was = {n for old in reading(before) for n in _image(before, after, old)}
    was |= set(after.at(line))
    new = {n: code for n, code in reading(after).items() if n not in was}
    return ", ".join(f"line {n} (`{code}`)" for n, code in sorted(new.items()))


def _image(before: Variant, after: Variant, line: int) -> list[int]:
    """`before`'s `line` in `after`'s file (through the original file's numbering)."""
    originals = [o for o, now in before.lines.items() if line in now] or [line]
    return [n for o in originals for n in after.at(o)]


def _calls(variant: Variant, event: str, lines: list[int]) -> float:
    return sum(r["calls_per_step"] for r in variant.records
               if r.get("kind") == "port_event" and r.get("event") == event
               and r.get("variant") == variant.name and int(r["line"]) in lines
               and (not variant.file or r["file"] == variant.file))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-3, abs_tol=1e-5)
                                    for x, y in zip(a, b, strict=True))


def trials_brief(trials: Any) -> Any:
    """One row per fix tried: its name, status and each figure as ``before -> after``
    (compilations after the first step, executions and device-to-host transfers per step,
    the median timed step in ms)."""
    import pandas as pd

    def pair(row: Any, name: str, scale: float = 1.0, digits: int = 3) -> str:
        b, a = row[f"{name}_before"] * scale, row[f"{name}_after"] * scale
        return f"{b:.{digits}g} -> {a:.{digits}g}"

    return pd.DataFrame([{"fix": r["variant"], "status": r["status"],
                          "compilations": pair(r, "compiles"),
                          "executions / step": pair(r, "executions"),
                          "transfers / step": pair(r, "from_device"),
                          "step (ms)": pair(r, "step_s", 1e3, 4)}
                         for _, r in trials.iterrows()],
                        columns=["fix", "status", "compilations", "executions / step",
                                 "transfers / step", "step (ms)"])


