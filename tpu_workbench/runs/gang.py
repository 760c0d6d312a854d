"""A gang: one run as N processes, started by ``torchrun`` and supervised from here.

A spec with a ``mesh`` and a plain-PyTorch (``torch_eager``) or TorchTPU mode runs as one
process per device of the mesh (:func:`is_gang`): ``torchrun --standalone --nproc_per_node=N
-m tpu_workbench.worker.gang JOB`` in a session of its own, gloo on a CPU (TorchTPU's
``tpu_dist`` on chips, only on a TPU). Each rank (:mod:`tpu_workbench.worker.gang`) writes its
records to a file of its own, which :class:`Gang` tails: rank 0's records stream to the
:class:`~tpu_workbench.runs.runner.Run` like a worker's, each ``step`` record with every rank's step
time (``rank_wall_ms``, in rank order, and ``slowest_rank``: stragglers show).

Supervision: any rank dying (a signal, an exception), the gang stalling (no rank writes anything
for ``TPU_WORKBENCH_GANG_STALL_S`` seconds, default :data:`STALL_S`) or the run's timeout ends
the whole gang: torchrun and every rank are killed (each rank sits in a session of its own,
torchrun's doing, so each is killed by pid; ranks also die with torchrun, ``PR_SET_PDEATHSIG``)
and the run fails with an error naming the rank: the one that died first, or the one behind the
others when the gang stalled. Records streamed so far are kept, as for any worker failure.

A :class:`Gang` stands in for a :class:`~tpu_workbench.runs.workers.Worker` (the same methods), one
per run: a gang is launched afresh each time and keeps no warm state.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import sharding
from ..errors import RunFailed, RunTimeout, SpecError, WorkerCrashed, WorkerError
from .spec import MODES, ExperimentSpec, RuntimeConfig

if TYPE_CHECKING:
    import pandas as pd

STALL_S = 120.0  # no record from any rank for this long (after all began training): a hang
STALL_ENV = "TPU_WORKBENCH_GANG_STALL_S"
START_S = 300.0  # imports and set-up before the first step, on a busy host
POLL_S = 0.05
PHASES = ("start", "forward", "backward", "optimizer", "end")  # worker.gang's progress marks


def is_gang(spec: ExperimentSpec) -> bool:
    """A spec that runs as a gang of processes: a mesh with a plain-PyTorch or TorchTPU mode
    (an XLA mode with a mesh runs SPMD in one process)."""
    return spec.mesh is not None and MODES[spec.mode].runtime.gang_device is not None


def gang_device(spec: ExperimentSpec) -> str:
    """``tpu`` (TorchTPU, ``tpu_dist``) for a TorchTPU mode, else ``cpu`` (gloo)."""
    return MODES[spec.mode].runtime.gang_device or "cpu"


def rank_entry(spec: ExperimentSpec, out_dir: Path) -> tuple[str, str, dict[str, Any]]:
    """(interpreter, module, job fields) each rank of `spec`'s gang runs: the workbench's own
    DTensor rank, or what the spec names (a TorchTitan run:
    :meth:`tpu_workbench.titan.spec.TitanSpec.gang_launch`)."""
    own = getattr(spec, "gang_launch", None)
    if own is not None:
        return own(out_dir)
    return MODES[spec.mode].runtime.python(), "tpu_workbench.worker.gang", {}


def _signal_text(code: int | None) -> str:
    if code is None:
        return "died (exit status unknown)"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class _Rank:
    def __init__(self, rank: int):
        self.rank = rank
        self.pid: int | None = None
        self.progress: tuple[int, int] = (-1, 0)  # (step, phase index)
        self.steps = 0
        self.error: dict[str, Any] | None = None
        self.done = False
        self.dead_at: float | None = None
        self.offset = 0
        self.partial = ""

    def where(self) -> str:
        step, phase = self.progress
        return "before step 0" if step < 0 else f"step {step} ({PHASES[phase]})"


class Gang:
    """One torchrun launch serving one run, with a Worker's methods (see the module doc)."""

    def __init__(self, config: RuntimeConfig):
        self.config = config
        self.info: dict[str, Any] = {}
        self.stderr_lines: collections.deque[str] = collections.deque(maxlen=200)
        self.runs_started = 0
        self.start_s = 0.0
        self.proc: subprocess.Popen | None = None
        self.stall_s = float(os.environ.get(STALL_ENV, STALL_S))
        self._current: Any = None
        self._lock = threading.Lock()
        self._ended = False  # an outcome went to the run
        self._stopping = ""  # why we kill the gang: "timeout", "cancel"
        self._note = ""  # death_message's text, naming the rank
        self.ranks: list[_Rank] = []
        self._pending: dict[int, dict[int, dict[str, Any]]] = {}  # step -> rank -> record

    # -- what a Run calls --------------------------------------------------------------------
    def reserve(self) -> None:
        """Nothing to wait for: every run gets a gang of its own."""

    def attach(self, run: Any) -> None:
        self._current = run

    def release(self) -> None:
        self._current = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def busy(self) -> bool:
        return self.alive

    def stderr_tail(self, n: int = 30) -> str:
        """The end of torchrun's output (the ranks' stdout and stderr too)."""
        return "\n".join(list(self.stderr_lines)[-n:])

    def death_message(self) -> str:
        return self._note or f"the gang of {len(self.ranks)} ranks (torchrun) ended"

    def send(self, message: dict[str, Any]) -> None:
        if message.get("op") == "run":
            self._launch(message)

    def interrupt(self) -> None:
        """Cancel: a gang cannot stop all its ranks at one step boundary, so it is ended."""
        self._stop("cancel")

    def kill(self) -> None:
        """Called by the run's timeout (or a cancel's grace): end the gang, naming the rank."""
        run = self._current
        self._stop("timeout" if run is not None and getattr(run, "_timed_out", False)
                   else "cancel")

    def stop(self, timeout: float = 10.0) -> None:
        self._kill_all()

    # -- launch --------------------------------------------------------------------------------
    def _launch(self, message: dict[str, Any]) -> None:
        from ..environment import torchtpu

        run = self._current  # the run's own spec: a subclass may name its own ranks
        spec = run.spec if run is not None else ExperimentSpec.from_dict(message["spec"])
        n = math.prod(spec.mesh)
        device = gang_device(spec)
        self.out_dir = Path(message["out_dir"])
        self.folder = Path(tempfile.mkdtemp(prefix="tpu_workbench_gang_"))
        python, module, extra = rank_entry(spec, self.out_dir)
        job = self.folder / "job.json"
        job.write_text(json.dumps({"spec": spec.to_dict(), "device": device,
                                   "out": str(self.folder), **extra}))
        self.log_file = self.folder / "torchrun.log"
        self.command = [python, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc_per_node={n}", "--max-restarts=0", "--monitor-interval=0.1",
                        "-m", module, str(job)]
        env = {**os.environ, **self.config.env(), "OMP_NUM_THREADS": "1"}
        for key in ("PJRT_DEVICE", "CPU_NUM_DEVICES", "XLA_FLAGS", "XLA_USE_SPMD"):
            env.pop(key, None)
        self.ranks = [_Rank(r) for r in range(n)]
        self.info = {"runtime": "torch_tpu" if device == "tpu" else "torch", "device": device,
                     "device_count": n, "processes": n, "launcher": "torchrun",
                     "dist_backend": torchtpu.DIST_BACKEND if device == "tpu" else "gloo",
                     "mesh": list(spec.mesh), "strategy": spec.strategy}
        self._t0 = time.monotonic()
        with open(self.log_file, "w") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        self.info["pid"] = self.proc.pid
        threading.Thread(target=self._monitor, daemon=True).start()

    # -- supervision ---------------------------------------------------------------------------
    def _monitor(self) -> None:
        last = time.monotonic()
        announced = False
        while True:
            if self._read():
                last = time.monotonic()
            if not announced and all(r.pid for r in self.ranks):
                announced = True
                self._emit({"kind": "gang", "launcher_pid": self.proc.pid,
                            "rank_pids": [r.pid for r in self.ranks],
                            "processes": len(self.ranks), "command": " ".join(self.command)})
            self._watch_pids()
            code = self.proc.poll()
            if code is not None:
                time.sleep(POLL_S)
                self._read()
                self._ended_with(code)
                return
            training = all(r.progress[0] >= 0 for r in self.ranks)
            limit = self.stall_s if training else max(self.stall_s, START_S)
            if time.monotonic() - last > limit:
                self._stall(limit)
                return
            time.sleep(POLL_S)

    def _read(self) -> bool:
        """Read what the ranks wrote since the last call; True if anything came."""
        got = False
        for r in self.ranks:
            path = self.folder / f"rank{r.rank}.jsonl"
            if not path.exists():
                continue
            with open(path) as fh:
                fh.seek(r.offset)
                text = fh.read()
                r.offset = fh.tell()
            if not text:
                continue
            got = True
            *lines, r.partial = (r.partial + text).split("\n")
            for line in lines:
                if line:
                    self._take(r, json.loads(line))
        return got

    def _take(self, r: _Rank, rec: dict[str, Any]) -> None:
        kind = rec.pop("kind")
        t = rec.pop("t", None)
        rank = rec.pop("rank")
        if kind == "hello":
            r.pid = rec["pid"]
        elif kind == "progress":
            r.progress = (rec["step"], PHASES.index(rec["phase"]))
        elif kind == "error":
            r.error = {**rec, "t": t}
        elif kind == "done":
            r.done = True
            if rank == 0:
                self.summary = rec["summary"]
        elif kind == "step":
            r.steps = rec["step"] + 1
            self._pending.setdefault(rec["step"], {})[rank] = rec
            self._flush_steps(complete_only=True)
        elif rank == 0:  # info, collective
            self._emit({"kind": kind, **rec})

    def _flush_steps(self, complete_only: bool) -> None:
        """One step record per step (rank 0's) once every rank reported it, with each rank's
        time; at the end of a failed gang also the steps some ranks never finished."""
        n = len(self.ranks)
        for step in sorted(self._pending):
            got = self._pending[step]
            if complete_only and len(got) < n:
                break
            if 0 not in got:
                del self._pending[step]
                continue
            times = [got[r]["wall_ms"] if r in got else None for r in range(n)]
            known = [(t, r) for r, t in enumerate(times) if t is not None]
            rec = {k: v for k, v in got[0].items() if k not in ("local_loss", "per_rank")}
            # a rank's own figures besides its time (``per_rank``: its memory) as lists
            for key in got[0].get("per_rank") or {}:
                rec[f"rank_{key}"] = [(got[r].get("per_rank") or {}).get(key) if r in got
                                      else None for r in range(n)]
            self._emit({"kind": "step", **rec, "rank_wall_ms": times,
                        "rank_loss": [got[r]["local_loss"] if r in got else None
                                      for r in range(n)],
                        "slowest_rank": max(known)[1]})
            del self._pending[step]

    def _watch_pids(self) -> None:
        import psutil

        now = time.time()
        for r in self.ranks:
            if r.pid is None or r.dead_at is not None:
                continue
            try:
                dead = psutil.Process(r.pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                dead = True
            if dead:
                r.dead_at = now  # wall-clock, as the ranks' own records

    def _emit(self, record: dict[str, Any]) -> None:
        if self._current is not None:
            self._current._handle({"type": "record", "data": record})

    def _deliver(self, message: dict[str, Any]) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._save_logs()
        run = self._current
        if run is not None:
            run._handle(message)

    def _save_logs(self) -> None:
        """The ranks' record files and torchrun's log go into the run's folder (``gang/``)."""
        with contextlib.suppress(OSError):
            self.stderr_lines.extend(self.log_file.read_text(errors="replace").splitlines())
            target = self.out_dir / "gang"
            target.mkdir(parents=True, exist_ok=True)
            for path in self.folder.glob("*"):
                if path.suffix in (".jsonl", ".log"):
                    shutil.copy(path, target / path.name)
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- outcomes ------------------------------------------------------------------------------
    def _ended_with(self, code: int) -> None:
        self._kill_all()  # torchrun is gone; a rank it failed to stop is not left behind
        self._flush_steps(complete_only=False)
        if self._stopping == "timeout":
            run = self._current
            self._note = f"the gang did not finish in time: {self._behind_text}"
            self._deliver({"type": "failed", "state": "timeout", "error": RunTimeout(
                f"run {self._run_id()} did not finish within {getattr(run, 'timeout', 0):g} s: "
                f"{self._behind_text}; torchrun and all {len(self.ranks)} ranks were killed")})
        elif self._stopping:
            self._deliver({"type": "cancelled"})
        elif code == 0 and self.ranks[0].done:
            self._deliver({"type": "done", "result": self.summary})
        else:
            self._deliver(self._failure(code))

    def _exit_codes(self) -> dict[int, int]:
        """Exit codes torchrun reported for its failed ranks (its ChildFailedError text)."""
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return {int(r): int(c) for r, c in re.findall(
            r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", text)}

    def _failure(self, code: int) -> dict[str, Any]:
        """The run's error: the rank that failed first. A rank that died without writing an
        error was killed (a signal, out of memory) and comes first: the others' errors are
        then its peers' lost connections."""
        n = len(self.ranks)
        codes = self._exit_codes()
        # torchrun reports the ranks that failed by themselves, not those it stopped (SIGTERM)
        silent = [r for r in self.ranks if not r.done and r.error is None]
        killed = [r for r in silent if r.rank in codes and codes[r.rank] != -signal.SIGTERM]
        errors = [r for r in self.ranks if r.error]
        if killed or silent and not errors:
            first = min(killed or silent,
                        key=lambda r: (r.dead_at is None, r.dead_at or 0, r.rank))
            how = _signal_text(codes.get(first.rank))
            self._note = (f"rank {first.rank} of {n} of the gang (pid {first.pid}) {how} at "
                          f"{first.where()}, after {first.steps} steps; torchrun (exit code "
                          f"{code}) and the other ranks were stopped")
            return {"type": "failed", "state": "crashed", "error": WorkerCrashed(
                f"run {self._run_id()} lost its gang: {self._note}")}
        if errors:
            first = min(errors, key=lambda r: (r.error["t"] or 0, r.rank))  # the first to raise
            e = first.error
            self._note = f"rank {first.rank} of {n} raised {e['etype']} at {first.where()}"
            return {"type": "failed", "state": "failed", "error": RunFailed(
                f"run {self._run_id()} failed: {self._note}: {e['message']}",
                remote_type=e["etype"], remote_traceback=e.get("traceback", ""))}
        self._note = f"torchrun {_signal_text(code)} before every rank finished"
        return {"type": "failed", "state": "crashed",
                "error": WorkerCrashed(f"run {self._run_id()} lost its gang: {self._note}")}

    def _behind(self) -> str:
        """Which ranks are behind the others, from their progress marks."""
        lowest = min(r.progress for r in self.ranks)
        behind = [r for r in self.ranks if r.progress == lowest]
        ahead = [r for r in self.ranks if r.progress != lowest]
        names = ", ".join(str(r.rank) for r in behind)
        many = len(behind) > 1
        text = (f"rank{'s' if many else ''} {names} {'are' if many else 'is'} behind, last seen "
                f"at {behind[0].where()}")
        if ahead:
            text += "; " + "; ".join(f"rank {r.rank} waits at {r.where()}" for r in ahead)
        else:
            text += " (every rank stopped there: none is ahead)"
        return text

    def _stall(self, limit: float) -> None:
        self._note = f"no rank of the gang wrote anything for {limit:g} s: {self._behind()}"
        self._kill_all()
        self._flush_steps(complete_only=False)
        self._deliver({"type": "failed", "state": "timeout", "error": RunTimeout(
            f"run {self._run_id()} stalled: {self._note}; torchrun and all "
            f"{len(self.ranks)} ranks were killed")})

    def _stop(self, why: str) -> None:
        """End the gang from another thread; the monitor, on seeing torchrun go, reports it."""
        self._behind_text = self._behind() if self.ranks else ""
        self._stopping = why
        self._kill_all()

    def _run_id(self) -> str:
        return getattr(self._current, "run_id", "")

    def _kill_all(self) -> None:
        """Kill torchrun and every rank (each in a session of its own), and wait for them."""
        import psutil

        if self.proc is None:
            return
        procs = []
        with contextlib.suppress(psutil.NoSuchProcess):
            launcher = psutil.Process(self.proc.pid)
            procs = [*launcher.children(recursive=True), launcher]
        for r in self.ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                if r.pid and all(p.pid != r.pid for p in procs):
                    procs.append(psutil.Process(r.pid))
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(procs, timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


# --------------------------------------------------------------------------------------------
# What came back: frames
# --------------------------------------------------------------------------------------------
def _records(result: Any) -> list[dict[str, Any]]:
    return list(result if isinstance(result, list) else result.records)


def collectives_frame(result: Any, chip: str = "v6e", mesh_shape: tuple[int, ...] | None = None,
                      per_call: bool = False) -> pd.DataFrame:
    """The collectives of one step of a gang, counted by ``CommDebugMode`` on rank 0, in the
    columns of :func:`tpu_workbench.sharding.collectives_frame` (so the sharding charts take
    either backend) plus ``module`` (the module path it ran in, ``""`` the root), ``phase``
    (forward / backward), ``count`` (identical collectives folded into one row) and ``step``.

    ``bytes`` is the collective's result on one rank (per call), ``buffer_bytes`` what the
    ring moves (a reduce-scatter's input), ``replica_groups`` every group of the mesh axis its
    group runs along (``axis``: ``data``, ``model``, ``all``), ``estimated_us`` the ICI time of
    one call with the ranks on the chips of a `chip` slice of their number
    (:func:`tpu_workbench.sharding.collective_time_us`, the model every view uses),
    ``source_op`` the c10d op, ``computation`` the phase. `result` is a RunResult or its
    records. ``per_call=True``: one row per call (``count`` 1), as the XLA frame has one per
    op, for charts that sum ``bytes``."""
    import pandas as pd

    records = _records(result)
    if mesh_shape is None:
        mesh_shape = tuple(getattr(getattr(result, "spec", None), "mesh", None) or ())
    mesh_shape = tuple(mesh_shape) or (1,)
    groups = sharding.mesh_groups(mesh_shape)
    topology = sharding.slice_topology(math.prod(mesh_shape), chip)
    rows: dict[tuple, dict[str, Any]] = {}
    for rec in records:
        if rec.get("kind") != "collective":
            continue
        group = sorted(rec.get("group") or range(math.prod(mesh_shape)))
        axis = sharding.group_axis([group], mesh_shape)
        key = (rec["collective"], rec["module"], rec["phase"], rec["bytes"], axis, rec["op"])
        row = rows.get(key)
        if row is None:
            n = len(group)
            buffer = rec["bytes"] * n if rec["collective"] == "reduce-scatter" else rec["bytes"]
            replica = groups.get(axis, [group])
            row = rows[key] = {
                "kind": rec["collective"], "name": f"{rec['module'] or '(root)'} {rec['op']}",
                "shape": rec.get("shape", []), "bytes": rec["bytes"], "buffer_bytes": buffer,
                "replica_groups": replica, "groups_text": str(replica), "group_size": n,
                "num_groups": len(replica), "axis": axis,
                "physical_axes": sharding.span_text(group, topology),
                "estimated_us": sharding.collective_time_us(rec["collective"], buffer, group,
                                                            topology, chip),
                "computation": rec["phase"], "source_op": rec["op"],
                "module": rec["module"], "phase": rec["phase"], "count": 0,
                "step": rec.get("step", 0)}
        row["count"] += 1
    columns = [*sharding.COLLECTIVE_COLUMNS, "module", "phase", "count", "step"]
    frame = pd.DataFrame(list(rows.values()), columns=columns)
    if per_call and len(frame):
        frame = frame.loc[frame.index.repeat(frame["count"])].assign(count=1)
    return frame.reset_index(drop=True)


# What a DTensor gang runs (fsdp_tp and ep run on torch_xla SPMD and in TPU compiles only).
GANG_STRATEGIES = ("dp", "fsdp", "tp", "dp_tp")


def mesh_for(strategy: str, processes: int) -> tuple[int, ...]:
    """The mesh a gang of `processes` gets for `strategy`: 1-D for dp and fsdp, ``(1, n)``
    for tp (every process on the model axis), ``(2, n/2)`` for dp_tp."""
    strategy = sharding.strategy_name(strategy)
    if strategy not in GANG_STRATEGIES:
        raise SpecError(f"strategy {strategy!r} runs on torch_xla SPMD and in TPU compiles "
                        f"only; a DTensor gang runs {', '.join(GANG_STRATEGIES)}")
    if strategy == "tp":
        return (1, processes)
    if strategy == "dp_tp":
        if processes % 2 or processes < 4:
            raise SpecError(f"dp_tp over {processes} processes needs an even number of at "
                            "least 4 (a 2 x n/2 mesh); use 4, 6, 8...")
        return (2, processes // 2)
    return (processes,)


def loss_comparison(gang_result: Any, one_result: Any) -> pd.DataFrame:
    """Per step: the gang's loss, one process's (the same spec without a mesh) and their
    relative difference (``rel_diff``)."""
    import pandas as pd

    a = gang_result.steps.set_index("step")["loss"]
    b = one_result.steps.set_index("step")["loss"]
    frame = pd.DataFrame({"gang": a, "one_process": b}).dropna().reset_index()
    frame["rel_diff"] = (frame["gang"] - frame["one_process"]).abs() / frame["one_process"].abs()
    return frame


def rank_frame(result: Any) -> pd.DataFrame:
    """Every rank's step time, one row per (step, rank): ``step``, ``rank``, ``wall_ms``,
    ``loss`` (that rank's batch slice), ``slowest`` (the step's slowest rank)."""
    import pandas as pd

    rows = []
    for rec in _records(result):
        if rec.get("kind") == "step" and "rank_wall_ms" in rec:
            for rank, ms in enumerate(rec["rank_wall_ms"]):
                rows.append({"step": rec["step"], "rank": rank, "wall_ms": ms,
                             "loss": (rec.get("rank_loss") or [None] * (rank + 1))[rank],
                             "slowest": rank == rec.get("slowest_rank")})
    return pd.DataFrame(rows, columns=["step", "rank", "wall_ms", "loss", "slowest"])


def gang_error_ranks(error: WorkerError) -> dict[str, Any]:
    """The launcher's and the ranks' pids of a failed gang run (from its ``gang`` record)."""
    for rec in error.records:
        if rec.get("kind") == "gang":
            return {"launcher_pid": rec["launcher_pid"], "rank_pids": rec["rank_pids"]}
    return {}
