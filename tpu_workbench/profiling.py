"""Profiles of training steps, as DataFrames: events, per-HLO-op totals, per-step breakdown.

A run with ``capture=("profile",)`` records a trace of its steps in the worker (see
``tpu_workbench.worker``): for XLA modes torch_xla's profiler writes
``profile/plugins/profile/<time>/<host>.xplane.pb`` (open in XProf/TensorBoard) and
``<host>.trace.json.gz`` (open in Perfetto or chrome://tracing), with one event per executed HLO
op; each step is marked by a ``train_step`` event carrying its ``step_num``. Plain-PyTorch modes
write ``profile/torch.trace.json`` (torch.profiler, host-side ops only).

Only complete runs are read: a run that failed or was cancelled keeps its files in a
``<run_id>-failed`` folder, which :func:`load_profile` refuses to read as a profile.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import WorkbenchError

OPEN_HINT = (
    "Perfetto: open https://ui.perfetto.dev and drop in {trace}\n"
    "chrome://tracing: load {trace}\n"
    "XProf / TensorBoard: `xprof --logdir {logdir}` or `tensorboard --logdir {logdir}` with "
    "tensorboard-plugin-profile"
)
OPEN_HINT_MD = (
    "- **Perfetto**: open <https://ui.perfetto.dev> and drop in `{trace}`\n"
    "- **chrome://tracing**: load `{trace}`\n"
    "- **XProf / TensorBoard**: `xprof --logdir {logdir}`, or `tensorboard --logdir {logdir}` "
    "with tensorboard-plugin-profile"
)
OP_COLUMNS = ["hlo_module", "hlo_op", "inside", "count", "self_us", "inclusive_us", "mean_us",
              "per_step_us", "inclusive_per_step_us", "share"]
_COMPILE = re.compile(r"Compile|RunBackend|RunHloPasses|codegen", re.I)
_TRANSFER = re.compile(r"Transfer|ToDevice|FromDevice|CopyToHost|TensorToData", re.I)
_EXECUTE = re.compile(r"Execute|Thunk", re.I)


class ProfileError(WorkbenchError, ValueError):
    """No complete profile where one was asked for."""


@dataclass
class Profile:
    """A run's parsed trace: every complete event, and where the files are."""

    events: pd.DataFrame
    trace_path: Path
    logdir: Path

    @property
    def steps(self) -> pd.DataFrame:
        return step_breakdown(self.events)

    @property
    def ops(self) -> pd.DataFrame:
        return op_stats(self.events)

    def open_hint(self, relative_to: Path | str | None = None, markdown: bool = False) -> str:
        """How to open the trace in Perfetto, chrome://tracing and XProf: plain text, or a
        markdown list; with `relative_to` (e.g. the results folder) the paths are written
        relative to it."""
        trace, logdir = self.trace_path, self.logdir
        if relative_to is not None:
            trace, logdir = (_relative(p, Path(relative_to)) for p in (trace, logdir))
        return (OPEN_HINT_MD if markdown else OPEN_HINT).format(trace=trace, logdir=logdir)


def _relative(path: Path, base: Path) -> Path:
    try:
        return Path(path).resolve().relative_to(base.resolve())
    except ValueError:
        return Path(path)


def find_trace(run_dir: Path) -> Path:
    """The Chrome trace of a complete run folder (raises ProfileError otherwise)."""
    run_dir = Path(run_dir)
    if run_dir.name.endswith(("-failed", ".partial")):
        raise ProfileError(f"{run_dir} holds an interrupted run; its trace is incomplete and "
                           "is not read as a profile")
    if not (run_dir / "summary.json").exists():
        raise ProfileError(f"{run_dir} is not a completed run folder (no summary.json)")
    traces = sorted((run_dir / "profile").rglob("*.trace.json.gz")) + \
        sorted((run_dir / "profile").glob("torch.trace.json"))
    if not traces:
        raise ProfileError(f"no trace in {run_dir / 'profile'}: run with capture=('profile',)")
    return traces[-1]


