"""The ``ray`` engine of :func:`tpu_workbench.scale.sweeps.sweep`: one Ray task per spec.

Ray places and supervises; the workbench's own worker process stays the unit of isolation. Each
task starts a worker on its node through :func:`tpu_workbench.runs.runner.submit` (the same runtime
config, the environment set before torch_xla is imported, the same message handling) and is a
streaming generator (``num_returns="streaming"``): it yields every record as the worker streams
it, then the run's summary, environment and artifact files. The driver writes the run's folder
in its own results folder with the runner's :func:`~tpu_workbench.runs.runner.save_run` (one rename,
never half-written), recording the node's host name and id in ``environment.json``.

One timed run per host: a run's step times are only its own if nothing else on the host competes
for its CPUs (each workbench worker uses a full thread pool), so every non-TPU run asks for the
whole of a custom resource, :data:`HOST_RESOURCE`, of which each node declares one. An embedded
Ray declares it itself; on a cluster start every node with ``ray start ... --resources=
'{"tpu_workbench_host": 1}'`` (a sweep refuses to start, saying so, when no node has it). A
custom resource rather than ``num_cpus=<the node's CPUs>``: nodes differ in size, and a task asks
for one amount everywhere. ``runs_per_host=k`` (opt-in) asks for 1/k of it, so k runs share a
host and their step times contend. A TPU run asks for all of its host's chips instead (a TPU
admits one process).

Faults: Ray's own task retries are off (they would splice a retried run's records onto the dead
attempt's); a task whose node or Ray worker dies is submitted again, at most `max_retries`
times (one lost before it began, placed on a node as it died, is placed again uncounted),
and a run that still cannot finish is saved as ``<run_id>-failed`` with the last attempt's
partial records. A retry starts again at step 0, and the dead attempt's records
have already been streamed: every record ``on_record`` gets carries ``attempt`` (1, 2, ...),
and only the last attempt's are saved. Every node needs this package installed (a ``pip
install`` of the workbench, as on the driver); importing this module imports ray.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import ray.exceptions

from .. import errors
from ..environment.paths import results_dir
from ..errors import RunCancelled, RunFailed, SpecError, WorkbenchError, WorkerCrashed
from ..runs.runner import DEFAULT_RUN_TIMEOUT_S, _new_run_id, save_run, submit
from ..runs.spec import ExperimentSpec, runtime_config
from ..runs.store import ENVIRONMENT_FILE, RunResult, artifacts
from ..runs.workers import WorkerPool, default_pool

PROBE_TIMEOUT_S = 3.0  # a cluster's GCS port answers at once; a wrong address must not hang
CLIENT_PORT = 10001  # ray://host without a port: Ray Client's default
# What the driver writes itself; every other file of a node's run folder is an artifact.
OWN_FILES = {ENVIRONMENT_FILE, "spec.json", "summary.json", "records.jsonl", "steps.csv"}
HOST_RESOURCE = "tpu_workbench_host"  # one per node: the right to time steps there


@dataclass
class Outcome:
    """What became of one spec: its result, or its error with the partial records."""

    spec: ExperimentSpec
    run_id: str
    state: str = "pending"  # done | failed | crashed | timeout | cancelled
    result: RunResult | None = None
    error: WorkbenchError | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    host: str = ""
    node_id: str = ""
    attempts: int = 0
    started: float | None = None  # the node's clock when the last attempt's task began
    ended: float | None = None  # ... and when its run ended (None: its node died first)


# -- connecting ------------------------------------------------------------------------------
def probe_address(address: str) -> None:
    """Raise a WorkbenchError naming `address` unless something listens there (within
    :data:`PROBE_TIMEOUT_S`): ``ray.init`` on a dead address retries for a minute or more."""
    if address == "auto":
        return  # Ray reads RAY_ADDRESS or the local cluster's file and says what it found
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host and address.startswith("ray://"):
        host, port = hostport, str(CLIENT_PORT)
    if not host or not port.isdigit():
        raise SpecError(f"Ray address {address!r} is not host:port (e.g. 10.0.0.2:6379), "
                        "ray://host:10001, 'auto' or None (an embedded local Ray)")
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise WorkbenchError(
            f"no Ray cluster answers at {address!r} ({exc.strerror or exc}); start one with "
            "`ray start --head` and pass its address (host:6379), or address=None for an "
            "embedded local Ray") from None


def connect(address: str | None, num_cpus: int | None = None) -> None:
    """Join the cluster at `address`, or start an embedded local Ray when it is None (kept for
    later sweeps, like a warm worker). An earlier connection elsewhere is closed first."""
    if address is not None:
        probe_address(address)
    if ray.is_initialized():
        current = ray.get_runtime_context().gcs_address
        if address is None or address in ("auto", current):
            return
        ray.shutdown()
    try:
        if address is None:
            ray.init(num_cpus=num_cpus or os.cpu_count(), resources={HOST_RESOURCE: 1},
                     include_dashboard=False, log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise WorkbenchError(
            f"could not connect to the Ray cluster at {address!r}: {exc}") from None


def resources(spec: ExperimentSpec, cpus_per_run: float, runs_per_host: int = 1,
              nodes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Ray resources of one run: a whole TPU host's chips for a TPU run (a TPU admits one
    process, so one run per host at a time); otherwise CPUs (and a GPU for a CUDA run) and
    1/`runs_per_host` of the node's :data:`HOST_RESOURCE`. `nodes`: ``ray.nodes()``."""
    device = runtime_config(spec).device
    alive = [n["Resources"] for n in (ray.nodes() if nodes is None else nodes) if n.get("Alive")]
    if device == "tpu":
        chips = [r["TPU"] for r in alive if r.get("TPU")]
        if not chips:
            raise WorkbenchError(f"spec {spec.model}/{spec.preset}/{spec.mode} needs a TPU, and "
                                 "no node of this Ray cluster advertises a TPU resource")
        return {"num_cpus": cpus_per_run, "resources": {"TPU": min(chips)}}
    if not any(r.get(HOST_RESOURCE, 0) >= 1 for r in alive):
        raise WorkbenchError(
            f"no node of this Ray cluster declares the {HOST_RESOURCE!r} resource that keeps "
            "timed runs apart (one per host); start every node with `ray start ... --resources="
            f"'{{\"{HOST_RESOURCE}\": 1}}'` (an embedded Ray, address=None, declares it itself)")
    share = {HOST_RESOURCE: int(10_000 / runs_per_host) / 10_000}  # Ray's 1/10000ths, down
    if device == "cuda":
        return {"num_cpus": cpus_per_run, "num_gpus": 1, "resources": share}
    return {"num_cpus": cpus_per_run, "resources": share}


