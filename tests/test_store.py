"""Reusing measured runs: only the same spec in the same environment, only completed runs."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

import tpu_workbench as wb
from tpu_workbench.notebook import provenance
from tpu_workbench.runs import store
from tpu_workbench.runs.runner import WORKER_LOG_ENV, WorkerPool

SPEC = wb.ExperimentSpec(model="mlp", mode="lazy", steps=3)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """One completed XLA run in a results folder of its own."""
    root = tmp_path_factory.mktemp("store") / "results"
    pool = WorkerPool(max_workers=1)
    try:
        result = wb.run(SPEC, pool=pool, out_dir=root)
    finally:
        pool.shutdown()
    return root, result


def test_a_completed_run_is_reused_for_the_same_spec(stored, tmp_path, monkeypatch):
    root, result = stored
    monkeypatch.setenv(WORKER_LOG_ENV, str(tmp_path / "workers.log"))
    again = wb.run(SPEC, reuse=True, out_dir=root)
    assert again.reused and not result.reused
    assert again.run_id == result.run_id and again.measured_at == result.measured_at
    assert again.records == result.records and again.runtime["device_count"] == 8
    assert not (tmp_path / "workers.log").exists()  # no worker started to answer it
    assert "Reused: measured at" in provenance(again)
    assert "Measured just now" in provenance(result)


def test_another_spec_is_not_reused(stored):
    root, _ = stored
    for other in (SPEC.replace(steps=4), SPEC.replace(mode="compile"),
                  SPEC.replace(batch_size=16), SPEC.replace(seed=1)):
        assert wb.reusable(other, out_dir=root) is None, other


def test_another_environment_is_not_reused(stored, monkeypatch):
    root, _ = stored
    assert wb.reusable(SPEC, out_dir=root) is not None
    with monkeypatch.context() as m:  # an XLA flag the worker would inherit
        m.setenv("XLA_FLAGS", "--xla_cpu_use_thunk_runtime=false")
        assert wb.reusable(SPEC, out_dir=root) is None
    with monkeypatch.context() as m:  # another torch_xla release
        versions = dict(store._versions(sys.executable))
        versions["torch_xla"] = "2.99.0"
        m.setattr(store, "_versions", lambda python: tuple(versions.items()))
        assert wb.reusable(SPEC, out_dir=root) is None
    with monkeypatch.context() as m:  # another host CPU
        m.setattr(store, "_host_cpu", lambda: "Another CPU x64")
        assert wb.reusable(SPEC, out_dir=root) is None
    # another device count is another fingerprint (the spec asks for 4 virtual devices)
    four = wb.fingerprint(wb.runtime_config(SPEC.replace(num_devices=4)))
    eight = wb.fingerprint(wb.runtime_config(SPEC))
    assert four["device"] == {"kind": "cpu", "count": 4} and four != eight
    assert wb.reusable(SPEC, out_dir=root) is not None  # and nothing above changed the store


def test_failed_and_partial_runs_are_never_reused(stored, tmp_path):
    root, result = stored
    for suffix in ("-failed", ".partial"):
        copy = tmp_path / suffix.strip("-.") / "results"
        shutil.copytree(result.out_dir, copy / (result.run_id + suffix))
        assert wb.reusable(SPEC, out_dir=copy) is None, suffix
    half = tmp_path / "half" / "results"  # a folder without its records is not a run
    shutil.copytree(result.out_dir, half / result.run_id)
    (half / result.run_id / "records.jsonl").unlink()
    assert wb.reusable(SPEC, out_dir=half) is None
    assert json.loads((result.out_dir / "environment.json").read_text())["task"] == "train"


def test_cold_runs_start_the_first_worker_alone_then_the_rest_together(results, tmp_path,
                                                                        monkeypatch):
    from tpu_workbench.runs import experiments, workers

    log = tmp_path / "workers.log"
    monkeypatch.setenv(WORKER_LOG_ENV, str(log))
    events: list[str] = []  # worker start-ups and timed runs, in the order they happened
    real_init, real_measure = workers.Worker.__init__, experiments._measure

    def init(self, config):
        events.append("start")
        real_init(self, config)

    def measure(spec, *args):
        events.append(f"run {spec.mode}")
        return real_measure(spec, *args)

    monkeypatch.setattr(workers.Worker, "__init__", init)
    monkeypatch.setattr(experiments, "_measure", measure)
    # Plain-PyTorch workers start fastest; the seed makes three different specs.
    specs = [wb.ExperimentSpec(model="mlp", mode="torch_eager", steps=2, seed=s) for s in range(3)]
    comparison = wb.run_many(specs, cold=True)
    assert comparison.ok, comparison.errors
    # The first result after one start-up; no start-up overlaps a timed run after that.
    assert events == ["start", "run torch_eager", "start", "start", "run torch_eager",
                      "run torch_eager"]
    assert len(log.read_text().splitlines()) == 3  # one fresh worker per run
    assert all(r.worker_start_s > 0 for r in comparison.results)
    breakdown = wb.startup_breakdown(comparison.results)  # spawn, imports, build, steps
    assert (breakdown[["spawn", "imports", "build", "first_step"]] > 0).all().all(), breakdown
    assert (breakdown.imports < [r.worker_start_s for r in comparison.results]).all()
    again = wb.run_many(specs, reuse=True, cold=True)
    assert [r.reused for r in again.results] == [True, True, True]
    assert len(log.read_text().splitlines()) == 3  # reuse started none


def test_a_bad_spec_fails_a_cold_comparison_before_any_run_and_leaves_no_worker(
        results, tmp_path, monkeypatch):
    import psutil

    log = tmp_path / "workers.log"
    monkeypatch.setenv(WORKER_LOG_ENV, str(log))
    good = wb.ExperimentSpec(model="mlp", mode="torch_eager", steps=2)
    with pytest.raises(wb.SpecError, match="steps must be a positive int"):
        wb.run_many([good, good.replace(steps=0)], cold=True)
    # The first run's worker was started early (its imports overlap the validation) and is gone.
    pids = [int(line.split("pid=")[1].split()[0]) for line in log.read_text().splitlines()]
    assert len(pids) == 1 and not psutil.pid_exists(pids[0])
    assert not list(results.glob("*"))  # nothing ran, nothing was written


def test_a_cold_run_reuses_only_a_run_of_a_fresh_worker(stored, tmp_path):
    root, result = stored  # measured in a fresh pool: its worker's first run
    assert result.worker_start_s > 0 and wb.reusable(SPEC, out_dir=root, cold=True) is not None
    warm = tmp_path / "warm" / "results"
    shutil.copytree(result.out_dir, warm / result.run_id)
    env_file = warm / result.run_id / "environment.json"
    env = json.loads(env_file.read_text())
    env_file.write_text(json.dumps({**env, "worker_start_s": 0.0}))  # as a warm worker's run
    assert wb.reusable(SPEC, out_dir=warm) is not None
    assert wb.reusable(SPEC, out_dir=warm, cold=True) is None


def test_a_derived_figure_is_computed_once_and_kept_whole_in_the_run_folder(stored, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(stored[1].out_dir, folder)
    run = store.load_result(folder)
    calls = []

    def compute():
        calls.append(1)
        return {"flops": 12.5, "ops": {"dot": 3}}

    assert store.derived(run, "figure", compute) == {"flops": 12.5, "ops": {"dot": 3}}
    assert store.derived(store.load_result(folder), "figure", compute) == compute()  # read back
    assert len(calls) == 2  # once by the first call, once by the comparison above
    assert sorted(p.name for p in (folder / "derived").iterdir()) == ["figure.json"]
    (folder / "derived" / "figure.json").write_text("{not json")  # a damaged file: computed anew
    assert store.derived(run, "figure", compute)["flops"] == 12.5 and len(calls) == 3


def test_a_derived_frame_comes_back_with_its_columns_and_dtypes(stored, tmp_path):
    import pandas as pd

    folder = tmp_path / "copy"
    shutil.copytree(stored[1].out_dir, folder)
    frame = pd.DataFrame({"hlo_op": pd.array(["dot.1", "fusion.2"], dtype="string"),
                          "inside": pd.array([None, "dot.1"], dtype="string"),
                          "count": [3, 1], "self_us": [12.5, 0.25]})
    calls = []
    first = store.derived_frame(store.load_result(folder), "ops", lambda: calls.append(1) or frame)
    again = store.derived_frame(store.load_result(folder), "ops", lambda: calls.append(1) or frame)
    assert len(calls) == 1  # the second call read the kept file
    for got in (first, again):
        pd.testing.assert_frame_equal(got, frame)


def test_placement_rules_and_kernels_are_part_of_the_measuring_source(tmp_path, monkeypatch):
    """A copy of the workbench and its kernels: editing sharding/ (the placement rules the
    worker lays a mesh out with) or kernels/ (minGPT's Pallas attention) changes the
    fingerprint, so stored runs are measured again; editing a chart does not."""
    import tpu_workbench

    package = tmp_path / "tpu_workbench"
    kernels = tmp_path / "kernels"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(Path(tpu_workbench.__file__).parent, package, ignore=ignore)
    shutil.copytree(Path(__file__).resolve().parents[1] / "kernels", kernels, ignore=ignore)
    monkeypatch.setattr(store, "PACKAGE", package)
    monkeypatch.setattr(store, "kernels_package", lambda: kernels)
    config = wb.runtime_config(SPEC)

    def source() -> str:
        store._source_hash.cache_clear()
        return wb.fingerprint(config)["workbench_source"]

    try:
        before = source()
        for edited, changes in ((package / "charts" / "chips.py", False),
                                (package / "sharding" / "strategies.py", True),
                                (kernels / "flash_attention.py", True)):
            edited.write_text(edited.read_text() + "\n# an edit\n")
            after = source()
            assert (after != before) is changes, edited
            before = after
    finally:
        store._source_hash.cache_clear()  # the real tree's hash for the tests that follow


def test_the_kernels_hashed_are_this_projects_not_a_namesake(tmp_path, monkeypatch):
    """``kernels`` is also the name of a Hugging Face package: only this project's (the Pallas
    kernels minGPT imports through kernels.torch_bridge) is hashed, found beside tpu_workbench/
    when the import system finds another."""
    import importlib.machinery
    import importlib.util

    repo = Path(__file__).resolve().parents[1]
    assert store.kernels_package() == repo / "kernels"
    other = tmp_path / "kernels"
    other.mkdir()
    (other / "__init__.py").write_text("")
    namesake = importlib.machinery.ModuleSpec("kernels", None, origin=str(other / "__init__.py"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: namesake)
    assert store.kernels_package() == repo / "kernels"