def read_events(trace_path: Path) -> pd.DataFrame:
    """Complete ('X') events of a Chrome trace as a DataFrame.

    Columns: ``name``, ``thread`` (thread name without its numeric suffix), ``tid``, ``ts_us``
    (from the trace start), ``dur_us``, ``end_us``, ``step`` (the ``train_step`` the event
    started in; -1 outside any), ``hlo_module``, ``hlo_op`` (set for executed HLO ops).
    """
    opener = gzip.open if str(trace_path).endswith(".gz") else open
    with opener(trace_path, "rt") as fh:
        data = json.load(fh)
    raw = data["traceEvents"] if isinstance(data, dict) else data
    threads = {e.get("tid"): re.sub(r"/-?\d+$", "", e["args"]["name"])
               for e in raw if e.get("ph") == "M" and e.get("name") == "thread_name"}
    rows = []
    for e in raw:
        if e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        rows.append({"name": e["name"], "thread": threads.get(e.get("tid"), str(e.get("tid"))),
                     "tid": e.get("tid"), "ts_us": float(e["ts"]), "dur_us": float(e["dur"]),
                     "hlo_module": args.get("hlo_module"), "hlo_op": args.get("hlo_op"),
                     "step_num": _step_num(e["name"], args)})
    df = pd.DataFrame(rows)
    if df.empty:
        raise ProfileError(f"{trace_path} holds no complete events")
    df["ts_us"] -= df["ts_us"].min()
    df["end_us"] = df["ts_us"] + df["dur_us"]
    marks = df[df["step_num"].notna()].sort_values("ts_us")
    df["step"] = -1
    for _, m in marks.iterrows():
        inside = (df["ts_us"] >= m["ts_us"]) & (df["ts_us"] < m["end_us"])
        df.loc[inside, "step"] = int(m["step_num"])
    return df.drop(columns=["step_num"]).sort_values("ts_us", ignore_index=True)


def _step_num(name: str, args: dict[str, Any]) -> int | None:
    if name == "train_step" and "step_num" in args:
        return int(args["step_num"])
    match = re.match(r"train_step#(\d+)$", name)  # torch.profiler's record_function marks
    return int(match.group(1)) if match else None


def load_profile(run: Any) -> Profile:
    """The profile of a finished run (a RunResult or its folder)."""
    run_dir = Path(getattr(run, "out_dir", run))
    trace = find_trace(run_dir)
    return Profile(read_events(trace), trace, run_dir / "profile")


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def _select(items: list, mask: Any) -> list:
    return [item for item, keep in zip(items, mask, strict=True) if keep]


def step_breakdown(events: pd.DataFrame) -> pd.DataFrame:
    """Where each step's time went, from the events inside its ``train_step`` window.

    Columns: ``step``, ``step_us`` (the train_step event), ``compile_us``, ``execute_us``
    (executed HLO ops and execute calls, not counting compile time), ``transfer_us``,
    ``host_us`` (everything else that was busy: Python, tracing, dispatch), ``idle_us`` (no
    thread busy). The five parts add up to ``step_us``: each is the union of its events'
    intervals on all threads, clipped to the step, without overlap with the parts before it.
    """
    marks = events[events["name"].isin(["train_step"]) | events["name"].str.match(
        r"train_step#\d+$")]
    rows = []
    for _, m in marks.iterrows():
        lo, hi = m["ts_us"], m["end_us"]
        inside = events[(events["end_us"] > lo) & (events["ts_us"] < hi)
                        & (events.index != m.name)]
        clip = list(zip(inside["ts_us"].clip(lo, hi), inside["end_us"].clip(lo, hi),
                        strict=True))
        is_compile = inside["name"].str.contains(_COMPILE).to_numpy() | \
            inside["thread"].str.contains("codegen").to_numpy()
        is_exec = inside["hlo_op"].notna().to_numpy() | \
            inside["name"].str.contains(_EXECUTE).to_numpy()
        is_transfer = inside["name"].str.contains(_TRANSFER).to_numpy()
        compile_us = _union_us(_select(clip, is_compile))
        ce = _union_us(_select(clip, is_compile | is_exec))
        cet = _union_us(_select(clip, is_compile | is_exec | is_transfer))
        busy = _union_us(clip)
        step_us = hi - lo
        rows.append({"step": int(events.loc[m.name, "step"]) if m["step"] >= 0 else -1,
                     "step_us": step_us, "compile_us": compile_us,
                     "execute_us": ce - compile_us, "transfer_us": cet - ce,
                     "host_us": busy - cet, "idle_us": max(step_us - busy, 0.0)})
    return pd.DataFrame(rows).sort_values("step", ignore_index=True) if rows else pd.DataFrame()


