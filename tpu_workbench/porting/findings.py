"""From a ``port`` run's records (:mod:`tpu_workbench.worker.port`) to its findings: one row per
TPU blocker, at the user's line, with its evidence, the fix and, where the workbench could try
the fix without editing the file, what the fix changed.

Columns of :func:`findings` (:data:`COLUMNS`):

``kind``       :data:`KINDS` (host_read, shapes, data_dependent, cpu_tensor, float64, fallback,
               graph_break, dynamo_crash, crash)
``where``      ``file.py:LINE`` (the file relative to the current directory where it is under it)
``code``       the line as written
``evidence``   the counters that show it (calls per step, compiles, transfers, sizes seen)
``fix``        the change, as a short diff against the line where it is mechanical
``verified``   ``before -> after`` of the fix the workbench ran (each on top of the fixes
               before it: shapes, then device, then float64; then the edits of a patched
               copy, :mod:`.patch`); empty where the fix was not tried
``cost_s``     step time the fix saved (median of the steps after the first, seconds); NaN
               where not measured

Nothing is reported that the run did not see: a clean model gives an empty frame.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from .patch import edit

KINDS = {
    "host_read": "a device-to-host read in the step: it waits for the device and cuts the graph",
    "shapes": "an input whose size changes between batches: one XLA compilation per new size",
    "data_dependent": "a result whose shape depends on the data: a compilation per new shape "
                      "and a CPU fallback",
    "cpu_tensor": "a CPU tensor used in the step: copied to the device every step, and Dynamo "
                  "stops on it",
    "float64": "float64 math: TPUs have no float64 unit (XLA emulates it, many times slower)",
    "fallback": "an op XLA does not lower: it runs on the CPU, its inputs copied there and back",
    "graph_break": "Dynamo splits the step into several graphs here",
    "dynamo_crash": "torch.compile fails here",
    "crash": "the step fails on XLA here",
}
COLUMNS = ["kind", "where", "code", "evidence", "fix", "verified", "cost_s", "file", "line"]
# ops a finding of another kind already explains (their fallbacks are that finding's evidence)
EXPLAINED = {"_local_scalar_dense": "host_read", "nonzero": "data_dependent",
             "masked_select": "data_dependent", "unique": "data_dependent",
             "_unique2": "data_dependent", "index": "data_dependent"}
# the same result from ops XLA lowers, for fallbacks seen on torch_xla 2.9
LOWERED_FORMS = {
    "median": "the lower middle of a sort: x.sort(dim).values.select(dim, (n - 1) // 2)",
    "searchsorted": "a comparison count: (x[..., None] > sorted_row).sum(-1)",
    "histc": "a one-hot count of the bucket indices: F.one_hot(idx, bins).sum(0)",
    "mode": "a one-hot count (F.one_hot(x, k).sum(dim)) and its argmax",
}
_FACTORY_TO = re.compile(r"(?P<call>torch\.\w+\((?P<args>[^()]*(?:\([^()]*\)[^()]*)*)\))"
                         r"\.to\((?P<device>[^()]+?)\)")


def steps_frame(records: list[dict[str, Any]]) -> Any:
    """One row per timed step of every variant (``port_step`` records)."""
    import pandas as pd

    rows = [{k: v for k, v in r.items() if k not in ("kind", "fallback_ops", "shapes")}
            for r in records if r.get("kind") == "port_step"]
    return pd.DataFrame(rows, columns=["variant", "step", "step_s", "loss", "compiles",
                                       "executions", "to_device", "from_device", "fallbacks"])


def _short(file: str) -> str:
    try:
        return os.path.relpath(file) if Path(file).resolve().is_relative_to(Path.cwd()) else file
    except ValueError:
        return file


def _steady(steps: Any, variant: str, column: str) -> float:
    """Median of `column` over `variant`'s steps after the first (the first compiles)."""
    rows = steps[steps["variant"] == variant]
    values = rows[rows["step"] > 0][column] if len(rows) > 1 else rows[column]
    return float(values.median()) if len(values) else math.nan


def _after_first(steps: Any, variant: str, column: str) -> int:
    rows = steps[steps["variant"] == variant]
    return int(rows[rows["step"] > 0][column].sum())


