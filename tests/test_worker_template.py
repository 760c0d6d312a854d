"""Workers forked from the template process (torch imported once) behave as spawned ones."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

import tpu_workbench as wb
from tpu_workbench.environment.runtimes import worker_thread_env
from tpu_workbench.runs import template as worker_template
from tpu_workbench.runs.spec import RuntimeConfig
from tpu_workbench.runs.workers import Worker, WorkerPool


@pytest.fixture()
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path / "results"))
    monkeypatch.delenv(worker_template.TEMPLATE_ENV, raising=False)
    return tmp_path


def _losses(result) -> list[float]:
    return [r["loss"] for r in result.records if r["kind"] == "step"]


def test_a_forked_xla_worker_trains_exactly_as_a_spawned_one(results, monkeypatch):
    spec = wb.ExperimentSpec(model="mlp", preset="tiny", mode="compile", steps=3)
    forked_pool, spawned_pool = WorkerPool(), WorkerPool()
    try:
        forked = wb.run(spec, pool=forked_pool, reuse=False)
        monkeypatch.setenv(worker_template.TEMPLATE_ENV, "0")
        spawned = wb.run(spec, pool=spawned_pool, reuse=False)
        (fw,), (sw,) = forked_pool.workers().values(), spawned_pool.workers().values()
        assert fw.forked and not sw.forked
        assert fw.info["device_count"] == sw.info["device_count"] == 8  # CPU_NUM_DEVICES seen
        # torch was imported before the fork: the forked worker's own imports are torch_xla's
        assert fw.info["import_s"] < sw.info["import_s"]
        assert _losses(forked) == _losses(spawned) and len(_losses(forked)) == 3
    finally:
        forked_pool.shutdown()
        spawned_pool.shutdown()


def test_a_killed_forked_worker_says_how_it_died_and_leaves_nothing_behind(results):
    worker = Worker(RuntimeConfig("torch", "cpu", 1))
    try:
        worker.wait_ready(120)
        assert worker.forked and worker.alive
        os.kill(worker.proc.pid, signal.SIGKILL)
        assert worker.proc.wait(10) == -signal.SIGKILL
        assert "was killed by SIGKILL" in worker.death_message()
        assert not worker.alive
    finally:
        worker.kill()
    # the template reaped it: no zombie under the pid
    assert not os.path.exists(f"/proc/{worker.proc.pid}") or _state(worker.proc.pid) != "Z"


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[-1].split()[0]


def test_an_env_torch_reads_at_import_means_a_spawn(results):
    # a worker's environment: this process's, the thread settings every worker gets, and
    # torch_xla's variables (read after the fork)
    env = {**os.environ, **worker_thread_env(), "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    assert worker_template._template().matches(env)
    # OpenMP's threads sleep at barriers in every worker, forked or spawned (libgomp reads it
    # when the template imports torch): spinning ones starved plain PyTorch on a busy host
    assert worker_template._template().env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert RuntimeConfig("torch", "cpu", 1).env()["OMP_WAIT_POLICY"] == "PASSIVE"
    # libgomp reads OMP_NUM_THREADS when torch loads it: the template's value would stick
    assert worker_template.fork_worker(sys.executable, "cpu", {**env, "OMP_NUM_THREADS": "1"}) \
        is None
    # another interpreter (TorchTPU's environment) or a chip: always spawned
    assert worker_template.fork_worker("/usr/bin/python3", "cpu", env) is None
    assert worker_template.fork_worker(sys.executable, "tpu", env) is None


def test_workers_outlive_their_template_and_a_new_template_serves_the_next(results):
    first = Worker(RuntimeConfig("torch", "cpu", 1))
    try:
        first.wait_ready(120)
        assert first.forked
        template = worker_template._template()
        template.proc.kill()
        template.proc.wait(10)
        time.sleep(0.2)
        assert first.alive  # its own session: the template's death is not its
        second = Worker(RuntimeConfig("torch", "cpu", 1))
        try:
            second.wait_ready(120)
            assert second.forked and worker_template._template() is not template
        finally:
            second.stop()
        first.stop()
        assert first.proc.wait(10) is not None and not first.alive  # watched by its pid now
    finally:
        first.kill()


def test_a_changed_process_environment_gets_a_template_of_its_own(results, monkeypatch):
    before = worker_template._template()
    monkeypatch.setenv("TPU_WORKBENCH_TEST_SETTING_TORCH_MIGHT_READ".removeprefix("TPU_"), "1")
    worker = Worker(RuntimeConfig("torch", "cpu", 1))
    try:
        worker.wait_ready(120)
        # forked, from a template started with the environment as it is now
        assert worker.forked and worker_template._template() is not before
        assert worker_template._template().env["WORKBENCH_TEST_SETTING_TORCH_MIGHT_READ"] == "1"
    finally:
        worker.stop()