def self_times(ops: pd.DataFrame) -> pd.DataFrame:
    """`ops` (HLO op events: ``tid``, ``ts_us``, ``dur_us``, ``end_us``, ``hlo_op``) with two
    columns added: ``self_us``, the event's duration less the HLO ops nested inside it on the
    same thread, and ``inside``, the op it is nested in (None at the top level).

    XLA:CPU runs some fusions inside a ``call.N`` op: the trace holds the call *and* the fusion
    within it, so summing durations would count that time twice. Self times add up to the
    time the thread spent in HLO ops, each microsecond counted once.
    """
    out = ops.copy()
    self_us = out["dur_us"].to_numpy(dtype=float).copy()
    parent: list[str | None] = [None] * len(out)
    names = out["hlo_op"].tolist()
    position = {label: i for i, label in enumerate(out.index)}
    order = out.sort_values(["tid", "ts_us", "dur_us"], ascending=[True, True, False])
    stack: list[tuple[int, float]] = []  # (row, end) of the ops enclosing the current one
    last_tid = object()
    for label, tid, start, end in zip(order.index, order["tid"], order["ts_us"],
                                      order["end_us"], strict=True):
        i = position[label]
        if tid != last_tid:
            stack, last_tid = [], tid
        while stack and stack[-1][1] <= start:
            stack.pop()
        if stack and end <= stack[-1][1] + 1e-3:  # inside the op on top (1 ns of slack)
            outer = stack[-1][0]
            self_us[outer] -= end - start
            parent[i] = names[outer]
        stack.append((i, end))
    out["self_us"] = self_us.clip(min=0.0)
    out["inside"] = parent
    return out


def op_stats(events: pd.DataFrame, steady_only: bool = True) -> pd.DataFrame:
    """Per executed HLO op, sorted by self time: ``hlo_module``, ``hlo_op``, ``inside`` (the op
    it runs nested in, if any), ``count``, ``self_us`` (total self time: nested ops left out),
    ``inclusive_us`` (total duration, nested ops included), ``mean_us`` (self time per call),
    ``per_step_us`` (self time per step), ``inclusive_per_step_us`` and ``share`` (self time
    over the summed duration of the steps counted). Since nested time is counted once, the
    shares of ops on one thread never add up to more than the thread's busy time; ops on
    parallel threads overlap in time, so the shares of all threads are not bounded by 1.

    ``steady_only`` leaves out step 0 (which also compiles) when later steps exist.
    """
    ops = events[events["hlo_op"].notna()]
    steps = sorted(s for s in events["step"].unique() if s >= 0)
    if steady_only and len(steps) > 1:
        steps = steps[1:]
    ops = ops[ops["step"].isin(steps)]
    if ops.empty:
        return pd.DataFrame(columns=OP_COLUMNS)
    ops = self_times(ops)
    marks = events[(events["name"] == "train_step") & events["step"].isin(steps)]
    step_total = float(marks["dur_us"].sum()) or float(ops["self_us"].sum())
    out = (ops.assign(inside=ops["inside"].fillna(""))
           .groupby(["hlo_module", "hlo_op"], as_index=False)
           .agg(inside=("inside", lambda v: v.mode().iloc[0]), count=("dur_us", "size"),
                self_us=("self_us", "sum"), inclusive_us=("dur_us", "sum")))
    out["inside"] = out["inside"].replace("", None)
    out["mean_us"] = out["self_us"] / out["count"]
    out["per_step_us"] = out["self_us"] / max(len(steps), 1)
    out["inclusive_per_step_us"] = out["inclusive_us"] / max(len(steps), 1)
    out["share"] = out["self_us"] / step_total
    return out[OP_COLUMNS].sort_values("self_us", ascending=False, ignore_index=True)


def op_costs_with_times(cost: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """XLA's cost per op (:func:`tpu_workbench.hlo.per_op_cost` of the step's optimised HLO)
    joined with the profile's measured time per step of the same op: adds ``seconds`` (mean
    per step) so a roofline plots *achieved* FLOP/s. Ops the profile did not see are dropped.

    The cost rows are top-level instructions whose figures include the computations they call,
    so the time joined is the op's inclusive time (nested ops included), not its self time."""
    times = (ops.groupby("hlo_op", as_index=False)["inclusive_per_step_us"].sum()
             .rename(columns={"inclusive_per_step_us": "per_step_us"}))
    merged = cost.merge(times, left_on="name", right_on="hlo_op", how="inner")
    merged["seconds"] = merged["per_step_us"] / 1e6
    return merged.drop(columns=["hlo_op"])
