"""The experiment runner: streaming, isolation, and every way a worker can fail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import types

import pytest

import tpu_workbench as wb
from tpu_workbench.runs import runner
from tpu_workbench.runs.runner import WorkerPool

MLP = wb.ExperimentSpec(model="mlp", mode="lazy", steps=5)
LONG = MLP.replace(steps=100_000)  # ~20 ms a step: runs for half an hour unless stopped


@pytest.fixture(scope="module")
def pool():
    pool = WorkerPool(max_workers=3)
    yield pool
    pool.shutdown()


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path))
    return tmp_path


def _wait_for_steps(run, n: int) -> list[dict]:
    got = []
    for record in run:
        if record.get("kind") == "step":
            got.append(record)
        if len(got) >= n:
            return got
    raise AssertionError(f"run ended after {len(got)} steps")


def test_import_is_cheap():
    """`import tpu_workbench` loads none of the heavy libraries; each public name still works,
    and touching a spec loads torch but never torch_xla."""
    code = ("import sys, tpu_workbench as wb; heavy = ('torch', 'torch_xla', 'pandas', 'altair'); "
            "print([m for m in heavy if m in sys.modules]); wb.ExperimentSpec().validate(); "
            "print('torch_xla' in sys.modules, "
            "all(getattr(wb, n) is not None for n in wb.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "False True"], out.stdout


def test_run_streams_records_before_the_end(pool, results):
    """Records arrive while the run goes on: after 3 streamed steps the test cancels, and a
    cancel only stops a run that is still going (a finished one returns its result). So a run
    that raises RunCancelled with fewer steps than asked streamed those 3 before its end,
    however fast or slow the machine is."""
    run = wb.submit(LONG, pool=pool)
    first = _wait_for_steps(run, 3)
    assert [r["step"] for r in first] == [0, 1, 2]
    run.cancel()
    with pytest.raises(wb.RunCancelled) as info:
        run.result()
    assert run.state == "cancelled"
    steps = [r["step"] for r in info.value.records if r.get("kind") == "step"]
    assert steps == list(range(len(steps))) and 3 <= len(steps) < LONG.steps


def test_run_result_and_artifacts(pool, results):
    result = wb.run(MLP, pool=pool)
    steps = result.steps
    assert list(steps["step"]) == [0, 1, 2, 3, 4]
    assert steps["wall_ms"].gt(0).all()
    assert steps["loss"].notna().all()
    # XLA:CPU: hardware type "CPU", PJRT device kind "cpu" (worker.runtime_info)
    assert (result.runtime["device_hw"], result.runtime["device_kind"]) == ("CPU", "cpu")
    assert result.summary["n_params"] > 0 and result.summary["mode"] == "lazy"
    assert result.out_dir == results / result.run_id
    assert {"steps.csv", "spec.json", "summary.json"} <= set(result.artifacts)
    assert not list(results.glob("*.partial"))


def test_warm_worker_is_reused(pool, results):
    wb.run(MLP, pool=pool)
    workers = pool.workers()
    pid = next(iter(workers.values())).proc.pid
    second = wb.run(MLP, pool=pool)
    assert second.runtime["pid"] == pid
    # Same graph in the same process: served from the in-process compile cache.
    assert second.steps["compiles"].sum() == 0
    assert second.steps["cached"].iloc[0] >= 1


def test_worker_killed_mid_run(pool, results):
    run = wb.submit(LONG, pool=pool)
    _wait_for_steps(run, 3)
    os.kill(run.worker.proc.pid, signal.SIGKILL)
    with pytest.raises(wb.WorkerCrashed, match="SIGKILL") as info:
        run.result()
    assert len([r for r in info.value.records if r.get("kind") == "step"]) >= 3
    assert list(results.glob(f"{run.run_id}-failed/steps.csv"))
    # The caller is still usable: the next run gets a fresh worker.
    assert wb.run(MLP, pool=pool).steps["step"].max() == 4


def test_unknown_xla_flag_is_rejected_before_any_worker_starts(pool):
    with pytest.raises(wb.SpecError, match="unknown XLA flag '--xla_dump_too=/tmp/x'.*xla_dump_to"):
        wb.submit(MLP.replace(xla_flags=("--xla_dump_too=/tmp/x",)), pool=pool)
    with pytest.raises(wb.SpecError, match="malformed XLA flag"):
        wb.submit(MLP.replace(xla_flags=("xla_dump_to",)), pool=pool)


def test_fatal_xla_flag_value_gives_clear_error(pool, results):
    # A known flag with a value XLA cannot parse passes validation, and aborts the worker.
    spec = MLP.replace(xla_flags=("--xla_cpu_multi_thread_eigen=notabool",))
    with pytest.raises(wb.WorkerCrashed, match="SIGABRT.*Couldn't interpret value notabool"):
        wb.run(spec, pool=pool)
    assert wb.run(MLP, pool=pool).summary["steps"] == 5  # caller still usable


class _Deadline:
    """Stands in for the run's deadline timer (``threading.Timer`` in the runner): it expires
    when the test says so, after records have streamed, not after a time that a busy machine
    may need before its first step."""

    def __init__(self, made: list[_Deadline], interval: float, function) -> None:
        self.interval, self.function = interval, function
        self.daemon = self.started = self.cancelled = False
        made.append(self)

    def start(self) -> None:
        self.started = True

    def cancel(self) -> None:
        self.cancelled = True

    def expire(self) -> None:
        assert self.started and not self.cancelled
        self.function()


@pytest.fixture
def deadlines(monkeypatch) -> list[_Deadline]:
    """The runner's timers become `_Deadline`s (every other threading name stays as it is)."""
    made: list[_Deadline] = []
    shim = types.ModuleType("threading")
    shim.__dict__.update(vars(threading))
    shim.Timer = lambda interval, function: _Deadline(made, interval, function)
    monkeypatch.setattr(runner, "threading", shim)
    return made


