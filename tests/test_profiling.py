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
    assert _encoding(top) == {"x": "per_step_us", "y": "hlo_op"}
    rows = _rows(top)
    assert len(rows) == 15
    ops = profile.events[profile.events["hlo_op"].notna() & (profile.events["step"] >= 1)]
    per_step = ops.groupby("hlo_op")["dur_us"].sum() / 4  # steady steps 1-4, by hand
    for r in rows:
        assert r["per_step_us"] == pytest.approx(per_step[r["hlo_op"]])
    assert min(r["per_step_us"] for r in rows) >= per_step.drop([r["hlo_op"] for r in rows]).max()

    breakdown = wb.charts.step_breakdown(profile.steps).to_dict()
    enc = _encoding(breakdown)
    assert (enc["x"], enc["y"], enc["color"]) == ("step", "ms", "part")
    rows = _rows(breakdown)
    assert len(rows) == 5 * 5  # 5 steps x compile, execute, transfer, host, idle
    assert {r["part"] for r in rows} == {"compile", "execute", "transfer", "host", "idle"}
    by_step = profile.steps.set_index("step")
    for r in rows:
        assert r["ms"] == pytest.approx(by_step.loc[r["step"], r["part"] + "_us"] / 1e3)
    with pytest.raises(ValueError, match="no events in step 99"):
        wb.charts.timeline(profile.events, step=99)


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
    assert list(ops.columns) == ["hlo_module", "hlo_op", "count", "total_us", "mean_us",
                                 "per_step_us", "share"]
    assert len(ops) > 0 and (ops["count"] == 2).all()  # steady steps 1 and 2, each op once
    runner_steps = pd.read_csv(tmp_path / "o" / "runner_steps.csv")
    assert list(runner_steps["step"]) == [0, 1, 2]
    assert list((tmp_path / "o" / "profile").rglob("*.xplane.pb"))
