"""The validation table: published runs with their sources, the plan each is predicted with,
the recorded predictions, and the record a new plan is shown with. Nothing compiles here."""

from __future__ import annotations

import re

import pandas as pd
import pytest

import tpu_workbench as wb
from tpu_workbench import models, sharding
from tpu_workbench.errors import SpecError
from tpu_workbench.planning import validation as val


def test_the_table_spans_families_sequences_strategies_and_names_every_source():
    runs = val.published_runs()
    assert len(runs) >= 12 and runs["id"].is_unique
    planned = runs[runs["wb_model"] != ""]
    assert planned["family"].nunique() >= 3 and planned["seq_len"].nunique() >= 2
    assert planned["workbench_strategy"].nunique() >= 2
    for r in runs.itertuples():
        assert re.fullmatch(r"[0-9a-f]{40}", r.source_commit), r.id
        assert r.source_repo.count("/") == 1 and r.source_file, r.id
        assert r.published_s > 0 and r.global_batch == r.per_device_batch * r.chips, r.id
    for r in planned.itertuples():  # every plan names a real preset and strategy
        assert r.wb_preset in models.get_model(r.wb_model).presets, r.id
        assert r.workbench_strategy in sharding.STRATEGIES, r.id


def test_each_run_is_planned_with_its_flags_and_its_model_axis():
    runs = val.published_runs().set_index("id", drop=False)
    a1 = val.plan_of(runs.loc["A1"])
    assert a1["libtpu_flags"] == val.NO_COLLECTIVE_MATMUL and a1["model_axis"] is None
    assert (a1["slices"], a1["batch_size"], a1["seq_len"]) == (["v6e-8"], 24, 8192)
    assert val.plan_of(runs.loc["A4"])["libtpu_flags"] == ()
    c4 = val.plan_of(runs.loc["C4"])  # fsdp=64 x tensor=4
    assert (c4["strategies"], c4["model_axis"]) == (["fsdp_tp"], 4)
    missing = runs.loc["A1"].copy()
    missing["wb_model"] = ""
    with pytest.raises(SpecError, match="A1 .* has no workbench preset"):
        val.plan_of(missing)


def _prediction(run_id: str, seconds: float) -> dict:
    return {"id": run_id, "predicted_s": seconds, "bottleneck": "compute", "reason": ""}


def test_recording_replaces_a_runs_prediction_and_leaves_no_partial_file(tmp_path):
    path = tmp_path / "validation.csv"
    val.record([_prediction("A5", 4.0), _prediction("A1", 3.4)], path)
    val.record([_prediction("A5", 4.4)], path)
    kept = val.recorded(path)
    assert kept["id"].tolist() == ["A1", "A5"]  # in the table's order
    assert kept.set_index("id")["predicted_s"].to_dict() == {"A1": 3.4, "A5": 4.4}
    assert [p.name for p in tmp_path.iterdir()] == ["validation.csv"]


def test_ratios_the_worst_row_and_the_summary_leave_the_fitted_row_out():
    frame = val.validation(pd.DataFrame([_prediction("A1", 6.886), _prediction("A5", 4.602 * 1.2),
                                         _prediction("A8", 18.688 * 0.9)]))
    by_id = frame.set_index("id")
    assert by_id.loc["A5", "ratio"] == pytest.approx(1.2) and by_id.loc["A1", "fitted"]
    assert by_id.loc["A8", "within"] and pd.isna(by_id.loc["A6", "ratio"])
    worst = val.worst(frame)
    assert worst["id"] == "A5"  # A1 is twice off but fitted, so not judged
    text = val.summary(frame)
    assert text.startswith("2 published runs judged") and "worst A5" in text
    assert "1 within ±15%, 2 within ±25%" in text


def test_a_plan_is_shown_with_its_closest_runs_and_far_plans_say_so():
    frame = val.validation(pd.DataFrame([_prediction("A5", 4.602 * 1.1),
                                         _prediction("A8", 18.688 * 0.8)]))
    close, text = val.nearest(frame, "hf:llama", 128, "fsdp", n=1)
    assert close["id"].tolist() == ["A5"] and "at most 10% off" in text
    far, text = val.nearest(frame, "mingpt", 4, "tp")
    assert far["distance"].min() > 3 and text.startswith("Far from every checked run")
    plan = pd.DataFrame([{"model": "hf:llama", "chips": 64, "slice": "v6e-64",
                          "strategy": "fsdp"}])
    shown = wb.validation_record(plan, frame)
    assert shown.loc[0, "closest"] == "A8, A5" and shown.loc[0, "worst_error"] == pytest.approx(0.2)
    empty = val.validation(pd.DataFrame(columns=val.RECORDED_COLUMNS))
    assert val.nearest(empty, "hf:llama", 8, "fsdp")[1].startswith("No prediction")


def test_the_recorded_predictions_belong_to_the_table_and_draw():
    recorded = val.recorded()
    assert set(recorded["id"]) <= set(val.published_runs()["id"])
    chart = wb.predicted_vs_published(val.validation()).to_dict()
    assert chart["layer"][2]["encoding"]["color"]["field"] == "family"