UNSTARTED_RETRIES = 3  # placements lost before the task began, on top of max_retries
UNSTARTED_BACKOFF_S = 1.0  # about Ray's time to mark a dead node (its health checks)


# -- on the node -----------------------------------------------------------------------------
@ray.remote(num_returns="streaming", max_retries=0)
def _run_on_node(spec_dict: dict[str, Any], cold: bool, timeout: float):
    """Run one spec in a workbench worker on this node; yield its messages as they come."""
    context = ray.get_runtime_context()
    # Node-clock times bound the run inside the task's hold on the host's resource.
    yield {"type": "start", "host": socket.gethostname(), "node_id": context.get_node_id(),
           "t": time.time()}
    spec = ExperimentSpec.from_dict(spec_dict)
    tmp = Path(tempfile.mkdtemp(prefix="tpu_workbench_ray_"))
    # Warm by default: this Ray worker process keeps its workbench worker (and compile cache)
    # for the next task it is given, as the local pool does.
    pool = WorkerPool(max_workers=1) if cold else default_pool()
    # Spawned before submit() validates the spec (which imports torch here, ~3 s): the worker's
    # own imports overlap that one instead of following it.
    pool.start(runtime_config(spec))
    try:
        try:
            run = submit(spec, pool=pool, out_dir=tmp, timeout=timeout)
            for record in run:
                yield {"type": "record", "data": record}
            result = run.result()
        except WorkbenchError as exc:  # the run failed, or this node cannot run the spec
            yield {"type": "failed", "etype": type(exc).__name__, "message": str(exc),
                   "stderr_tail": getattr(exc, "stderr_tail", ""), "t": time.time()}
            return
        assert result.out_dir is not None
        environment = json.loads((result.out_dir / ENVIRONMENT_FILE).read_text())
        files = {rel: Path(path).read_bytes() for rel, path in result.artifacts.items()
                 if rel not in OWN_FILES}
        yield {"type": "done", "summary": result.summary, "environment": environment,
               "files": files, "t": time.time()}
    finally:
        if cold:
            pool.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


