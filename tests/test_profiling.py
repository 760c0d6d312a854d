"""Profiling: traces to DataFrames that agree with the runner and the compiled HLO."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

import tpu_workbench as wb
from tpu_workbench import profiling


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


def test_step_totals_match_the_runner(profiled):
    result, profile = profiled
    steps = profile.steps.set_index("step")
    runner = result.steps.set_index("step")
    assert list(steps.index) == list(runner.index) == [0, 1, 2, 3, 4]
    ratio = steps["step_us"] / (runner["wall_ms"] * 1e3)
    assert ratio.between(0.9, 1.1).all(), ratio.to_dict()
    parts = steps[["compile_us", "execute_us", "transfer_us", "host_us", "idle_us"]].sum(axis=1)
    assert (abs(parts - steps["step_us"]) < 1.0).all()  # the parts add up to the step
    assert steps.loc[0, "compile_us"] > 10 * steps.loc[1:, "compile_us"].max()  # step 0 compiles


def test_charts_build(profiled):
    _, profile = profiled
    wb.charts.timeline(profile.events, step=2).to_dict()
    wb.charts.top_ops(profile.ops).to_dict()
    wb.charts.step_breakdown(profile.steps).to_dict()
    with pytest.raises(ValueError, match="no events in step 99"):
        wb.charts.timeline(profile.events, step=99)


def _args(tmp_path, **kw):
    base = dict(model="mlp", preset="tiny", mode="compile", steps=3, top=5, out=tmp_path / "o")
    return argparse.Namespace(**{**base, **kw})


def test_zero_steps_and_unwritable_folder_are_clear_errors(tmp_path):
    with pytest.raises(wb.SpecError, match="--steps must be a positive number.*got 0"):
        profiling.run(_args(tmp_path, steps=0))
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(wb.SpecError, match="is not writable"):
        profiling.run(_args(tmp_path, out=blocker / "sub"))


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
    assert profiling.run(_args(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "Perfetto" in out and "xprof --logdir" in out
    assert (tmp_path / "o" / "ops.csv").exists() and (tmp_path / "o" / "steps.csv").exists()
    assert list((tmp_path / "o" / "profile").rglob("*.xplane.pb"))
