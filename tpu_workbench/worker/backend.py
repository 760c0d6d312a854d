"""What every runtime's Backend object has, and the parts of a training step they share.

A :class:`Backend` is one runtime inside a worker (torch_xla, plain PyTorch, TorchTPU). Its
methods read in the order a run calls them (:func:`tpu_workbench.worker.train.train`): describe
the runtime, set the model and step up, place the batches, start counting, wait for each step,
count what it compiled and what ran outside the compiler, then report memory and caches.
"""

from __future__ import annotations

import contextlib
import logging
import re
import resource
import sys
import traceback
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..environment.runtimes import Runtime
from ..runs.spec import ExperimentSpec

Batch = dict[str, torch.Tensor]
Step = Callable[[Batch], torch.Tensor]


class ChangeHooks:
    """The in-step part of ``spec.change`` ("item", "keep_tensor", "dtype"), switched on at
    change_at."""

    def __init__(self, change: str | None):
        self.change = change
        self.active = False
        self.kept: list[torch.Tensor] = []
        self.device_type = "cpu"

    def forward_context(self) -> Any:
        if self.active and self.change == "dtype":
            return torch.autocast(self.device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def after_loss(self, loss: torch.Tensor) -> None:
        if not self.active:
            return
        if self.change == "item":
            loss.item()  # reading a value mid-step forces XLA to run what was traced so far
        elif self.change == "keep_tensor":
            self.kept[:] = [loss.detach() * 2]  # one more live tensor: a new graph output


def make_step(family: Any, model: torch.nn.Module, opt: torch.optim.Optimizer,
              hooks: ChangeHooks) -> Step:
    """One training step: zero the grads, forward (under the change hooks), backward, update."""

    def train_step(batch: Batch) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with hooks.forward_context():
            loss = family.loss(model, batch)
        hooks.after_loss(loss)
        loss.backward()
        opt.step()
        return loss

    return train_step


def optimizer_state(optimizer: str, p: torch.Tensor,
                    zeros: Callable[[tuple[int, ...], tuple[int, ...]], torch.Tensor]
                    ) -> dict[str, Any]:
    """The state `optimizer` keeps for weight `p`, as its first step would make it;
    ``zeros(shape, dims)`` makes each tensor, `dims` the dims of `p` it keeps (a factored
    moment drops one). AdamW: two moments of `p`'s shape. Adafactor (transformers'): for a
    matrix one value per row and one per column, else one per weight; no first moment."""
    shape = tuple(p.shape)
    every = tuple(range(len(shape)))
    if optimizer == "adamw":
        return {"step": torch.tensor(0.0), "exp_avg": zeros(shape, every),
                "exp_avg_sq": zeros(shape, every)}
    if len(shape) >= 2:
        rows, cols = every[:-1], every[:-2] + every[-1:]
        return {"step": 0, "RMS": 0,
                "exp_avg_sq_row": zeros(tuple(shape[d] for d in rows), rows),
                "exp_avg_sq_col": zeros(tuple(shape[d] for d in cols), cols)}
    return {"step": 0, "RMS": 0, "exp_avg_sq": zeros(shape, every)}


def init_optimizer_state(opt: torch.optim.Optimizer, optimizer: str = "adamw") -> None:
    """Create the optimizer's state up front, as its first step would, so step 0 and step 1
    trace the same graph (otherwise the state appearing at step 1 is a second XLA
    compilation)."""
    for group in opt.param_groups:
        for p in group["params"]:
            if p.requires_grad and not opt.state[p]:
                opt.state[p] = optimizer_state(
                    optimizer, p, lambda shape, _dims, p=p: p.new_zeros(shape))


def new_optimizer(optimizer: str, params: Any, lr: float) -> torch.optim.Optimizer:
    """`optimizer` (:data:`tpu_workbench.runs.spec.OPTIMIZERS`) over `params`: AdamW with one
    simple loop per parameter (``foreach=False``: the same program on every backend), or
    transformers' Adafactor at the fixed rate `lr` (``relative_step=False``,
    ``scale_parameter=False``: no host read of a weight's norm in the step)."""
    if optimizer == "adafactor":
        return _adafactor()(params, lr=lr, relative_step=False, scale_parameter=False,
                         warmup_init=False)
    return torch.optim.AdamW(params, lr=lr, foreach=False)


def _adafactor() -> type[torch.optim.Optimizer]:
    """transformers' Adafactor, imported without pulling in torch_xla.

    ``transformers.optimization`` imports the Trainer's helpers, which import torch_xla whenever
    it is installed. In a process that has not (plain PyTorch's worker) that starts torch_xla in
    the wrong environment, and autograd's backward then fails an internal assert. There
    transformers is told torch_xla is unavailable, as it documents (``USE_TORCH_XLA``);
    Adafactor itself never uses it. (The same guard as diffusers' in ``models.unet``.)
    """
    if "torch_xla" not in sys.modules and "transformers.optimization" not in sys.modules:
        import transformers.utils.import_utils as import_utils

        import_utils.USE_TORCH_XLA = "0"
    from transformers.optimization import Adafactor

    return Adafactor


def make_optimizer(spec: ExperimentSpec, family: Any,
                   model: torch.nn.Module) -> torch.optim.Optimizer:
    opt = new_optimizer(spec.optimizer, model.parameters(), spec.lr or family.default_lr)
    init_optimizer_state(opt, spec.optimizer)
    return opt


class NoCounters:
    """A runtime that compiles nothing (plain PyTorch eager)."""

    def delta(self) -> dict[str, float]:
        return {"compiles": 0, "cached": 0, "compile_ms": 0.0, "executions": 0}


def _where(frame: Any) -> str:
    """``path:line in function`` of a traceback frame, the path cut after ``site-packages/``
    (``transformers/models/llama/modeling_llama.py``) or made relative to the working folder."""
    path = str(frame.filename)
    if "site-packages/" in path:
        path = path.rsplit("site-packages/", 1)[1]
    else:
        with contextlib.suppress(ValueError):
            path = str(Path(path).resolve().relative_to(Path.cwd()))
    return f"{path}:{frame.lineno} in {frame.name}"


# What Dynamo logs (torch 2.9, symbolic_convert.py) when it gives up on a whole function: the
# break on the graph_breaks artifact logger (a repeat of a place in a short form that says as
# much), then the skip, naming the frame at the line where the loop broke.
_BREAK_AT = re.compile(r"in user code at (.+?):(\d+)\nGraph Break Reason: (.*?)"
                       r"(?:\nUser code traceback:|$)", re.S)
_TRACE_LINE = re.compile(r'File "(.+?)", line (\d+), in (\S+)')
_LOOP_SKIP = "Skipping frame because there is a graph break in a for/while loop"
_FRAME = re.compile(r"<FrameSummary file (.+), line (\d+) in (\S+)>")


class SkippedFrames(logging.Filter):
    """Functions Dynamo gave up on. A graph break inside a for/while loop cannot be resumed, so
    Dynamo skips the whole frame, which runs uncompiled (a counting backend gets no graph) on
    this call and every later one. No partial graph is compiled, so the break never reaches
    ``graph_break_reasons``: Dynamo only logs it, and this filter on its two loggers reads the
    break (reason, place) and the skip. One per process (:func:`skipped_frames`); a record passes
    on only where the logger's level before this lowered it let it through (``TORCH_LOGS``), so
    nothing new is printed."""

    LOGGERS = {"torch._dynamo.symbolic_convert.__graph_breaks": logging.DEBUG,
               "torch._dynamo.symbolic_convert": logging.INFO}

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, Any, Any]] = []  # (reason, break's frame, skipped frame)
        self.codes: list[weakref.ref] = []  # the skipped code objects, for :meth:`retrace`
        self.floors: dict[str, int] = {}
        self.names: dict[tuple[str, int], str] = {}  # (file, line) -> function, from full traces
        self.last_break: tuple[str, int, str] | None = None

    def install(self) -> None:
        """Filter the loggers and lower their levels so the records are made (again, in case
        ``torch._logging.set_logs`` reset them since)."""
        for name, level in self.LOGGERS.items():
            log = logging.getLogger(name)
            if self not in log.filters:
                self.floors[name] = log.getEffectiveLevel()
                log.addFilter(self)
            if log.getEffectiveLevel() > level:
                log.setLevel(level)

    def filter(self, record: logging.LogRecord) -> bool:
        with contextlib.suppress(Exception):  # reading a log must never fail Dynamo's trace
            self._read(record.getMessage())
        return record.levelno >= self.floors.get(record.name, logging.WARNING)

    def _read(self, msg: str) -> None:
        if match := _BREAK_AT.search(msg):
            for f in _TRACE_LINE.finditer(msg):  # a repeated place is logged without its trace
                self.names[(f[1], int(f[2]))] = f[3]
            self.last_break = (match[1], int(match[2]), match[3])
        elif msg.startswith(_LOOP_SKIP) and (f := _FRAME.search(msg)):
            frame = traceback.FrameSummary(f[1], int(f[2]), f[3])
            file, line, reason = self.last_break or (frame.filename, frame.lineno, "")
            name = self.names.get((file, line), frame.name if file == frame.filename else "?")
            self.events.append((reason, traceback.FrameSummary(file, line, name), frame))
            self.last_break = None
            self._keep_code(frame)

    def _keep_code(self, frame: Any) -> None:
        from torch._dynamo.convert_frame import input_codes  # every code Dynamo was handed

        for ref in reversed(input_codes.seen):
            code = ref()
            if (code is not None and (code.co_filename, code.co_name) == (frame.filename,
                                                                           frame.name)
                    and any(line == frame.lineno for *_, line in code.co_lines())):
                if all(kept() is not code for kept in self.codes):
                    self.codes.append(weakref.ref(code))
                return

    def retrace(self) -> None:
        """Let Dynamo trace the skipped functions again. It marks a skipped code object to run
        uncompiled for the rest of the process, so a warm worker's next run of the same model
        would skip it without a word; traced again, it is skipped and logged as in a cold one."""
        from torch._dynamo.eval_frame import remove_from_cache

        for ref in self.codes:
            if (code := ref()) is not None:
                remove_from_cache(code)


