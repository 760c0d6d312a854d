"""From a ``port`` run's records (:mod:`tpu_workbench.worker.port`) to its findings, one row per
TPU blocker at the user's line with its evidence and fix, and from the run of a patched copy to
what that fix measurably did (:func:`judge`).

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
from dataclasses import dataclass, field
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
MIN_TIMED = 3  # timed steps on each side before a fix is called slower
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
_LOGGED = re.compile(r"\b(?:print|logging\.\w+|logger\.\w+|log\.\w+)\(")


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
    if _LOGGED.search(code):
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
    if kind == "host_read" and _LOGGED.search(code):
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
