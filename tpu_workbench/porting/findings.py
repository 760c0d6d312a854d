"""From a ``port`` run's records (:mod:`tpu_workbench.worker.port`) to its findings, one row per
TPU blocker at the user's line with its evidence and fix (what trying the fix did is
:mod:`.verdict`'s, filled in by :mod:`.report`).

Columns of :func:`findings` (:data:`COLUMNS`):

``kind``       :data:`KINDS`
``where``      ``file.py:LINE`` (the file relative to the current directory where it is under it)
``code``       the line as written
``evidence``   what the run counted there: per step, its graph executions and transfers, calls,
               compilations, sizes seen
``fix``        how to move it out of the step, then the edit as a diff where one is mechanical
``status``     what trying the fix on a patched copy of the file did (:data:`STATUSES`)
``verified``   the measured before -> after of that try: steady compilations, executions and
               transfers per step, step time, loss; empty where it was not tried
``instead``    what to try where the fix did not help, hurt, failed or was not tried
``cost_s``     step time the fix saved (before - after, median of the timed steps, seconds):
               negative where it cost time, NaN where not measured
``file``, ``line``  the finding's file and line

Nothing is reported that the run did not see: a clean model gives an empty frame.
"""

from __future__ import annotations

import math
import os
import re
import statistics
from pathlib import Path
from typing import Any

from . import patch

