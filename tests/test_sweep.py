"""Sweeps on the local pool and on Ray: a two-node ``ray.cluster_utils.Cluster`` on this machine
(a head with no CPUs, so every task goes to one of the two one-CPU nodes), shared by the tests."""

from __future__ import annotations

import threading
import time

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from tpu_workbench import ExperimentSpec, SpecError, WorkbenchError  # noqa: E402
from tpu_workbench.runs.store import load_result  # noqa: E402
from tpu_workbench.runs.workers import WORKER_LOG_ENV  # noqa: E402
from tpu_workbench.scale.sweeps import grid, parse_grid, sweep  # noqa: E402

BASE = ExperimentSpec(model="mlp", preset="tiny", mode="torch_eager", steps=3, seed=3)


@pytest.fixture(scope="module")
def cluster():
    # Faster node-death detection than the default 15 s, so the fault test finishes quickly.
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 0, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 2}})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    yield cluster, nodes
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def worker_log(tmp_path, monkeypatch):
    log = tmp_path / "workers.log"
    monkeypatch.setenv(WORKER_LOG_ENV, str(log))
    return log


def test_bad_input_is_refused_before_any_run(results, worker_log):
    with pytest.raises(SpecError, match="unknown sweep engine 'dask'.*local, ray"):
        sweep([BASE], engine="dask")
    with pytest.raises(SpecError, match="unknown field 'batchsize'.*batch_size"):
        grid(BASE, {"batchsize": [8, 16]})
    with pytest.raises(SpecError, match=r"grid point batch_size=0: batch_size must be"):
        grid(BASE, {"batch_size": [8, 0]})
    with pytest.raises(SpecError, match="unknown mode 'fast'"):
        sweep([BASE, BASE.replace(mode="fast")], engine="ray")
    with pytest.raises(SpecError, match="unknown field 'lr_rate'"):
        parse_grid(["lr_rate=0.1,0.2"])
    assert parse_grid(["batch_size=8,16", "mesh=2x4,8x1"]) == {
        "batch_size": [8, 16], "mesh": [(2, 4), (8, 1)]}
    assert not worker_log.exists() and not list(results.glob("*"))  # nothing started or written
    assert not ray.is_initialized()  # no Ray task could have started either


def test_unreachable_address_fails_fast_naming_it(results):
    t0 = time.monotonic()
    with pytest.raises(WorkbenchError, match=r"no Ray cluster answers at '127\.0\.0\.1:9'"):
        sweep([BASE], engine="ray", address="127.0.0.1:9")
    assert time.monotonic() - t0 < 10
    with pytest.raises(SpecError, match="not host:port"):
        sweep([BASE], engine="ray", address="nowhere")


def test_ray_sweep_uses_both_nodes_streams_and_matches_local(cluster, results):
    head, _ = cluster
    specs = grid(BASE, {"batch_size": [4, 8, 16, 32]})
    seen: list[tuple[float, int]] = []  # (when, batch_size) of each streamed step record
    ended: dict[int, float] = {}

    def on_record(record, spec):
        if record.get("kind", "step") == "step":
            seen.append((time.monotonic(), spec.batch_size))

    remote = sweep(specs, engine="ray", address=head.address, on_record=on_record,
                   on_run_end=lambda run: ended.setdefault(run.spec.batch_size,
                                                            time.monotonic()))
    runs = remote.runs
    assert list(runs["state"]) == ["done"] * 4, runs["error"].tolist()
    assert runs["node"].nunique() == 2  # both one-CPU nodes ran some of the specs
    assert list(runs["batch_size"]) == [4, 8, 16, 32]
    assert min(t for t, _ in seen) < max(ended.values())  # streamed before the sweep ended
    for run_id, node in zip(runs["run_id"], runs["node"], strict=True):
        stored = load_result(results / run_id)  # the driver's folder, written whole
        assert len(stored.steps) == 3
        assert (results / run_id / "environment.json").read_text().count(node) == 1
    local = sweep(specs, engine="local")
    assert set(local.runs["node"]) == {"local"}
    key = ["batch_size", "step"]
    ours = remote.steps.sort_values(key)[key + ["loss"]].reset_index(drop=True)
    theirs = local.steps.sort_values(key)[key + ["loss"]].reset_index(drop=True)
    assert len(ours) == 12 and ours.equals(theirs)  # same seed, same losses, bit for bit
    summary = remote.summary
    assert {"batch_size", "node"} <= set(summary.columns) and len(summary) == 4


def test_a_stopped_sweep_cancels_its_tasks_and_keeps_what_completed(cluster, results):
    head, _ = cluster
    specs = grid(BASE.replace(steps=2000), {"batch_size": [4, 8, 16]})  # minutes if not stopped
    stop = threading.Event()
    result = sweep(specs, engine="ray", address=head.address, stop=stop,
                   on_record=lambda record, spec: stop.set())  # at the first streamed record
    runs = result.runs
    assert set(runs["state"]) == {"cancelled"}, runs[["state", "error"]]
    assert sum(len(r.records) for r in result.runs_list) >= 1  # partial records kept
    assert len(list(results.glob("*-failed"))) == 3 and not list(results.glob("*.partial"))


def test_a_node_removed_mid_sweep_loses_nothing(cluster, results):
    head, nodes = cluster
    doomed = nodes[1]
    # The node dies under a run that has streamed its first step (removal takes ~0.1 s)
    specs = grid(BASE.replace(steps=300), {"batch_size": [4, 8, 16]})
    on_doomed: set[int] = set()
    removed = threading.Event()

    def placed(run):
        if run.node == doomed.node_id:
            on_doomed.add(run.spec.batch_size)

    def remove_once(record, spec):
        if not removed.is_set() and spec.batch_size in on_doomed and record.get("kind") == "step":
            removed.set()
            head.remove_node(doomed)

    result = sweep(specs, engine="ray", address=head.address, on_record=remove_once,
                   on_run_start=placed, max_retries=1)
    runs = result.runs
    assert set(runs["state"]) <= {"done", "crashed"}, runs[["state", "error"]]
    assert removed.is_set() and len(on_doomed) == 1
    victim = runs[runs["batch_size"] == on_doomed.pop()].iloc[0]  # run again on the other node
    assert (victim.state, victim.attempts) == ("done", 2) and victim.node != doomed.node_id
    for run in result.runs_list:
        if run.state == "done":
            assert len(load_result(results / run.run_id).steps) == 300
        else:  # reported failed, with its partial records on disk too
            assert (results / f"{run.run_id}-failed" / "records.jsonl").exists()
    assert not list(results.glob("*.partial"))
