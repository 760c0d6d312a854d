"""Profiling: traces to DataFrames that agree with the runner and the compiled HLO."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd
import pytest

import tpu_workbench as wb
from tpu_workbench import profiling
from tpu_workbench.cli import profile as profile_cli


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path_factory.mktemp("results")))
    spec = wb.ExperimentSpec(model="mingpt", preset="tiny", mode="compile", steps=5,
                             capture=("hlo", "profile"))
    result = wb.run(spec)
    mp.undo()
    return result, profiling.load_profile(result)


def test_hlo_op_rows_name_ops_of_the_compiled_step(profiled):
    result, profile = profiled
    after = [p for name, p in result.artifacts.items()
             if name.endswith("after_optimizations.txt") and "train_step" in name]
    assert len(after) == 1
    text = Path(after[0]).read_text()
    defined = set(re.findall(r"^\s*(?:ROOT )?%?([\w.\-]+) = ", text, re.M))
    ops = profile.ops
    assert len(ops) > 10
    assert set(ops["hlo_module"]) == {m for m in ops["hlo_module"] if "train_step" in m}
    missing = set(ops["hlo_op"]) - defined
    assert not missing, f"ops not in the post-optimisation HLO: {sorted(missing)[:10]}"


def _us_at_least(measured, bound):
    """measured >= bound, give or take 0.1% + 100 us: the trace's clock and the worker's
    perf_counter are different clocks."""
    return measured >= 0.999 * bound - 100


def test_step_windows_are_the_runners_steps(profiled):
    """Each train_step window encloses the runner's own timing of that step (the TraceMe opens
    before the worker's clock starts and closes after it stops, whatever the load), the windows
    follow each other in step order without overlapping, and all lie inside the run."""
    result, profile = profiled
    steps = profile.steps.set_index("step")
    runner = result.steps.set_index("step")
    assert list(steps.index) == list(runner.index) == [0, 1, 2, 3, 4]
    wall_us = runner["wall_ms"] * 1e3
    assert _us_at_least(steps["step_us"], wall_us).all(), (steps["step_us"], wall_us)
    assert steps["step_us"].sum() <= result.wall_s * 1e6
    marks = profile.events[profile.events["name"] == "train_step"].sort_values("ts_us")
    assert list(marks["step"]) == [0, 1, 2, 3, 4]
    assert (marks["ts_us"].to_numpy()[1:] >= marks["end_us"].to_numpy()[:-1]).all()


def test_each_step_holds_its_own_compile_and_execution(profiled):
    """What the trace puts in each step agrees with torch_xla's own counters, read by the runner
    in the worker: the compile of step 0 (CompileTime, the PjRt compile, which the trace's
    XLAGraphExecutor::Compile encloses) and one execution of the compiled step per step, whose
    HLO ops all start inside that step's window."""
    result, profile = profiled
    steps = profile.steps.set_index("step")
    runner = result.steps.set_index("step")
    assert runner.loc[0, "compile_ms"] > 0 and (runner.loc[1:, "compile_ms"] == 0).all()
    assert _us_at_least(steps.loc[0, "compile_us"], runner.loc[0, "compile_ms"] * 1e3)
    assert steps.loc[0, "compile_us"] > 10 * steps.loc[1:, "compile_us"].max()
    assert (runner["executions"] == 1).all()
    assert (steps["execute_us"] > 0).all()
    assert (steps[["transfer_us", "host_us", "idle_us"]] >= 0).all().all()
    ops = profile.events[profile.events["hlo_op"].notna()]
    per_step = {step: sorted(group["hlo_op"]) for step, group in ops.groupby("step")}
    assert sorted(per_step) == [0, 1, 2, 3, 4]  # no executed op outside a step
    # one execution of one program per step: the same ops in every step, each once
    assert all(names == per_step[0] for names in per_step.values())
    assert len(per_step[0]) == len(set(per_step[0])) > 10


def _encoding(spec: dict) -> dict[str, str]:
    """channel -> field of a single-view Vega-Lite spec (tooltip lists left out)."""
    return {ch: enc.get("field") for ch, enc in spec["encoding"].items() if isinstance(enc, dict)}


def _rows(spec: dict) -> list[dict]:
    return spec["datasets"][spec["data"]["name"]]