_SKIPPED: SkippedFrames | None = None


def skipped_frames() -> SkippedFrames:
    """This process's :class:`SkippedFrames`, installed."""
    global _SKIPPED
    if _SKIPPED is None:
        _SKIPPED = SkippedFrames()
    _SKIPPED.install()
    return _SKIPPED


class GraphBreaks:
    """The graph breaks Dynamo made while tracing (torch.compile, any backend): the list
    ``torch._dynamo.utils.graph_break_reasons`` that ``torch._dynamo.explain`` reads too, so
    nothing runs twice, and the functions it skipped whole (:class:`SkippedFrames`). Dynamo
    breaks while it traces (step 0, or a step that recompiled), not on every call."""

    def __init__(self) -> None:
        from torch._dynamo.utils import graph_break_reasons

        self.reasons = graph_break_reasons
        self.seen = len(graph_break_reasons)
        self.skips = skipped_frames()
        self.skips.retrace()
        self.skips_seen = len(self.skips.events)

    def new(self, step: int) -> list[dict[str, Any]]:
        """One ``kind="graph_break"`` record per (reason, place, skipped frame) Dynamo added
        since the last call: ``reason`` (its first line), ``detail`` (its explanation),
        ``where``, ``line`` (the source), ``skipped_frame`` (``where`` of the function Dynamo
        gave up on, at the line it stopped; "" for a break it compiled around), ``count``."""
        if len(self.reasons) < self.seen:  # torch._dynamo.reset() cleared the list
            self.seen = 0
        fresh, self.seen = self.reasons[self.seen:], len(self.reasons)
        skips, self.skips_seen = self.skips.events[self.skips_seen:], len(self.skips.events)
        out: dict[tuple[str, str, str], dict[str, Any]] = {}
        for reason, frame, skipped in [(r.reason, r.user_stack[-1] if r.user_stack else None,
                                        None) for r in fresh] + skips:
            lines = [ln.strip() for ln in str(reason).splitlines() if ln.strip()]
            where = _where(frame) if frame is not None else ""
            skipped_at = _where(skipped) if skipped is not None else ""
            record = out.setdefault((lines[0] if lines else "", where, skipped_at), {
                "kind": "graph_break", "step": step, "reason": lines[0] if lines else "",
                "detail": next((ln.removeprefix("Explanation:").strip() for ln in lines
                                if ln.startswith("Explanation:")), ""),
                "where": where, "line": (frame.line or "").strip() if frame else "",
                "skipped_frame": skipped_at, "count": 0})
            record["count"] += 1
        return list(out.values())