def _device_fix(code: str) -> str:
    """The line with its factory call made on the device (``torch.f(...).to(d)`` ->
    ``torch.f(..., device=d)``), or "" where the change is not that mechanical."""
    match = _FACTORY_TO.search(code)
    if not match or "device=" in match["args"]:
        return ""
    args = match["args"].strip()
    made = f"{match['call'][:-1]}{', ' if args else ''}device={match['device'].strip()})"
    return code.replace(match.group(0), made)


def _diff(before: str, after: str) -> str:
    return f"- {before}\n" + "\n".join(f"+ {line.strip()}" for line in after.splitlines())


def _row(kind: str, event: dict[str, Any], evidence: str, fix: str, verified: str = "",
         cost_s: float = math.nan) -> dict[str, Any]:
    file, line = event.get("file", ""), int(event.get("line") or 0)
    return {"kind": kind, "where": f"{_short(file)}:{line}" if file else "", "code":
            event.get("code", ""), "evidence": evidence, "fix": fix, "verified": verified,
            "cost_s": cost_s, "file": file, "line": line}


def findings(records: list[dict[str, Any]], summary: dict[str, Any]) -> Any:
    """The blockers a ``port`` run found, costliest first (see the module for the columns)."""
    import pandas as pd

    steps = steps_frame(records)
    events = [r for r in records if r.get("kind") == "port_event"]
    written = [e for e in events if e.get("variant", "as written") == "as written"]
    fixed = {v: {(e["event"], e["file"], e["line"]): e["calls_per_step"] for e in events
                 if e.get("variant") == v} for v in ("on device", "float32")}
    compiles = _after_first(steps, "as written", "compiles")
    n_after = max(int((steps["variant"] == "as written").sum()) - 1, 1)

    variants = list(summary.get("variants") or dict.fromkeys(steps["variant"]))

    def before(variant: str) -> str:
        """The pass a fix is measured against: the one before it (fixes add up)."""
        return variants[max(variants.index(variant) - 1, 0)]

    def timing(variant: str) -> tuple[str, float]:
        base, prior = _steady(steps, before(variant), "step_s"), before(variant)
        after_s = _steady(steps, variant, "step_s")
        on_top = "" if prior == "as written" else f" (on top of: {prior})"
        return f"median step {base:.4f} -> {after_s:.4f} s{on_top}", base - after_s

    rows = []
    for e in written:
        calls = e["calls_per_step"]
        if e["event"] == "crash":
            rows.append(_row("crash", e, e.get("reason", e["op"]),
                             "the step must run on XLA before anything can be measured: fix "
                             "this line first"))
        elif e["event"] == "host_read":
            reads = _steady(steps, "as written", "from_device")
            rows.append(_row("host_read", e,
                             f"{calls:g} _local_scalar_dense per step; {reads:g} device-to-host "
                             "transfers per step",
                             _diff(e["code"], edit("host_read", e["code"]) or "keep it a "
                                   "tensor: log it every N steps, after the step "
                                   "(torch_xla.sync()), or in xm.add_step_closure")))
        elif e["event"] == "data_dependent":
            rows.append(_row("data_dependent", e,
                             f"{e['op']} {calls:g} per step; {compiles} compilations in the "
                             f"{n_after} steps after the first",
                             _diff(e["code"], edit("data_dependent", e["code"]) or "the "
                                   "masked form, same result, static shape: torch.where(mask, "
                                   "x, 0), and (x * mask).sum() / mask.sum() for a mean over "
                                   "the mask")))
        elif e["event"] == "cpu_tensor":
            after = fixed["on device"].get(("cpu_tensor", e["file"], e["line"]), 0.0)
            made = _device_fix(e["code"])
            fix = (_diff(e["code"], made) if made else
                   _diff(e["code"], "make it on the device (device=x.device), or register a "
                         "tensor attribute as a buffer (self.register_buffer) so .to(device) "
                         "moves it"))
            verified, cost = "", math.nan
            if "on device" in set(steps["variant"]) and not after:
                saved, cost = timing("on device")
                verified = (f"CPU copies at this line {calls:g} -> 0 per step; host-to-device "
                            f"transfers {_steady(steps, before('on device'), 'to_device'):g} -> "
                            f"{_steady(steps, 'on device', 'to_device'):g} per step; {saved}")
            rows.append(_row("cpu_tensor", e, f"{e['op']} with a CPU tensor {calls:g} per step",
                             fix, verified, cost))
        elif e["event"] == "float64":
            after = fixed["float32"].get(("float64", e["file"], e["line"]), 0.0)
            verified, cost = "", math.nan
            if "float32" in set(steps["variant"]) and not after:
                saved, cost = timing("float32")
                loss = (_steady(steps, before("float32"), "loss"),
                        _steady(steps, "float32", "loss"))
                verified = (f"float64 results at this line {calls:g} -> 0 per step; {saved}; "
                            f"loss {loss[0]:.4f} -> {loss[1]:.4f}")
            rows.append(_row("float64", e, f"{e['op']} makes float64 {calls:g} per step",
                             _diff(e["code"], e["code"].replace("torch.float64", "torch.float32")
                                   if "torch.float64" in e["code"] else
                                   "dtype=torch.float32 (or .float())"), verified, cost))
    rank = next(({k: len(v) for k, v in r["shapes"].items()} for r in records
                 if r.get("kind") == "port_step"), {})
    for key, dims in (summary.get("varying") or {}).items():
        made = (summary.get("made_at") or {}).get(key) or {}
        for dim, sizes in dims.items():
            buckets = summary["buckets"][key][dim]
            after = _after_first(steps, "pad to buckets", "compiles")
            saved, cost = timing("pad to buckets")
            rows.append(_row(
                "shapes", made,
                f"input {key!r} dim {dim} took {len(sizes)} sizes in {summary['steps']} batches "
                f"({min(sizes)}..{max(sizes)}); {compiles} compilations in the {n_after} steps "
                "after the first",
                _pad_fix(key, int(dim), buckets, rank.get(key, 0)),
                f"compilations after the first step {compiles} -> {after}; {saved}", cost))
    seen_ops: dict[str, int] = {}
    for r in records:
        if r.get("kind") == "port_step" and r["variant"] == "as written" and r["step"] > 0:
            for op, n in r["fallback_ops"].items():
                seen_ops[op] = seen_ops.get(op, 0) + n
    for op, n in sorted(seen_ops.items()):
        name = op.split(".")[0]  # the counter's overload: aten::median.dim_values
        if name in EXPLAINED:
            continue
        lines = {w: c for w, c in ((summary.get("op_lines") or {}).get(name) or {}).items()
                 if not w.startswith(":")}  # ":0": no line of the model's (the backward)
        file, line = (next(iter(lines)).rsplit(":", 1) if lines else ("", "0"))
        event = {"file": file, "line": int(line), "code": _code(file, int(line))
                 or "(no line of the model's: run by the autograd engine, in the backward)"}
        made = edit("fallback", event["code"]) if lines else None
        rows.append(_row("fallback", event,
                         f"aten::{op} ran on the CPU {n / n_after:g} times per step",
                         _diff(event["code"], made) if made else
                         "an op XLA has no lowering for: replace it with ops XLA lowers"
                         + (f" ({LOWERED_FORMS[name]})" if name in LOWERED_FORMS else "")
                         + ", or move it out of the step"))
    for r in records:
        if r.get("kind") == "port_dynamo":
            kind = "graph_break" if r["event"] == "graph_break" else "dynamo_crash"
            rows.append(_row(kind, r, r["reason"], _dynamo_fix(r["reason"], r.get("code", ""))))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    if len(frame):
        frame = frame.sort_values(["cost_s", "kind"], ascending=[False, True],
                                  na_position="last", kind="stable").reset_index(drop=True)
    return frame