# -- on the driver ---------------------------------------------------------------------------
def _infrastructure(exc: BaseException) -> bool:
    """A node or Ray worker died under the task (worth a retry), not the task's own error."""
    return isinstance(exc, ray.exceptions.RayError) and not isinstance(
        exc, ray.exceptions.RayTaskError | ray.exceptions.TaskCancelledError)


class _Driver:
    """Submits every spec, follows each task's stream in a thread of its own, retries."""

    def __init__(self, specs: Sequence[ExperimentSpec], on_record, on_end, on_start,
                 max_retries: int, cold: bool, timeout: float, cpus_per_run: float,
                 runs_per_host: int = 1):
        self.outcomes = [Outcome(s, _new_run_id(s, "train")) for s in specs]
        nodes = ray.nodes()
        # Checked before any task: a TPU, or the host resource, that no node has fails here.
        self.options = [resources(s, cpus_per_run, runs_per_host, nodes) for s in specs]
        self.runs_per_host = runs_per_host
        self.on_record, self.on_end, self.on_start = on_record, on_end, on_start
        self.max_retries, self.cold, self.timeout = max_retries, cold, timeout
        self.root = results_dir()
        self.lock = threading.Lock()
        # Followers queue what the callbacks get; the caller's thread calls them (a marimo
        # cell's output or a tqdm bar belongs to the thread that runs the sweep).
        self.events: queue.Queue[tuple[Callable[..., None], tuple[Any, ...]]] = queue.Queue()
        self.cancelling = False
        self.tasks: dict[int, Any] = {}

    def follow(self, i: int) -> None:
        out = self.outcomes[i]
        unstarted = 0  # tasks lost before they began (placed on a node as it died)
        while True:
            out.attempts += 1
            out.records, out.started, out.ended = [], None, None
            with self.lock:
                if self.cancelling:
                    break
                task = _run_on_node.options(**self.options[i]).remote(
                    out.spec.to_dict(), self.cold, self.timeout)
                self.tasks[i] = task
            try:
                for ref in task:
                    self.handle(out, ray.get(ref))
                break
            except Exception as exc:  # any failure becomes the run's error
                if out.state != "pending":  # done (saved whole) or failed: the task died after
                    break  # its last message, while cleaning up; running it again would redo it
                if isinstance(exc, ray.exceptions.TaskCancelledError):
                    out.state = "cancelled"
                    out.error = RunCancelled(f"run {out.run_id} was cancelled")
                    break
                if _infrastructure(exc) and out.started is None and not self.cancelling \
                        and unstarted < UNSTARTED_RETRIES:
                    # Ray placed it on a node that died before the task began: not an attempt
                    # of the run; wait for Ray to mark the node dead before placing it again.
                    unstarted += 1
                    out.attempts -= 1
                    time.sleep(UNSTARTED_BACKOFF_S)
                    continue
                if _infrastructure(exc) and out.attempts <= self.max_retries \
                        and not self.cancelling:
                    continue  # the node (or its Ray worker) died: run it again elsewhere
                out.state, out.error = "crashed", WorkerCrashed(
                    f"run {out.run_id} lost its Ray task after {out.attempts} attempt(s) on "
                    f"node {out.node_id or '?'} ({out.host or '?'}): {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}")
                break
        if out.state == "pending" and self.cancelling:  # cancelled before it was submitted
            out.state, out.error = "cancelled", RunCancelled(f"run {out.run_id} was cancelled")
        elif out.state == "pending":
            out.state, out.error = "crashed", WorkerCrashed(
                f"run {out.run_id}'s Ray task on node {out.node_id or '?'} ended without a result")
        if out.error is not None:
            out.error.records = list(out.records)
            self.save_failed(out)
        if self.on_end is not None:
            self.events.put((self.on_end, (out,)))

    def handle(self, out: Outcome, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "start":
            out.host, out.node_id, out.started = message["host"], message["node_id"], message["t"]
            if self.on_start is not None:  # each attempt, on the node it was placed on; a copy,
                # as the caller's thread may get to it after a retry changed `out`
                self.events.put((self.on_start, (dataclasses.replace(out, records=[]),)))
        elif kind == "record":
            out.records.append(message["data"])  # the saved record: without `attempt`
            if self.on_record is not None:  # a dead attempt's records were streamed already
                self.events.put((self.on_record, ({**message["data"], "attempt": out.attempts},
                                                  out.spec)))
            return
        out.ended = message.get("t")
        if kind == "failed":
            # e.g. a SpecError (the node could not load the model) fails as RunFailed
            cls = errors.WORKER_ERRORS.get(message["etype"], RunFailed)
            out.state = errors.error_state(message["etype"])
            out.error = cls(message["message"], stderr_tail=message["stderr_tail"])
        elif kind == "done":
            self.save_done(out, message)

    def save_done(self, out: Outcome, message: dict[str, Any]) -> None:
        partial = self.root / f"{out.run_id}.partial"
        final = self.root / out.run_id
        environment = {**message["environment"], "engine": "ray", "attempts": out.attempts,
                       "node": {"host": out.host, "node_id": out.node_id},
                       "runs_per_host": self.runs_per_host}
        for rel, data in message["files"].items():  # the worker's artifacts (HLO, traces...)
            path = partial / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        save_run(partial, final, out.spec, out.records, message["summary"], environment)
        out.state = "done"
        out.result = RunResult(
            out.spec, out.run_id, environment.get("runtime") or {}, out.records,
            message["summary"], final, float(environment.get("wall_s") or 0.0),
            artifacts=artifacts(final), measured_at=str(environment.get("measured_at", "")),
            worker_start_s=float(environment.get("worker_start_s") or 0.0),
            fingerprint=environment.get("fingerprint") or {})

    def save_failed(self, out: Outcome) -> None:
        target = self.root / f"{out.run_id}-failed"
        summary = {"error": str(out.error), "attempts": out.attempts,
                   "node": {"host": out.host, "node_id": out.node_id}}
        with contextlib.suppress(OSError):  # a full disk must not hide the run's own outcome
            save_run(self.root / f"{out.run_id}.partial", target, out.spec, out.records, summary)

    def cancel(self) -> None:
        """Cancel every task not finished yet; what completed stays on disk."""
        with self.lock:
            self.cancelling = True
            tasks = list(self.tasks.values())
        for task in tasks:
            ray.cancel(task)


def run_specs(specs: Sequence[ExperimentSpec],
              on_record: Callable[[dict[str, Any], ExperimentSpec], None] | None = None,
              on_end: Callable[[Outcome], None] | None = None,
              on_start: Callable[[Outcome], None] | None = None, *, max_retries: int = 1,
              cold: bool = False, timeout: float | None = None, cpus_per_run: float = 1,
              runs_per_host: int = 1, stop: threading.Event | None = None) -> list[Outcome]:
    """Run every spec as a Ray task on the connected cluster (see :func:`connect`), at most
    `runs_per_host` at a time on a node; return one :class:`Outcome` per spec, in order.
    Setting `stop` (or interrupting the caller) cancels the tasks still running; runs that
    completed are kept."""
    driver = _Driver(specs, on_record, on_end, on_start, max_retries, cold,
                     timeout or DEFAULT_RUN_TIMEOUT_S, cpus_per_run, runs_per_host)
    threads = [threading.Thread(target=driver.follow, args=(i,), daemon=True)
               for i in range(len(specs))]
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads) or not driver.events.empty():
            try:
                callback, args = driver.events.get(timeout=0.2)
                callback(*args)
            except queue.Empty:
                pass
            if stop is not None and stop.is_set() and not driver.cancelling:
                driver.cancel()
    except BaseException:  # an interrupted cell or a failing callback: cancel the tasks too
        driver.cancel()
        for thread in threads:
            thread.join()
        raise
    return driver.outcomes
