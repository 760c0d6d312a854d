"""XLA's compilation caches: warm-worker hits, a new shape's miss, the persistent cache on CPU."""

from __future__ import annotations

import pytest

import tpu_workbench as wb

SPEC = wb.ExperimentSpec(model="mlp", preset="tiny", mode="lazy", steps=3)
BATCH, NEW_BATCH = 16, 24  # the study's batch sizes: the cold and warm runs, then the miss


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path_factory.mktemp("results")))
    seen = []
    try:
        out = wb.cache_study(SPEC.replace(batch_size=BATCH), new_shape={"batch_size": NEW_BATCH},
                             on_run=lambda scenario, result: seen.append(scenario))
    finally:
        mp.undo()
    assert seen == ["cold", "warm", "miss"]
    return out


def test_identical_rerun_in_a_warm_worker_compiles_nothing(study):
    cold, warm = study.runs.iloc[0], study.runs.iloc[1]
    assert cold.worker_runs_before == 0 and warm.worker_runs_before == 1
    assert cold.compiles >= 1  # the training step (XLA:CPU evaluates in eager PyTorch)
    assert warm.compiles == 0
    assert warm.cache_hits >= SPEC.steps  # every step's graph came from the cache
    assert warm.compile_ms == 0
    assert warm.cached_graphs == cold.cached_graphs  # nothing new was added


def test_saved_time_is_the_difference_of_the_runs_first_steps(study):
    """saved_ms against the step records each run streamed (its step 0's wall_ms)."""
    first = [r.records for r in study.results]
    first = [next(rec["wall_ms"] for rec in records
                  if rec.get("kind") == "step" and rec["step"] == 0) for records in first]
    assert list(study.runs["first_step_ms"]) == pytest.approx(first)
    # only the warm run, which compiled nothing, saved anything; the others paid a compile
    assert study.runs["saved_ms"].iloc[1] == pytest.approx(first[0] - first[1])
    assert study.runs["saved_ms"].iloc[[0, 2]].isna().all()


def test_new_shape_is_a_miss_with_its_cause(study):
    cold, miss = study.runs.iloc[0], study.runs.iloc[2]
    assert (cold.batch_size, miss.batch_size) == (BATCH, NEW_BATCH)  # as the workers reported
    assert miss.compiles >= 1
    assert miss.cached_graphs > cold.cached_graphs
    events = study.compiles[study.compiles["scenario"] == wb.compile_cache.SCENARIOS["miss"]]
    assert list(events["step"]) == [0]  # compiled once, at its first step, never again
    event = events.iloc[0]
    assert event["trigger"] == f"batch_size: {BATCH} -> {NEW_BATCH}"  # the field, both values
    assert "shape" in event["explanation"]  # same code, same inputs: an input's shape changed
    warm_events = study.compiles[study.compiles["scenario"] == wb.compile_cache.SCENARIOS["warm"]]
    assert warm_events.empty


def test_cache_study_chart_builds(study):
    chart = wb.charts.cache_first_steps(study.runs).to_dict()
    bars, labels = chart["layer"]  # bars and their labels
    assert bars["mark"]["type"] == "bar" and labels["mark"]["type"] == "text"
    enc = chart.get("encoding") or bars["encoding"]
    assert (enc["y"]["field"], enc["x"]["field"]) == ("label", "first_step_ms")
    assert enc["x"]["scale"]["type"] == "log"
    assert bars["encoding"]["color"]["field"] == "outcome"
    assert labels["encoding"]["text"]["field"] == "text"
    (rows,) = chart["datasets"].values()
    assert [r["label"] for r in rows] == ["cold worker (first run)", "warm worker, same spec",
                                          "warm worker, new shape"]
    first = [r.steps["wall_ms"].iloc[0] for r in study.results]  # each run's own step 0
    assert [r["first_step_ms"] for r in rows] == pytest.approx(first)
    assert [r["outcome"] for r in rows] == ["compiled (cache miss)", "cache hit",
                                            "compiled (cache miss)"]
    assert rows[1]["text"] == f"0 compiled, {study.runs.iloc[1].cache_hits:g} hits"


def test_persistent_cache_on_cpu_says_it_cannot_be_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("TPU_WORKBENCH_CACHE", str(tmp_path / "cache"))
    check = wb.persistent_cache_check(SPEC)
    first, second = check.runs.iloc[0], check.runs.iloc[1]
    assert check.folder.is_relative_to(tmp_path / "cache")
    assert first.persistent_misses >= 1 and first.files >= 1  # written to disk
    assert second.deserialize_failures >= 1  # found, but XLA:CPU cannot load executables
    assert second.persistent_hits == 0 and second.compiles >= 1
    assert not check.readable
    assert "cannot read" in check.verdict and "compiled again" in check.verdict
    assert str(check.folder) not in check.verdict  # no local path on the page
    assert "could not be read back" in second.note  # the run's own summary says it too


def test_changes_that_invalidate_a_graph_each_compile_at_their_step(results):
    for change, model in [("dtype", "mlp"), ("seq_len", "mingpt")]:
        spec = wb.ExperimentSpec(model=model, preset="tiny", mode="lazy", steps=3, change=change,
                                 change_at=1, options={"n_layer": 1} if model == "mingpt" else {})
        result = wb.run(spec)
        steps = result.steps.set_index("step")
        assert steps.loc[1, "compiles"] >= 1, change
        assert steps.loc[2, "compiles"] == 0, change  # the new graph is cached from then on
        events = wb.compile_events([result])
        assert list(events[events["step"] == 1]["trigger"]) == [wb.CHANGES[change]]


def test_cache_options_are_validated_before_anything_runs():
    with pytest.raises(wb.SpecError, match="seq_len.*sequence model"):
        wb.ExperimentSpec(model="mlp", change="seq_len", change_at=1, steps=3).validate()
    with pytest.raises(wb.SpecError, match="persistent_cache=True needs an XLA mode"):
        wb.ExperimentSpec(model="mlp", mode="inductor", persistent_cache=True).validate()
    with pytest.raises(wb.SpecError, match="needs an XLA mode"):
        wb.cache_study(SPEC.replace(mode="torch_eager"))


def test_persistent_cache_folder_is_per_runtime_configuration():
    def folder(**kw):
        return wb.runtime_config(SPEC.replace(persistent_cache=True, **kw)).cache_folder()

    assert folder() == folder(mode="compile")  # same worker configuration, same executables
    assert folder() == folder(explain_compiles=True)  # debug output does not change the program
    assert folder() != folder(num_devices=4)
    assert folder() != folder(xla_flags=("--xla_cpu_use_thunk_runtime=false",))
    env = wb.runtime_config(SPEC.replace(persistent_cache=True)).env()
    assert env["TPU_WORKBENCH_XLA_CACHE"] == str(folder())


def test_cache_cli_rejects_bad_input_before_starting_a_worker(tmp_path, capsys):
    from tpu_workbench import cli

    assert cli.main(["cache", "--mode", "inductor", "--out", str(tmp_path)]) == 2
    assert "needs an XLA mode" in capsys.readouterr().err
    assert cli.main(["cache", "--rounds", "0", "--out", str(tmp_path)]) == 2
    assert "--rounds must be a positive int, got 0" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.csv"))