def verify_edits(frame: Any, records: list[dict[str, Any]], edited: list[dict[str, Any]],
                 patched: Any, copy: str) -> Any:
    """`frame` with ``verified`` and ``cost_s`` of the rows a patched copy
    (:class:`.patch.Patched`, run as variant ``"edited"``: `edited` are its records, `copy` its
    name in the text) fixed, measured against the last pass of the original (`records`)."""
    steps, after = steps_frame(records), steps_frame(edited)
    last = str(steps["variant"].iloc[-1]) if len(steps) else "as written"
    crash = next((e for e in edited if e.get("kind") == "port_event"
                  and e.get("event") == "crash"), None)
    calls: dict[tuple[str, int], float] = {}
    for e in edited:
        if e.get("kind") == "port_event" and e.get("variant") == "edited":
            calls[e["event"], int(e["line"])] = calls.get((e["event"], int(e["line"])), 0.0) \
                + e["calls_per_step"]
    before: dict[tuple[str, str, int], float] = {}
    for e in records:
        if e.get("kind") == "port_event" and e.get("variant") == "as written":
            key = (e["event"], e["file"], int(e["line"]))
            before[key] = before.get(key, 0.0) + e["calls_per_step"]
    frame = frame.copy()
    together = f" (the copy's {len(patched.edited)} edits together)" if len(patched.edited) > 1 \
        else ""
    for i, row in frame.iterrows():
        if patched.edited.get(int(row["line"])) != row["kind"]:
            continue
        if crash is not None:
            at = f" at line {crash['line']}" if crash.get("line") else ""
            frame.at[i, "verified"] = (f"tried in {copy}: its step fails{at}: "
                                       f"{crash.get('reason', crash['op'])}")
            continue
        if row["kind"] == "fallback":  # counted by op (torch_xla's counters), not by line
            op = re.search(r"aten::(\w+)", row["evidence"])[1]  # type: ignore[index]
            n_before, n_after = _cpu_runs(records, last, op), _cpu_runs(edited, "edited", op)
            what = f"aten::{op} runs on the CPU"
        else:
            n_before = before.get((row["kind"], row["file"], int(row["line"])), 0.0)
            n_after = calls.get((row["kind"], patched.line(int(row["line"]))), 0.0)
            what = ("host reads" if row["kind"] == "host_read" else "data-dependent ops") + \
                " at this line"
        base_s, edit_s = _steady(steps, last, "step_s"), _steady(after, "edited", "step_s")
        parts = [f"{what} {n_before:g} -> {n_after:g} per step (in {copy})"]
        if row["kind"] == "host_read":
            parts.append(f"graph executions per step {_steady(steps, last, 'executions'):g} -> "
                         f"{_steady(after, 'edited', 'executions'):g}")
        elif row["kind"] == "data_dependent":
            parts.append("compilations after the first step "
                         f"{_after_first(steps, last, 'compiles')} -> "
                         f"{_after_first(after, 'edited', 'compiles')}")
        parts.append(f"median step {base_s:.4f} -> {edit_s:.4f} s (on top of: {last}){together}")
        parts.append(f"loss {_steady(steps, last, 'loss'):.4f} -> "
                     f"{_steady(after, 'edited', 'loss'):.4f}")
        frame.at[i, "verified"] = "; ".join(parts)
        if not n_after:
            frame.at[i, "cost_s"] = base_s - edit_s
    if len(frame):
        frame = frame.sort_values(["cost_s", "kind"], ascending=[False, True],
                                  na_position="last", kind="stable").reset_index(drop=True)
    return frame


