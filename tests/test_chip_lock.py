"""The chip lock: who holds the TPU, named; this workbench's own idle worker released; nobody
else's process ever ended. Holders are simulated with a proc-like folder (``<pid>/fd/<n>``
links to ``/dev/accel0``, ``<pid>/cmdline``), the way the detection reads ``/proc``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from tpu_workbench.environment import backends
from tpu_workbench.runs.spec import RuntimeConfig
from tpu_workbench.runs.workers import ChipBusy, Worker, WorkerPool


def fake_proc(root, pid: int, cmdline: list[str], device: str = "/dev/accel0") -> None:
    """A process entry of a proc-like root that holds `device` open (fd 3)."""
    fd = root / str(pid) / "fd"
    fd.mkdir(parents=True)
    os.symlink("/dev/null", fd / "0")
    os.symlink(device, fd / "3")
    (root / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")


def idle_worker() -> Worker:
    """A Worker of this process whose process serves the protocol's ``exit`` and nothing else
    (so ending it needs no runtime import)."""
    worker = Worker.__new__(Worker)
    worker.proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE,
        text=True, start_new_session=True)
    worker._lock, worker._write_lock = threading.Lock(), threading.Lock()
    backends.register_own_worker(worker.proc.pid, worker)
    return worker


@pytest.fixture
def holders(tmp_path):
    """Three holders of the chip: our idle worker, another kernel's workbench worker and a
    process the workbench did not start (a real one, to show it is left running)."""
    ours = idle_worker()
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc = tmp_path / "proc"
    fake_proc(proc, ours.proc.pid, [sys.executable, "-m", "tpu_workbench.worker"])
    fake_proc(proc, 4343, ["/venv/bin/python", "-m", "tpu_workbench.worker"],
              device="/dev/vfio/0")
    fake_proc(proc, stranger.pid, [sys.executable, "my_train.py", "--tpu"])
    pool = WorkerPool()
    pool._workers[RuntimeConfig("xla", "tpu")] = ours
    yield proc, pool, ours, stranger
    backends.unregister_own_worker(ours.proc.pid)
    for p in (ours.proc, stranger):  # only the processes this test started, by their pid
        if p.poll() is None:
            p.kill()
        p.wait()


def test_holders_are_named_with_pid_command_and_whose(holders):
    proc, _, ours, stranger = holders
    found = {h.pid: h for h in backends.tpu_holder_details(str(proc))}
    assert set(found) == {ours.proc.pid, 4343, stranger.pid}
    assert found[ours.proc.pid].own and found[ours.proc.pid].idle
    assert found[4343].workbench_worker and not found[4343].own
    assert not found[stranger.pid].workbench_worker and not found[stranger.pid].idle
    text = backends.holders_message(list(found.values()))
    assert f"pid {stranger.pid}" in text and "my_train.py --tpu" in text
    assert "not started by the workbench, left alone" in text
    assert "pid 4343" in text and "another process started" in text


def test_release_ends_our_idle_worker_and_names_the_others(holders):
    proc, pool, ours, stranger = holders
    with pytest.raises(ChipBusy) as err:
        pool.release_chip(str(proc))
    assert ours.proc.wait(timeout=10) == 0  # it took the protocol's exit, and is gone
    assert not pool.workers()  # and out of the pool
    assert stranger.poll() is None  # never ended: the workbench did not start it
    message = str(err.value)
    assert f"pid {stranger.pid}" in message and "my_train.py" in message and "4343" in message
    assert str(ours.proc.pid) not in message
    assert {h.pid for h in err.value.holders} == {4343, stranger.pid}


def test_release_with_only_our_idle_worker_frees_the_chip(tmp_path):
    ours = idle_worker()
    try:
        fake_proc(tmp_path, ours.proc.pid, [sys.executable, "-m", "tpu_workbench.worker"])
        assert WorkerPool().release_chip(str(tmp_path)) == [ours.proc.pid]
        assert ours.proc.wait(timeout=10) == 0
    finally:
        backends.unregister_own_worker(ours.proc.pid)
        if ours.proc.poll() is None:
            ours.proc.kill()


def test_our_busy_worker_is_not_ended(tmp_path):
    ours = idle_worker()
    try:
        fake_proc(tmp_path, ours.proc.pid, [sys.executable, "-m", "tpu_workbench.worker"])
        ours._lock.acquire()  # serving a run
        with pytest.raises(ChipBusy, match="this workbench's own worker, busy with a run"):
            WorkerPool().release_chip(str(tmp_path))
        assert ours.proc.poll() is None
    finally:
        backends.unregister_own_worker(ours.proc.pid)
        ours.proc.kill()
        ours.proc.wait()


def test_status_names_the_holder_and_counts_our_idle_worker_as_free(holders, monkeypatch):
    proc, pool, ours, stranger = holders
    monkeypatch.setattr(backends, "tpu_chips_on_pci", lambda *a: ["0000:00:04.0"])
    real = backends.tpu_holder_details
    monkeypatch.setattr(backends, "tpu_holder_details", lambda *a: real(str(proc)))
    monkeypatch.setattr(backends.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "libtpu" else None)
    st = backends.tpu_status()
    assert not st.available and set(st.holders) == {4343, stranger.pid}
    assert "my_train.py" in st.reason and ours.proc.pid not in st.holders

    for pid in (4343, stranger.pid):  # the others gone: only our idle worker holds the chip
        for link in (proc / str(pid) / "fd").iterdir():
            link.unlink()
    st = backends.tpu_status()
    assert st.available and str(ours.proc.pid) in st.reason and "idle" in st.reason
