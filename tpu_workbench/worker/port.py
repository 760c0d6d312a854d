"""The ``port`` tasks: what stands between a model and the TPU, measured on XLA:CPU.

One **pass** runs ``spec.steps`` training steps of the spec's model in torch_xla's lazy mode,
each timed after the device finished and counted: torch_xla's metrics (compilations, graph
executions, transfers each way, CPU fallback ops) and the programs it ran (the graph hashes of
its execution analysis: a program first run after step 0 is one a fresh process compiles there,
whatever this warm worker had compiled before). Its first :data:`WATCH_STEPS` steps are also
metered, each count charged to the line of the model's code that caused it (the innermost frame
outside torch, torch_xla, the standard library and this package):

- **torch_xla's execution analysis**: the worker runs with ``PT_XLA_DEBUG_LEVEL=2`` (see
  :class:`tpu_workbench.runs.spec.RuntimeConfig`), so torch_xla writes every graph execution's
  cause and the Python frames that triggered it; an execution "most likely user code trying to
  access tensor value" at a line of the model's is where the step was cut to read a value;
- :class:`LineMeter`: torch_xla's own counters (executions, compilations, transfers each way)
  between two lines of the model's code, charged to the line that ran; this also counts a read
  of a tensor already on the device (a transfer, no execution) and tells a read in the step from
  one in a step closure (after the step's program).

Then one more step, unmeasured, under :class:`Watch` (a ``TorchDispatchMode``; it changes the
graph torch_xla traces, so it never runs in a measured step): the ops each line dispatched:
data-dependent shapes (``nonzero``, ``unique``, ``masked_select``, a boolean-mask index),
tensors copied in from the CPU, float64 results, and whether the line asked for a value on the
host (a CPU copy of an XLA tensor, ``_local_scalar_dense``), which tells a host read from a CPU
fallback op (that executes and transfers too). A read of a tensor already on the CPU asks
nothing of the device and moves no counter.

Tasks: ``port`` (the model as written: variant ``"as written"``, one pass, then Dynamo:
``torch.compile(backend="openxla")``, ``torch._dynamo.explain``'s graph breaks with their lines,
a crash kept with its line), ``port_edited`` (a copy of the model's file that
:mod:`tpu_workbench.porting.patch` edited: variant ``"edited"``, one pass) and
``port_edited_dynamo`` (the same, then Dynamo).

Records: ``port_step`` (variant, step, watched (metered), step_s, loss, compiles, executions,
programs, new_programs, to_device, from_device, fallbacks, fallback_ops, shapes), ``port_line``
(variant, file, line, code, phase "step" or "after", and per step: executions, reads
(executions torch_xla blames on a value read), compiles, from_device, to_device; asks (in the
watched step)), ``port_event`` (variant, event, op, file, line, code, calls_per_step) and
``port_dynamo`` (event, reason, file, line, code). Which of these are blockers, and their
fixes, is :mod:`tpu_workbench.porting`'s business.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import statistics
import sys
import sysconfig
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .. import models
from ..runs.spec import ExperimentSpec
from .backend import make_optimizer
from .recompiles import parse_execution_analysis

WATCH_STEPS = 2
DATA_DEPENDENT = {"nonzero", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
                  "masked_select", "argwhere", "nonzero_static_"}
# torch_xla's cause for an execution that reads a value in the middle of a step
READ_CAUSE = "access tensor value"
_LIBRARY = (f"{os.sep}torch{os.sep}", f"{os.sep}torch_xla{os.sep}",
            f"{os.sep}tpu_workbench{os.sep}worker{os.sep}", f"{os.sep}contextlib.py",
            f"{os.sep}_dynamo{os.sep}", "<frozen")
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_USER: dict[str, bool] = {}


def is_user(file: str) -> bool:
    """Whether `file` holds the model's code: not torch, torch_xla, the standard library, this
    package or a string (a lambda's ``<string>``)."""
    known = _USER.get(file)
    if known is None:
        known = _USER[file] = bool(file) and not file.startswith("<") and not any(
            part in file for part in _LIBRARY) and not file.startswith(_STDLIB)
    return known


def user_frame(skip: int = 2) -> tuple[str, int]:
    """(file, line) of the innermost frame of the model's code (:func:`is_user`)."""
    try:
        frame: Any = sys._getframe(skip)
    except ValueError:  # called from C++ with less Python above (the autograd engine)
        return "", 0
    while frame is not None:
        if is_user(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return "", 0


def code_at(file: str, line: int) -> str:
    return linecache.getline(file, line).strip() if file else ""


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


class Watch(TorchDispatchMode):
    """Counts, per (event, op, file, line), the ops that block a TPU port (see the module), and
    the lines that ask for a value of an XLA tensor on the host (``asks``)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: Counter[tuple[str, str, str, int]] = Counter()
        self.ops: dict[str, Counter[tuple[str, int]]] = {}  # op -> lines that called it
        self.asks: Counter[tuple[str, int]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op = func.overloadpacket.__name__
        file, line = user_frame()
        self.ops.setdefault(op, Counter())[file, line] += 1
        ins, outs = _tensors((args, kwargs)), _tensors(out)
        on_xla = any(t.device.type == "xla" for t in ins)
        if on_xla and (op == "_local_scalar_dense" or any(t.device.type == "cpu" for t in outs)):
            self.asks[file, line] += 1  # .item(), float(), .cpu(), .tolist(), print, if t:
            return out
        event = ""
        if op in DATA_DEPENDENT or (op == "index" and any(
                t is not None and t.dtype == torch.bool for t in _tensors(args[1:]))):
            event = "data_dependent"
        elif any(t.device.type == "cpu" and t.dim() for t in ins) \
                and any(t.device.type == "xla" for t in outs + ins):
            event = "cpu_tensor"  # copied in, or mixed into an op on the device
        elif any(t.dtype == torch.float64 for t in outs):
            event = "float64"
        if event:
            self.events[event, op, file, line] += 1
        return out


def _counts() -> tuple[int, int, int, int]:
    """torch_xla's executions, compilations and transfers from and to the device so far."""
    import torch_xla.debug.metrics as met

    def count(name: str) -> int:
        data = met.metric_data(name)
        return int(data[0]) if data else 0

    return (count("ExecuteTime"), count("CompileTime"), count("TransferFromDeviceTime"),
            count("TransferToDeviceTime"))


COUNTED = ("executions", "compiles", "from_device", "to_device")


class LineMeter:
    """torch_xla's counters (:data:`COUNTED`) charged to the line of the model's code that ran
    while they moved: ``sys.settrace`` follows the model's frames only (:func:`is_user`);
    whatever a line calls (torch, torch_xla) is charged to it. ``phase`` names the part of the
    step (``"step"``, or ``"after"`` for the step closures that run at ``torch_xla.sync()``)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int, str], list[int]] = {}
        self.phase = "step"
        self._stack: list[tuple[str, int] | None] = []
        self._current: tuple[str, int] | None = None
        self._last = (0, 0, 0, 0)

    @contextlib.contextmanager
    def tracing(self, phase: str) -> Iterator[None]:
        self.phase, self._current, self._stack = phase, None, []
        self._last = _counts()
        previous = sys.gettrace()
        sys.settrace(self._call)
        try:
            yield
        finally:
            sys.settrace(previous)
            self._charge()

    def _charge(self) -> None:
        now = _counts()
        if self._current is not None and now != self._last:
            row = self.counts.setdefault((*self._current, self.phase), [0, 0, 0, 0])
            for i, (a, b) in enumerate(zip(now, self._last, strict=True)):
                row[i] += a - b
        self._last = now

    def _call(self, frame: Any, event: str, arg: Any) -> Any:
        if not is_user(frame.f_code.co_filename):
            return None
        self._charge()
        self._stack.append(self._current)
        self._current = (frame.f_code.co_filename, frame.f_lineno)
        return self._local

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            self._charge()
            self._current = (frame.f_code.co_filename, frame.f_lineno)
        elif event == "return":
            self._charge()
            self._current = self._stack.pop() if self._stack else None
        return self._local


class ExecutionLog:
    """The executions torch_xla's analysis wrote to ``PT_XLA_DEBUG_FILE`` since :meth:`mark`:
    each with its cause, the innermost frame of the model's code ("", 0 where none of its
    frames is the model's: the workbench's own sync) and its graph's hash. torch_xla writes
    none for an execution with no Python frame (one the autograd engine's thread starts)."""

    def __init__(self, path: str | None) -> None:
        self.path = path or ""
        self.offset = 0

    def mark(self) -> None:
        self.offset = os.path.getsize(self.path) if self.path and os.path.exists(self.path) \
            else 0

    def since(self) -> list[tuple[str, str, int, str]]:
        """(cause, file, line, graph hash) of each execution since :meth:`mark`."""
        if not self.path or not os.path.exists(self.path):
            return []
        with open(self.path, errors="replace") as fh:
            fh.seek(self.offset)
            text = fh.read()
        found = []
        for block in parse_execution_analysis(text):
            file, line = next(((f, n) for _, f, n in block["frames"] if is_user(f)), ("", 0))
            found.append((block["cause"], file, line, block["graph_hash"]))
        return found


class Origins(TorchDispatchMode):
    """The line that first made a tensor of each shape (where a batch's input gets its size)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[tuple[int, ...], tuple[str, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in _tensors(out):
            if tuple(t.shape) not in self.lines:
                self.lines[tuple(t.shape)] = user_frame()
        return out

    def line_of(self, shapes: list[tuple[int, ...]]) -> dict[str, Any]:
        """The user's line that made the most of these shapes."""
        found = Counter(self.lines[s] for s in shapes if s in self.lines and self.lines[s][0])
        if not found:
            return {"where": "", "file": "", "line": 0, "code": ""}
        (file, line), _ = found.most_common(1)[0]
        return {"where": f"{file}:{line}", "file": file, "line": line,
                "code": code_at(file, line)}


def _metrics() -> dict[str, Any]:
    import torch_xla.debug.metrics as met

    executions, compiles, from_device, to_device = _counts()
    return {"compiles": compiles, "executions": executions, "to_device": to_device,
            "from_device": from_device,
            "ops": {n.removeprefix("aten::"): int(met.counter_value(n) or 0)
                    for n in met.counter_names() if n.startswith("aten::")}}


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    ops = {op: n - before["ops"].get(op, 0) for op, n in after["ops"].items()}
    return {**{k: after[k] - before[k] for k in ("compiles", "executions", "to_device",
                                                 "from_device")},
            "fallback_ops": {op: n for op, n in ops.items() if n}}


def port(ctx: Any, spec_dict: dict[str, Any], variant: str = "as written",
         dynamo: bool = True) -> dict[str, Any]:
    """One pass of the spec's model as `variant` (see the module), then Dynamo if `dynamo`."""
    import torch_xla

    spec = ExperimentSpec.from_dict(spec_dict)
    family = models.get_model(spec.model)
    cfg = family.config(spec.preset, **spec.options)
    batch_size = spec.batch_size or family.default_batch_size(cfg)
    device = torch_xla.device()
    gen = torch.Generator().manual_seed(spec.seed)
    origins = Origins()
    with origins:
        batches = [family.make_batch(cfg, batch_size, gen) for _ in range(spec.steps)]

    def fresh() -> tuple[torch.nn.Module, Callable[[dict[str, torch.Tensor]], torch.Tensor]]:
        torch.manual_seed(spec.seed)
        model = family.build(cfg).to(device)
        model.train()
        opt = make_optimizer(spec, family, model)

        def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = family.loss(model, batch)
            loss.backward()
            opt.step()
            return loss
        return model, step

    watch, meter = Watch(), LineMeter()
    log = ExecutionLog(os.environ.get("PT_XLA_DEBUG_FILE"))
    executed: list[tuple[str, str, int, str]] = []
    seen: set[str] = set()  # the programs this pass ran so far (torch_xla's graph hashes)
    rows: list[dict[str, Any]] = []
    try:
        _, step = fresh()
        for i, batch in enumerate(batches):
            ctx.check_cancel()
            placed = {k: v.to(device) for k, v in batch.items()}
            torch_xla.sync()
            torch_xla._XLAC._xla_wait_device_ops([])
            metered = i < WATCH_STEPS
            log.mark()
            before = _metrics()
            start = time.perf_counter()
            with meter.tracing("step") if metered else contextlib.nullcontext():
                loss = step(placed)
            with meter.tracing("after") if metered else contextlib.nullcontext():
                torch_xla.sync()  # the step's program, then its step closures
            value = float(loss.detach().cpu())  # waits for the program (its output)
            elapsed = time.perf_counter() - start
            after = _metrics()
            ran = log.since()
            programs = {graph for *_, graph in ran if graph}
            if metered:
                executed += ran
            row = {"kind": "port_step", "variant": variant, "step": i, "watched": metered,
                   "step_s": elapsed, "loss": value, **_delta(after, before),
                   "programs": len(programs), "new_programs": len(programs - seen),
                   "shapes": {k: list(v.shape) for k, v in batch.items()}}
            seen |= programs
            row["from_device"] -= 1  # less the loss read above, which waited for the step
            row["fallbacks"] = sum(row["fallback_ops"].values())
            ctx.emit(row)
            rows.append(row)
        # One more step, on the first batch, under the Watch: a dispatch mode changes the
        # graph torch_xla traces (its programs are compiled anew), so it never runs in a
        # measured step.
        placed = {k: v.to(device) for k, v in batches[0].items()}
        with watch:
            step(placed)
        torch_xla.sync()
    except Exception as exc:  # the step itself fails on XLA: that is the finding, at its line
        file, line = _crash_line(exc)
        ctx.emit({"kind": "port_event", "variant": variant, "event": "crash",
                  "op": type(exc).__name__, "where": f"{file}:{line}", "file": file,
                  "line": line, "code": code_at(file, line), "calls_per_step": 1.0,
                  "reason": _reason(exc)})
        return {"model": spec.model, "preset": spec.preset, "batch_size": batch_size,
                "steps": spec.steps, "checked": ["one training step on XLA (it failed)"],
                "op_lines": {}, "varying": {}, "buckets": {}, "made_at": {},
                "variants": [variant], "median_step_s": float("nan")}
    metered = min(WATCH_STEPS, len(batches))
    for (event, op, file, line), n in sorted(watch.events.items()):
        if file:  # a line of the model's (else the autograd engine's own, in the backward)
            ctx.emit({"kind": "port_event", "variant": variant, "event": event, "op": op,
                      "where": f"{file}:{line}", "file": file, "line": line,
                      "code": code_at(file, line), "calls_per_step": float(n)})
    for record in _lines(variant, meter, executed, watch.asks, metered):
        ctx.emit(record)
    checked = ["host reads: every graph execution's cause and line (torch_xla's execution "
               "analysis) and every device-to-host transfer by line",
               "data-dependent shapes (nonzero, unique, masked_select, boolean-mask indexing)",
               "tensors copied from the CPU inside the step (made without device=)",
               "float64 results",
               "XLA compilations per step and which input dimension changed",
               "CPU fallback ops (torch_xla's aten:: counters)"]

    if dynamo:
        checked.append("Dynamo graph breaks and crashes (torch.compile, backend openxla)")
        for record in _dynamo(family, fresh, batches[:2], device):
            ctx.emit(record)
    varying = _varying(batches)
    steady = [r["step_s"] for r in rows if r["step"] >= WATCH_STEPS] or \
        [r["step_s"] for r in rows[1:]] or [r["step_s"] for r in rows]
    return {"model": spec.model, "preset": spec.preset, "batch_size": batch_size,
            "steps": spec.steps, "checked": checked, "variants": [variant],
            "op_lines": {op: {f"{f}:{ln}": float(n) for (f, ln), n in where.most_common(3)}
                         for op, where in watch.ops.items()},
            "varying": {k: {str(d): v for d, v in dims.items()} for k, dims in varying.items()},
            "buckets": {k: {str(d): bucket_sizes(v) for d, v in dims.items()}
                        for k, dims in varying.items()},
            "made_at": {k: origins.line_of([tuple(b[k].shape) for b in batches])
                        for k in varying},
            "median_step_s": statistics.median(steady)}


def _lines(variant: str, meter: LineMeter, executed: list[tuple[str, str, int, str]],
           asks: Counter[tuple[str, int]], steps: int) -> Iterator[dict[str, Any]]:
    """One ``port_line`` record per line of the model's code that moved a counter (per step
    over the `steps` metered steps; ``asks`` from the one watched step)."""
    reads = Counter((f, n) for cause, f, n, _ in executed if f and READ_CAUSE in cause)
    causes: dict[tuple[str, int], set[str]] = {}
    for cause, f, n, _ in executed:
        if f:
            causes.setdefault((f, n), set()).add(cause)
    keys = set(meter.counts) | {(f, n, "step") for f, n in reads}
    for file, line, phase in sorted(keys):
        counts = meter.counts.get((file, line, phase), [0, 0, 0, 0])
        in_step = phase == "step"
        yield {"kind": "port_line", "variant": variant, "file": file, "line": line,
               "where": f"{file}:{line}", "code": code_at(file, line), "phase": phase,
               **{name: n / steps for name, n in zip(COUNTED, counts, strict=True)},
               "reads": reads[file, line] / steps if in_step else 0.0,
               "asks": float(asks[file, line]) if in_step else 0.0,
               "causes": sorted(causes.get((file, line), ())) if in_step else []}


def _varying(batches: list[dict[str, torch.Tensor]]) -> dict[str, dict[int, list[int]]]:
    """Input -> dim -> the distinct sizes it took, for the dims whose size changed."""
    out: dict[str, dict[int, list[int]]] = {}
    for key in batches[0]:
        shapes = [tuple(b[key].shape) for b in batches]
        for dim in range(len(shapes[0])):
            sizes = sorted({s[dim] for s in shapes if len(s) > dim})
            if len(sizes) > 1:
                out.setdefault(key, {})[dim] = sizes
    return out


def bucket_sizes(seen: list[int]) -> list[int]:
    """Powers of two that cover `seen`: the smallest one at or above each size seen."""
    return sorted({1 << (max(s, 1) - 1).bit_length() for s in seen})


def _dynamo(family: Any, fresh: Callable[[], Any], batches: list[dict[str, torch.Tensor]],
            device: torch.device) -> Iterator[dict[str, Any]]:
    import torch._dynamo as dynamo

    model, _ = fresh()
    placed = [{k: v.to(device) for k, v in b.items()} for b in batches]

    def loss(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return family.loss(model, batch)

    dynamo.reset()
    done = {"kind": "port_dynamo", "event": "ran", "reason": "", "where": "", "file": "",
            "line": 0, "code": ""}
    try:
        explained = dynamo.explain(loss)(placed[0])
        for reason in explained.break_reasons:
            frames = [f for f in reason.user_stack if is_user(f.filename)] or reason.user_stack
            file, line = (frames[-1].filename, frames[-1].lineno) if frames else ("", 0)
            yield {"kind": "port_dynamo", "event": "graph_break",
                   "reason": str(reason.reason).splitlines()[0], "where": f"{file}:{line}",
                   "file": file, "line": line, "code": code_at(file, line or 0)}
        dynamo.reset()
        compiled = torch.compile(loss, backend="openxla")
        for batch in placed:
            compiled(batch).backward()
        import torch_xla

        torch_xla.sync()
    except Exception as exc:  # a crash under Dynamo is a finding, with the user's line
        file, line = _crash_line(exc)
        yield {"kind": "port_dynamo", "event": "crash",
               "reason": _reason(exc),
               "where": f"{file}:{line}", "file": file, "line": line,
               "code": code_at(file, line)}
    finally:
        dynamo.reset()
    yield done  # Dynamo ran on this variant (what it found, if anything, came before)


_USER_CODE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _crash_line(exc: BaseException) -> tuple[str, int]:
    """The user's line an exception names: Dynamo's "from user code" frames in its message,
    else its traceback's innermost frame of the model's code."""
    named = [(m["file"], int(m["line"])) for m in _USER_CODE.finditer(str(exc))]
    frames = [(f.filename, f.lineno or 0) for f in traceback.extract_tb(exc.__traceback__)]
    for file, line in reversed(named + frames if named else frames):
        if is_user(file):
            return file, line
    return "", 0


_INNER = re.compile(r"got (?P<type>\w+)\('(?P<message>.+?)'\)")


def _reason(exc: BaseException) -> str:
    """The exception's first line, or the error Dynamo wraps in it (its fake tensors' reprs
    are noise): ``TorchRuntimeError: ... got RuntimeError('found two different devices')``."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    inner = _INNER.search(text)
    if inner:
        return f"{type(exc).__name__} ({inner['type']}: {inner['message']})"[:500]
    return f"{type(exc).__name__}: {text}"[:500] if text else type(exc).__name__