class Backend:
    """One runtime in a worker. Subclasses set ``runtime`` and implement :meth:`runtime_info`
    and :meth:`setup`; the rest has defaults for a runtime without compilations."""

    runtime: ClassVar[Runtime]

    def __init__(self) -> None:
        self.device: torch.device = torch.device("cpu")
        self.counters: Any = NoCounters()
        self.capture: Any = None  # capture="hlo": what collects the compiled programs
        self.breaks: GraphBreaks | None = None  # torch.compile modes: Dynamo's graph breaks

    def runtime_info(self) -> dict[str, Any]:
        """The runtime and the devices it sees (the worker's ``ready`` message)."""
        raise NotImplementedError

    def setup(self, spec: ExperimentSpec, family: Any, model: torch.nn.Module,
              hooks: ChangeHooks) -> Step:
        """Put the model on the device, make its optimizer, and return the step of the mode."""
        raise NotImplementedError

    def place(self, batch: Batch) -> Batch:
        """A batch on the device (under SPMD also laid out over the mesh)."""
        return {k: v.to(self.device) for k, v in batch.items()}

    def chips(self) -> list[int]:
        """The host's devices the run's steps use, by index (the chips whose metrics the run
        reports): its one device."""
        return [self.device.index or 0]

    def layout_records(self, model: torch.nn.Module, batch: Batch) -> list[dict[str, Any]]:
        """What each device holds of each tensor (SPMD runs only)."""
        return []

    def wait(self, loss: torch.Tensor | None = None) -> None:
        """Block until the device has finished everything queued (the step that made `loss`).
        The step's clock stops when this returns, so it must not return early: where a
        runtime's own wait is in doubt, end with a device-to-host read of `loss`."""

    def wait_marks(self, t0: float) -> dict[str, float]:
        """Times inside the last :meth:`wait`, in ms since `t0` (``time.perf_counter()``), for
        the step record: TorchTPU's ``sync_ms``. Empty where the wait is one call."""
        return {}

    def start_counting(self) -> None:
        """Start counting compilations from here: moving data is not part of a step."""
        self.wait()
        self.counters.delta()
        if self.breaks is not None:
            self.breaks.new(-1)

    def step_counts(self) -> dict[str, float]:
        """Compilations, cache hits, compile ms and executions since the last call."""
        return self.counters.delta()

    def step_fallbacks(self, step: int) -> tuple[dict[str, int], list[dict[str, Any]]]:
        """What of `step` did not compile, read after its timing ended: the step record's
        totals (``graph_breaks`` where Dynamo traces; XLA also ``fallbacks``) and one record
        per graph break (:class:`GraphBreaks`) or op that ran outside the compiler."""
        if self.breaks is None:
            return {}, []
        records = self.breaks.new(step)
        return {"graph_breaks": sum(r["count"] for r in records)}, records

    def compile_records(self, step: int, counts: dict[str, float],
                        trigger: str) -> list[dict[str, Any]]:
        """One ``kind="compile"`` record per compilation of `step` (XLA only)."""
        return []

    def evaluation_device(self) -> torch.device:
        """Where the trained model is evaluated on the held-out batch (in eager PyTorch)."""
        return self.device

    def after_evaluation(self) -> None:
        """The evaluation compiled a graph of its own: not a training step's compile."""

    def profiler(self, folder: Path) -> Any:
        """A profiler with ``start()``, ``step(n)`` (a context) and ``stop()``, writing under
        `folder`."""
        raise NotImplementedError

    def hlo_capture(self) -> Any:
        """What collects the run's compiled programs (``collect(folder)``), for capture="hlo"."""
        raise RuntimeError(f"capture='hlo' is not offered by the {self.runtime} runtime")

    def memory_info(self) -> dict[str, Any]:
        """What the backend says about memory, labelled by source (at least this worker's peak
        RSS: XLA:CPU's "device memory" is host memory)."""
        return {"worker_peak_rss_bytes":
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    def cache_info(self, runs_before: int) -> dict[str, Any]:
        """The compilation caches as this run saw them (``worker_runs_before`` 0: cold)."""
        return {"worker_runs_before": runs_before}


# runtime -> (module of this package, Backend class): imported only when a worker needs it
BACKENDS = {"xla": ("xla", "XLABackend"), "torch": ("pytorch", "TorchBackend"),
            "torch_tpu": ("torchtpu", "TorchTPUBackend")}


def backend_for(runtime: str) -> Backend:
    """A fresh Backend of `runtime` (a key of :data:`BACKENDS`)."""
    import importlib

    module, name = BACKENDS[runtime]
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)()