def test_charts_encode_the_profile(profiled):
    _, profile = profiled
    events = profile.events
    timeline = wb.charts.timeline(events, step=2).to_dict()
    assert _encoding(timeline) == {"x": "start_ms", "x2": "end_ms", "y": "thread",
                                   "color": "kind"}
    rows = _rows(timeline)
    in_step = events[events["step"] == 2]
    assert len(rows) == min(len(in_step), 4000)  # at most 4000 events, the longest
    assert min(r["start_ms"] for r in rows) == 0 and all(r["end_ms"] >= r["start_ms"]
                                                           for r in rows)
    assert {r["thread"] for r in rows} <= set(in_step["thread"])
    assert {r["kind"] for r in rows} == {"HLO op", "runtime / host"}

    top = wb.charts.top_ops(profile.ops).to_dict()
    bars, labels = top["layer"]
    assert {k: v for k, v in _encoding(bars).items() if k != "opacity"} == {
        "x": "per_step_us", "y": "hlo_op"}
    assert "pick" in [p["name"] for p in top.get("params", []) + bars.get("params", [])]
    assert _encoding(labels)["text"] == "label"
    rows = _rows(top)
    assert len(rows) == 15
    ops = profile.events[profile.events["hlo_op"].notna() & (profile.events["step"] >= 1)]
    self_us = profiling.self_times(ops)
    per_step = self_us.groupby("hlo_op")["self_us"].sum() / 4  # steady steps 1-4
    for r in rows:
        assert r["per_step_us"] == pytest.approx(per_step[r["hlo_op"]])
        assert r["label"] == f"{100 * r['share']:.1f}%"
    assert min(r["per_step_us"] for r in rows) >= per_step.drop([r["hlo_op"] for r in rows]).max()
    x_max = top["layer"][0]["encoding"]["x"]["scale"]["domain"][1]
    assert x_max > max(r["per_step_us"] for r in rows)  # room for the labels inside the plot

    breakdown = wb.charts.step_breakdown(profile.steps).to_dict()
    first, steady = breakdown["hconcat"]
    assert breakdown["resolve"]["scale"]["y"] == "independent"
    for panel in (first, steady):
        enc = _encoding(panel)
        assert (enc["x"], enc["y"], enc["color"]) == ("step", "ms", "part")
        assert "type" not in panel["encoding"]["y"].get("scale", {})  # linear, not symlog
    rows = [r for panel in (first, steady) for r in breakdown["datasets"][panel["data"]["name"]]]
    assert len(rows) == 5 * 5  # 5 steps x compile, execute, transfer, host, idle
    assert {r["part"] for r in rows} == {"compile", "execute", "transfer", "host", "idle"}
    by_step = profile.steps.set_index("step")
    for r in rows:
        assert r["ms"] == pytest.approx(by_step.loc[r["step"], r["part"] + "_us"] / 1e3)
    with pytest.raises(ValueError, match="no events in step 99"):
        wb.charts.timeline(profile.events, step=99)


def _trace(path, events):
    """A Chrome trace as torch_xla writes it: thread names, then complete ('X') events."""
    import json

    meta = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}}
            for tid, name in ((1, "python"), (2, "tf_XLAEigen/7"), (3, "tf_XLAEigen/8"))]
    rows = [{"ph": "X", "pid": 1, "tid": tid, "name": name, "ts": ts, "dur": dur, "args": args}
            for tid, name, ts, dur, args in events]
    path.write_text(json.dumps({"traceEvents": meta + rows}))
    return path


def _op(tid, name, ts, dur):
    return (tid, name, ts, dur, {"hlo_module": "train_step.1", "hlo_op": name})


def _step(n, ts, dur=200.0):
    return (1, "train_step", ts, dur, {"step_num": n})


def test_nested_ops_are_counted_once(tmp_path):
    """A call around a fusion (XLA:CPU's `call.N` -> `..._fusion.clone`): the fusion keeps its
    own time and the call only what it spends around it, so the top ops' shares add up to the
    time the thread was busy (by hand below), not the call twice."""
    events = [_step(0, 0.0), _op(2, "call.1", 10, 150)]  # step 0 compiles: left out
    for n, t in ((1, 200.0), (2, 400.0)):
        events += [_step(n, t),
                   _op(2, "call.1", t + 10, 100), _op(2, "fusion.1.clone", t + 12, 96),
                   _op(2, "dot.1", t + 120, 40),
                   _op(3, "copy.1", t + 15, 30)]  # another thread, overlapping the call
    ops = profiling.op_stats(profiling.read_events(_trace(tmp_path / "t.json", events)))
    ops = ops.set_index("hlo_op")
    assert list(ops.index) == ["fusion.1.clone", "dot.1", "copy.1", "call.1"]  # by self time
    assert ops["per_step_us"].to_dict() == pytest.approx(
        {"fusion.1.clone": 96, "dot.1": 40, "copy.1": 30, "call.1": 4})
    assert ops.loc["call.1", "inclusive_per_step_us"] == pytest.approx(100)
    assert ops.loc["fusion.1.clone", "inside"] == "call.1"
    assert ops["inside"].drop("fusion.1.clone").isna().all()  # another thread is not "inside"
    assert (ops["count"] == 2).all()
    # shares of the two steady steps (200 us each): thread 2 busy 140 us of 200, once
    assert ops["share"].to_dict() == pytest.approx(
        {"fusion.1.clone": 0.48, "dot.1": 0.2, "copy.1": 0.15, "call.1": 0.02})
    assert ops.loc[["fusion.1.clone", "dot.1", "call.1"], "share"].sum() == pytest.approx(0.7)