def test_timeout_keeps_partial_records(pool, results, deadlines):
    wb.run(MLP, pool=pool)
    before = len(deadlines)
    run = wb.submit(LONG, pool=pool, timeout=6)
    assert len(deadlines) == before + 1
    deadline = deadlines[-1]
    assert deadline.interval == 6 and deadline.started  # the clock runs from the submit
    streamed = _wait_for_steps(run, 3)
    deadline.expire()  # 6 s have passed, as far as the run can tell: its worker is stopped
    with pytest.raises(wb.RunTimeout, match=r"did not finish within 6 s; its worker was "
                                            r"stopped \((\d+) steps streamed") as info:
        run.result()
    assert run.state == "timeout" and not run.worker.alive
    steps = [r for r in info.value.records if r.get("kind") == "step"]
    assert steps[:3] == streamed and 3 <= len(steps) < LONG.steps  # kept, in order
    assert f"({len(steps)} steps streamed" in str(info.value)
    assert (results / f"{run.run_id}-failed" / "steps.csv").exists()
    assert wb.run(MLP, pool=pool).summary["steps"] == 5  # caller still usable: a fresh worker


def test_cancel_keeps_worker_warm(pool, results):
    run = wb.submit(LONG, pool=pool)
    _wait_for_steps(run, 2)
    pid = run.worker.proc.pid
    run.cancel()
    with pytest.raises(wb.RunCancelled) as info:
        run.result()
    assert len(info.value.records) >= 2
    assert run.worker.alive, "a cooperative cancel stops at a step boundary, worker stays warm"
    assert wb.run(MLP, pool=pool).runtime["pid"] == pid


def test_two_device_counts_from_one_parent(pool, results):
    a = wb.run(MLP.replace(num_devices=2), pool=pool)
    b = wb.run(MLP.replace(num_devices=4), pool=pool)
    assert (a.runtime["device_count"], b.runtime["device_count"]) == (2, 4)
    assert a.runtime["pid"] != b.runtime["pid"]
    assert a.steps["loss"].tolist() == pytest.approx(b.steps["loss"].tolist(), rel=1e-5)


def test_failure_inside_worker_is_reported_and_worker_survives(pool, results):
    pid = wb.run(MLP, pool=pool).runtime["pid"]
    with pytest.raises(wb.RunFailed, match="ValueError: unknown task 'nope'") as info:
        wb.submit(MLP, pool=pool, task="nope").result()
    assert "Traceback" in info.value.remote_traceback
    assert wb.run(MLP, pool=pool).runtime["pid"] == pid


@pytest.mark.parametrize("change, match", [
    ({"mode": "jit"}, "unknown mode 'jit'; valid modes: torch_eager"),
    ({"model": "gpt5"}, "unknown model 'gpt5'; valid models: mlp"),
    ({"preset": "huge"}, "unknown preset 'huge' for model 'mlp'; valid presets: tiny"),
    ({"steps": 0}, r"steps=0 \(lay the model out, train no step\) needs a mesh and an XLA mode"),
    ({"steps": 0, "mode": "lazy", "mesh": (2, 4), "capture": ("hlo",)}, "captures nothing"),
    ({"steps": -1}, "steps must be a positive int, got -1"),
    ({"batch_size": -2}, "batch_size must be a positive int, got -2"),
    ({"device": "gpu"}, "unknown device 'gpu'"),
    ({"capture": ("hlo", "flamegraph")}, "unknown capture 'flamegraph'"),
    ({"mesh": (2, 2), "num_devices": 8}, "mesh 2x2 has 4 devices but num_devices=8"),
    ({"mesh": (2, 4), "mode": "inductor"}, "inductor is not offered for a gang"),
    ({"mesh": (2, 4), "mode": "torch_eager", "capture": ("profile",)}, "not offered for a gang"),
    ({"options": {"d_hiden": 3}}, r"unknown option\(s\) \['d_hiden'\]"),
    ({"options": {"n_classes": 1}}, "n_classes must be at least 2, got 1"),
])
def test_bad_specs_are_rejected_before_work(change, match):
    with pytest.raises(wb.SpecError, match=match):
        MLP.replace(**change).validate()