KINDS = {
    "host_read": "a device-to-host read in the step: it waits for the device and, where the "
                 "value is still to be computed, cuts the graph (one more execution per step)",
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
STATUSES = {
    "verified": "tried on a patched copy: the number it targets moved the right way and the "
                "step got no slower",
    "did not help": "tried: the number it targets did not move",
    "hurt": "tried: it moved the number it targets but the step got slower (every timed step "
            "slower than every step before it)",
    "failed": "tried: the patched copy does not run",
    "not tried": "no mechanical edit of the model's file makes this fix (instead says what to "
                 "do), or port ran with fixes=False",
}
COLUMNS = ["kind", "where", "code", "evidence", "fix", "status", "verified", "instead", "cost_s",
           "file", "line"]
# the order fixes are tried in: what recompiles first, so later fixes are timed in steady steps
ORDER = ("shapes", "data_dependent", "fallback", "cpu_tensor", "float64", "host_read")
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
_READS = [(re.compile(r"\.item\(\)"), ".item()"), (re.compile(r"\.tolist\(\)"), ".tolist()"),
          (re.compile(r"\.numpy\(\)"), ".numpy()"),
          (re.compile(r"\.to\((?:device=)?[\"']cpu[\"']\)"), '.to("cpu")'),
          (re.compile(r"\.cpu\(\)"), ".cpu()"),
          (re.compile(r"\b(?:float|int|bool)\("), "float()/int()/bool() of a tensor"),
          (re.compile(r"^\s*(?:if|elif|while|assert)\b"), "a tensor in a condition"),
          (re.compile(r"\bprint\("), "printing a tensor"),
          (re.compile(r"\b(?:logging|logger|log)\.\w+\("), "logging a tensor")]
LOGGED = re.compile(r"\b(?:print|logging\.\w+|logger\.\w+|log\.\w+)\(")


def steps_frame(records: list[dict[str, Any]]) -> Any:
    """One row per step of every variant (``port_step`` records)."""
    import pandas as pd

    rows = [{k: v for k, v in r.items() if k not in ("kind", "fallback_ops", "shapes")}
            for r in records if r.get("kind") == "port_step"]
    return pd.DataFrame(rows, columns=["variant", "step", "watched", "step_s", "loss",
                                       "compiles", "new_programs", "programs", "executions",
                                       "to_device", "from_device", "fallbacks"])


def figures(records: list[dict[str, Any]], variant: str) -> dict[str, Any]:
    """`variant`'s steady figures: compilations in the steps after the first (programs first
    run there: what a fresh process compiles, whatever the warm worker had cached), the median
    executions and transfers per step over those steps, the step time over the timed steps
    (the unmetered ones after the first: median, min, max) and its losses."""
    steps = [r for r in records if r.get("kind") == "port_step" and r["variant"] == variant]
    after = [r for r in steps if r["step"] > 0] or steps
    timed = [r["step_s"] for r in after if not r.get("watched")] or [r["step_s"] for r in after]

    def median(values: list[float]) -> float:
        return statistics.median(values) if values else math.nan

    ops: dict[str, float] = {}
    for r in after:
        for op, n in r.get("fallback_ops", {}).items():
            ops[op.split(".")[0]] = ops.get(op.split(".")[0], 0) + n / len(after)
    return {"steps": len(steps),
            "compiles": sum(int(r.get("new_programs", r["compiles"])) for r in steps
                            if r["step"] > 0),
            "executions": median([r["executions"] for r in after]),
            "from_device": median([r["from_device"] for r in after]),
            "to_device": median([r["to_device"] for r in after]),
            "step_s": median(timed), "step_min": min(timed, default=math.nan),
            "step_max": max(timed, default=math.nan), "timed": len(timed),
            "losses": [r["loss"] for r in steps], "cpu_ops": ops}


def _short(file: str) -> str:
    try:
        return os.path.relpath(file) if Path(file).resolve().is_relative_to(Path.cwd()) else file
    except ValueError:
        return file


def _diff(before: str, after: list[str]) -> str:
    """The edit as a diff of stripped lines; an insertion after a line keeps that line as
    context."""
    if after and after[0] == before:
        return f"  {before.strip()}\n" + "\n".join(f"+ {line.strip()}" for line in after[1:])
    return f"- {before.strip()}\n" + "\n".join(f"+ {line.strip()}" for line in after)


def _row(kind: str, event: dict[str, Any], evidence: str, fix: str) -> dict[str, Any]:
    file, line = event.get("file", ""), int(event.get("line") or 0)
    return {"kind": kind, "where": f"{_short(file)}:{line}" if file else "",
            "code": event.get("code", ""), "evidence": evidence, "fix": fix,
            "status": "not tried", "verified": "", "instead": "", "cost_s": math.nan,
            "file": file, "line": line}


def read_kind(code: str) -> str:
    """What kind of host read a line makes, in words (from its code)."""
    return next((name for pattern, name in _READS if pattern.search(code)),
                "a read of a tensor's value")


def _read_advice(code: str) -> str:
    if LOGGED.search(code):
        return ("move it out of the step: log it after the step, in a step closure "
                "(xm.add_step_closure(lambda: ...)), or every N steps")
    if re.match(r"\s*(?:if|elif|while|assert)\b", code):
        return ("keep the decision on the device (torch.where(cond, a, b)), or take it after "
                "the step from a value the step returns")
    return ("move it out of the step: keep it on the device (a tensor, no read), return it from "
            "the step and read it after torch_xla.sync(), or log it every N steps")


def _text(file: str) -> str:
    try:
        return Path(file).read_text()
    except (OSError, ValueError):
        return ""


def _with_edit(kind: str, event: dict[str, Any], advice: str, dim: int | None = None) -> str:
    """`advice`, then the mechanical edit of the line as a diff where there is one."""
    text = _text(event.get("file", ""))
    made, _ = patch.edit_for(kind, text, int(event.get("line") or 0), event.get("code", ""),
                             dim=dim) if text else (None, "")
    return advice if made is None else f"{advice}\n{_diff(made.before, made.after)}"


def findings(records: list[dict[str, Any]], summary: dict[str, Any]) -> Any:
    """The blockers a ``port`` run found (see the module for the columns), none tried yet."""
    import pandas as pd

    variant = "as written"
    fig = figures(records, variant)
    events = [r for r in records if r.get("kind") == "port_event"
              and r.get("variant", variant) == variant]
    lines = [r for r in records if r.get("kind") == "port_line" and r["variant"] == variant]
    n_after = max(fig["steps"] - 1, 1)
    per_step = (f"the step as written runs {fig['executions']:g} graph executions and "
                f"{fig['from_device']:g} device-to-host transfers per step")
    explained = {(e["file"], int(e["line"])) for e in events if e["event"] == "data_dependent"}
    fallback_ops = {op for op in fig["cpu_ops"] if op not in EXPLAINED}
    for op in fallback_ops:
        for where in (summary.get("op_lines") or {}).get(op, {}):
            file, _, line = where.rpartition(":")
            explained.add((file, int(line)))

    rows = []
    for r in lines:
        if r["phase"] != "step" or not (r["reads"] or r["from_device"]):
            continue
        if not r["asks"] and (r["file"], int(r["line"])) in explained:
            continue  # a fallback's or a data-dependent op's own execution: that finding's
        cost = (f"{r['reads']:g} graph execution(s) (torch_xla's execution analysis: \"user "
                f"code trying to access tensor value\") and {r['from_device']:g} device-to-host "
                f"transfer(s) per step" if r["reads"] else
                f"no graph execution (the tensor was already on the device) but "
                f"{r['from_device']:g} device-to-host transfer(s) per step, which the step "
                "waits for")
        rows.append(_row("host_read", r, f"{read_kind(r['code'])} here: {cost}; {per_step}",
                         _with_edit("host_read", r, _read_advice(r["code"]))))
    for e in events:
        calls = e["calls_per_step"]
        if e["event"] == "crash":
            rows.append(_row("crash", e, e.get("reason", e["op"]),
                             "the step must run on XLA before anything can be measured: fix "
                             "this line first"))
        elif e["event"] == "data_dependent":
            rows.append(_row("data_dependent", e,
                             f"{e['op']} {calls:g} per step; {fig['compiles']} compilations in "
                             f"the {n_after} steps after the first",
                             _with_edit("data_dependent", e,
                                        "the masked form, same result, static shape: "
                                        "torch.where(mask, x, 0), and (x * mask).sum() / "
                                        "mask.sum() for a mean over the mask")))
        elif e["event"] == "cpu_tensor":
            copies = sum(r["to_device"] for r in lines if r["phase"] == "step"
                         and r["file"] == e["file"] and int(r["line"]) == int(e["line"]))
            rows.append(_row("cpu_tensor", e,
                             f"{e['op']} with a CPU tensor {calls:g} per step: "
                             f"{copies:g} host-to-device transfer(s) per step at this line "
                             f"({fig['to_device']:g} in the whole step)",
                             _with_edit("cpu_tensor", e,
                                        "make it on the device (device=x.device), or register "
                                        "a tensor attribute as a buffer so .to(device) "
                                        "moves it")))
        elif e["event"] == "float64":
            rows.append(_row("float64", e, f"{e['op']} makes float64 {calls:g} per step",
                             _with_edit("float64", e, "dtype=torch.float32 (or .float())")))
    rank = next((r["shapes"] for r in records if r.get("kind") == "port_step"), {})
    for key, dims in (summary.get("varying") or {}).items():
        made = (summary.get("made_at") or {}).get(key) or {}
        for dim, sizes in dims.items():
            buckets = summary["buckets"][key][dim]
            rows.append(_row(
                "shapes", made,
                f"input {key!r} dim {dim} took {len(sizes)} sizes in {summary['steps']} batches "
                f"({min(sizes)}..{max(sizes)}); {fig['compiles']} compilations in the "
                f"{n_after} steps after the first",
                _with_edit("shapes", made, f"pad {key!r} dim {dim} up to a few bucket sizes "
                           f"(here {buckets}) where it is made, and mask the padding out of "
                           "the loss", dim=int(dim) - len(rank.get(key, [])))))
    for op, n in sorted(fig["cpu_ops"].items()):
        if op in EXPLAINED:
            continue
        where = {w: c for w, c in ((summary.get("op_lines") or {}).get(op) or {}).items()
                 if not w.startswith(":")}  # ":0": no line of the model's (the backward)
        file, line = (next(iter(where)).rsplit(":", 1) if where else ("", "0"))
        event = {"file": file, "line": int(line), "code": _code(file, int(line))
                 or "(no line of the model's: run by the autograd engine, in the backward)"}
        advice = ("an op XLA has no lowering for: replace it with ops XLA lowers"
                  + (f" ({LOWERED_FORMS[op]})" if op in LOWERED_FORMS else "")
                  + ", or move it out of the step")
        rows.append(_row("fallback", event, f"aten::{op} ran on the CPU {n:g} times per step",
                         _with_edit("fallback", event, advice) if where else advice))
    dynamo: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in records:  # Dynamo may name a line twice (a frame, then the frame inlining it)
        if r.get("kind") == "port_dynamo" and r["event"] != "ran":
            kind = "graph_break" if r["event"] == "graph_break" else "dynamo_crash"
            dynamo.setdefault((kind, r["file"], int(r["line"] or 0)), r)
    for (kind, _, _), r in dynamo.items():
        rows.append(_row(kind, r, r["reason"], _dynamo_fix(r["reason"], r.get("code", ""))))
    return sort(pd.DataFrame(rows, columns=COLUMNS))


def sort(frame: Any) -> Any:
    """Costliest first: the findings whose fix was verified, by the step time it saved; then
    the rest (a fix that did not help saved no time of the finding's, whatever noise says)
    by status and kind."""
    if not len(frame):
        return frame
    rank = {status: i for i, status in enumerate(STATUSES)}
    keys = frame.assign(_saved=frame["cost_s"].where(frame["status"] == "verified"),
                        _status=frame["status"].map(rank))
    return frame.loc[keys.sort_values(["_saved", "_status", "kind", "line"],
                                      ascending=[False, True, True, True],
                                      na_position="last", kind="stable").index
                     ].reset_index(drop=True)


BRIEF = ["kind", "where", "status", "cost_s"]  # the columns a page shows, the rest on a click


def brief(frame: Any) -> Any:
    """`frame`'s key columns (:data:`BRIEF`), in its order: narrow enough for a page."""
    return frame[BRIEF].copy()


def _code(file: str, line: int) -> str:
    import linecache

    return linecache.getline(file, line).strip() if file else ""


def _dynamo_fix(reason: str, code: str) -> str:
    if "two different devices" in reason:
        return ("every tensor of the step on the XLA device: register a tensor attribute as a "
                "buffer, or make it with device=")
    if "item()" in reason or "capture_scalar_outputs" in reason:
        return ("no host read inside the compiled function (or "
                "torch._dynamo.config.capture_scalar_outputs = True)")
    if "Dynamic shape" in reason or "dynamic shape" in reason:
        return "the masked form with a static shape (torch.where, sums over the mask)"
    if "generic_jump" in reason:
        return "no Python `if` on a tensor's value: torch.where, or decide after the step"
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