def test_self_time_of_deeper_nesting_and_siblings(tmp_path):
    """Three levels and two siblings: each level loses only its direct children's time."""
    events = [_step(0, 0.0, 1000.0),
              _op(2, "call.2", 100, 500),
              _op(2, "fusion.a", 110, 200), _op(2, "inner.x", 120, 50),
              _op(2, "fusion.b", 320, 100)]
    frame = profiling.read_events(_trace(tmp_path / "t.json", events))
    timed = profiling.self_times(frame[frame["hlo_op"].notna()]).set_index("hlo_op")
    assert timed["self_us"].to_dict() == pytest.approx(
        {"call.2": 500 - 200 - 100, "fusion.a": 150, "inner.x": 50, "fusion.b": 100})
    assert timed["inside"].fillna("-").to_dict() == {"call.2": "-", "fusion.a": "call.2",
                                                     "inner.x": "fusion.a",
                                                     "fusion.b": "call.2"}
    assert timed["self_us"].sum() == pytest.approx(500)  # the thread's busy time, once


def test_open_hint_paths_are_relative_to_the_results_folder(tmp_path):
    logdir = tmp_path / "results" / "run-1" / "profile"
    trace = logdir / "plugins" / "profile" / "t" / "vm.trace.json.gz"
    profile = profiling.Profile(pd.DataFrame(), trace, logdir)
    hint = profile.open_hint(relative_to=tmp_path / "results", markdown=True)
    assert str(tmp_path) not in hint
    assert "`run-1/profile/plugins/profile/t/vm.trace.json.gz`" in hint
    assert "`xprof --logdir run-1/profile`" in hint
    assert all(line.startswith("- ") for line in hint.splitlines())
    assert str(trace) in profile.open_hint()  # the CLI's plain form keeps full paths


def _args(tmp_path, **kw):
    base = dict(model="mlp", preset="tiny", mode="compile", steps=3, top=5, out=tmp_path / "o")
    return argparse.Namespace(**{**base, **kw})


def test_zero_steps_and_unwritable_folder_are_clear_errors(tmp_path):
    with pytest.raises(wb.SpecError, match="--steps must be a positive number.*got 0"):
        profile_cli.profile(_args(tmp_path, steps=0))
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(wb.SpecError, match="is not writable"):
        profile_cli.profile(_args(tmp_path, out=blocker / "sub"))


def test_interrupted_capture_is_not_read_as_a_profile(results):
    run = wb.submit(wb.ExperimentSpec(model="mlp", mode="lazy", steps=100_000,
                                      capture=("profile",)))
    for record in run:
        if record.get("kind") == "step" and record["step"] >= 3:
            break
    run.cancel()
    with pytest.raises(wb.RunCancelled):
        run.result()
    failed = results / f"{run.run_id}-failed"
    assert failed.is_dir() and not (results / run.run_id).exists()
    with pytest.raises(profiling.ProfileError, match="interrupted run"):
        profiling.load_profile(failed)


def test_cli_writes_tables_and_says_how_to_open(tmp_path, capsys, results):
    assert profile_cli.profile(_args(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "Perfetto" in out and "xprof --logdir" in out
    steps = pd.read_csv(tmp_path / "o" / "steps.csv")
    assert list(steps.columns) == ["step", "step_us", "compile_us", "execute_us", "transfer_us",
                                   "host_us", "idle_us"]
    assert list(steps["step"]) == [0, 1, 2]  # --steps 3
    ops = pd.read_csv(tmp_path / "o" / "ops.csv")
    assert list(ops.columns) == profiling.OP_COLUMNS
    assert len(ops) > 0 and (ops["count"] == 2).all()  # steady steps 1 and 2, each op once
    runner_steps = pd.read_csv(tmp_path / "o" / "runner_steps.csv")
    assert list(runner_steps["step"]) == [0, 1, 2]
    assert list((tmp_path / "o" / "profile").rglob("*.xplane.pb"))



def test_no_kernel_sits_above_the_hosts_roof(profiled, tmp_path, monkeypatch):
    """The host's roofline is a roof: every kernel the profile timed reached at most
    min(peak, intensity x the roof's bandwidth), with the peak measured while every core is
    busy with other work (a wall-clock peak measured so read 62 GFLOP/s under kernels that
    ran at 181)."""
    import subprocess
    import sys

    from tpu_workbench import charts, hlo, notebook
    from tpu_workbench.environment import backends

    result, _ = profiled
    monkeypatch.setenv("TPU_WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(backends, "_HOST_PEAK", None)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(backends.usable_cores())]
    try:
        peak, bandwidth, _ = wb.roofline_roof("this host (measured)")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    step = notebook.captured_step(result)
    timed = profiling.op_costs_with_times(hlo.per_op_cost(step.after_text),
                                          notebook.profile_ops(result))
    points = charts.roofline_points(timed, peak, bandwidth)
    assert len(points) >= 10 and (points["bound"] == "compute").any()
    above = points[points["flops_per_s"] > points["roof"]]
    assert above.empty, above[["name", "opcode", "flops", "bytes", "flops_per_s", "roof"]]
    assert wb.roofline_slopes("this host (measured)")["main memory"] < bandwidth