def test_device_count_follows_the_mesh_unless_given():
    assert MLP.device_count == 8  # no mesh: a v6e-8 host's 8 virtual devices
    assert MLP.replace(mesh=(2, 2)).device_count == 4
    assert wb.runtime_config(MLP.replace(mode="compile", mesh=(2, 2))).num_devices == 4
    assert MLP.replace(num_devices=2).device_count == 2
    assert MLP.replace(mesh=(2, 2)).replace(mesh=(2, 4)).validate().device_count == 8


def test_tpu_asked_for_but_absent_says_why():
    status = wb.tpu_status()
    if status.available:
        pytest.skip("a TPU is present")
    with pytest.raises(wb.SpecError, match="no TPU can be used: .*What runs instead"):
        wb.runtime_config(MLP.replace(device="tpu"))


@pytest.fixture
def sigint_raises():
    """Ctrl-C raises KeyboardInterrupt, as in a terminal: a process started in the background by
    a non-interactive shell inherits SIGINT ignored, and Python then leaves it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_interrupted_iteration_cancels_the_run(pool, results, sigint_raises):
    """Interrupting the cell that iterates a run (Ctrl-C, marimo's stop) cancels the run."""
    run = wb.submit(LONG, pool=pool)
    _wait_for_steps(run, 1)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        for _ in run:
            pass
    with pytest.raises(wb.RunCancelled):
        run.result()
    assert run.state == "cancelled"


def test_comparison_result_of_a_single_run(pool, results):
    streamed = []  # run_many's on_record: every record as the worker streams it (live charts)
    comparison = wb.run_many([MLP], pool=pool, on_record=lambda r, s: streamed.append((r, s)))
    assert comparison.result().summary["steps"] == 5
    assert [r for r, _ in streamed] == comparison.result().records
    assert all(s == MLP for _, s in streamed)
    failed = wb.run_many([LONG], pool=pool, timeout=0.001)  # cannot finish before its deadline
    with pytest.raises(wb.RunTimeout):
        failed.result()
    with pytest.raises(ValueError, match="needs exactly one run, this comparison has 2"):
        wb.Comparison(results=comparison.results * 2).result()


def test_checking_a_spec_imports_no_torch():
    """The notebook kernel checks every spec before a run: for minGPT and the MLP (and a mesh)
    that must not cost it `import torch` (seconds on two cores)."""
    code = ("import sys, tpu_workbench as wb\n"
            "for s in (wb.ExperimentSpec(model='mingpt', mesh=(2, 4), strategy='dp_tp'),\n"
            "          wb.ExperimentSpec(model='mlp', mode='lazy', steps=0, mesh=(8,),\n"
            "                            strategy='dp')):\n"
            "    s.validate()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", out



def test_a_worker_errors_state_is_one_rule_for_both_sweep_engines():
    from tpu_workbench import errors

    for cls, state in ((errors.WorkerCrashed, "crashed"), (errors.RunTimeout, "timeout"),
                       (errors.RunCancelled, "cancelled"), (errors.RunFailed, "failed")):
        assert errors.error_state(cls("x")) == state  # the local engine holds the exception
        assert errors.error_state(cls.__name__) == state  # a Ray task sends its name
    assert errors.error_state("SpecError") == errors.error_state(ValueError()) == "failed"


def test_a_worker_that_dies_before_it_gets_the_run_is_a_crash(pool, results, monkeypatch):
    """The pipe to a worker that died between the pool's check and the send is closed: the run
    ends as a WorkerCrashed naming it (it used to raise BrokenPipeError out of submit)."""
    worker = pool.worker(wb.runtime_config(MLP))

    def closed(message):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(worker, "send", closed)
    run = wb.submit(MLP, pool=pool)
    with pytest.raises(wb.WorkerCrashed, match="lost its worker before it started"):
        run.result()
    assert run.state == "crashed"