def _cpu_runs(records: list[dict[str, Any]], variant: str, op: str) -> float:
    """CPU runs per step of aten::`op` (any overload) in `variant`'s steps after the first."""
    runs = [sum(n for name, n in r["fallback_ops"].items() if name.split(".")[0] == op)
            for r in records if r.get("kind") == "port_step" and r["variant"] == variant
            and r["step"] > 0]
    return sum(runs) / len(runs) if runs else 0.0


def _pad_fix(key: str, dim: int, buckets: list[int], rank: int) -> str:
    how = (f": + {key} = F.pad({key}, (0, bucket - {key}.shape[-1]))" if dim == rank - 1
           else "")
    return (f"pad {key!r} dim {dim} up to the buckets {buckets}, masking the padding out of "
            f"the loss{how}")


def _code(file: str, line: int) -> str:
    import linecache

    return linecache.getline(file, line).strip() if file else ""


def _dynamo_fix(reason: str, code: str) -> str:
    if "two different devices" in reason:
        return _diff(code, "every tensor of the step on the XLA device: register a tensor "
                     "attribute as a buffer, or make it with device=")
    if "item()" in reason or "capture_scalar_outputs" in reason:
        return _diff(code, "no host read inside the compiled function (or "
                     "torch._dynamo.config.capture_scalar_outputs = True)")
    if "Dynamic shape" in reason or "dynamic shape" in reason:
        return _diff(code, "the masked form with a static shape (torch.where, sums over the "
                     "mask)")
    return "Dynamo's reason above says what it cannot trace; move that out of the step"



def context(file: str, line: int, around: int = 4) -> str:
    """`file`'s lines around `line` as Markdown code, the line marked ``>>``."""
    import linecache

    if not file or line <= 0:
        return ""
    first = max(1, line - around)
    rows = [f"{'>>' if n == line else '  '} {n:4d}  {linecache.getline(file, n).rstrip()}"
            for n in range(first, line + around + 1) if linecache.getline(file, n)]
    return "```\n" + "\n".join(rows) + "\n```"
