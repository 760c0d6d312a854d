"""The ``port`` task: what stands between a model and the TPU, measured on XLA:CPU.

A few training steps of the spec's model, in passes that each answer one question:

1. **watch** (2 steps, lazy, under :class:`Watch`, a ``TorchDispatchMode``): every aten op the
   step runs, with the line of the model's code that called it (the innermost frame outside
   torch, torch_xla and this package). It spots host reads (``_local_scalar_dense``: ``.item()``,
   ``float()``, ``bool()``, printing a tensor), data-dependent shapes (``nonzero``, ``unique``,
   ``masked_select``, indexing with a boolean mask), copies from the CPU inside the step (a
   tensor made without ``device=``) and float64 results. Its steps are not timed.
2. **as written** (``steps``, lazy, nothing watching): per step its time after the device
   finished, XLA compilations, host-to-device and device-to-host transfers and CPU fallback ops
   (torch_xla's metrics), and the sizes of every input (which dimension changes).
3. **each fix that needs no edit of the user's file**, on top of the ones before it, watched
   (did the line stop firing?) and timed like (2): batches padded to buckets, the XLA device
   as the default device during the model's code (tensor attributes moved there, as buffers
   would be), float64 run as float32 (a dispatch mode that casts).
4. **dynamo** (``torch.compile(backend="openxla")``, 2 steps): ``torch._dynamo.explain``'s graph
   breaks with their reasons and lines; a crash is kept with its line.

Task ``port_edited`` runs a copy of the model's file that :mod:`tpu_workbench.porting.patch`
edited: (1) unrecorded, then one variant, ``"edited"``, with every fix of (3) at once, watched
and timed; no Dynamo pass.

Records: ``kind="port_step"`` (variant, step, step_s, compiles, executions, to_device,
from_device, fallbacks, fallback_ops, shapes), ``kind="port_event"`` (event, op, where, code,
calls per step) and ``kind="port_dynamo"`` (event, reason, where, code). The analysis (which
of these are blockers, their fixes) is :mod:`tpu_workbench.porting`'s.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import statistics
import sys
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
from .backend import init_optimizer_state, make_optimizer

WATCH_STEPS = 2
DATA_DEPENDENT = {"nonzero", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
                  "masked_select", "argwhere", "nonzero_static_"}
FACTORIES = {"arange", "zeros", "ones", "full", "empty", "rand", "randn", "randint", "eye",
             "linspace", "tensor", "scalar_tensor", "lift_fresh", "empty_strided"}
_LIBRARY = (f"{os.sep}torch{os.sep}", f"{os.sep}torch_xla{os.sep}",
            f"{os.sep}tpu_workbench{os.sep}worker{os.sep}", f"{os.sep}contextlib.py",
            f"{os.sep}_dynamo{os.sep}", "<frozen")


def user_frame(skip: int = 2) -> tuple[str, int]:
    """(file, line) of the innermost frame outside torch, torch_xla and this package."""
    try:
        frame: Any = sys._getframe(skip)
    except ValueError:  # called from C++ with less Python above (the autograd engine)
        return "", 0
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(part in name for part in _LIBRARY):
            return name, frame.f_lineno
        frame = frame.f_back
    return "", 0


def code_at(file: str, line: int) -> str:
    return linecache.getline(file, line).strip() if file else ""


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


class Watch(TorchDispatchMode):
    """Counts, per (event, op, file, line), the calls that block a TPU port (see the module)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: Counter[tuple[str, str, str, int]] = Counter()
        self.ops: dict[str, Counter[tuple[str, int]]] = {}  # op -> lines that called it

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op = func.overloadpacket.__name__
        file, line = user_frame()
        self.ops.setdefault(op, Counter())[file, line] += 1
        ins, outs = _tensors((args, kwargs)), _tensors(out)
        event = ""
        if op == "_local_scalar_dense":
            event = "host_read"
        elif op in DATA_DEPENDENT or (op == "index" and any(
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


class AsFloat32(TorchDispatchMode):
    """Runs float64 as float32: float64 arguments and ``dtype=torch.float64`` become float32."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        def cast(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dtype == torch.float64:
                return x.to(torch.float32)
            return torch.float32 if x is torch.float64 else x

        args = tuple(cast(a) for a in args)
        kwargs = {k: cast(v) for k, v in (kwargs or {}).items()}
        return func(*args, **kwargs)


def pad_to(batch: dict[str, torch.Tensor], buckets: dict[str, dict[int, list[int]]]
           ) -> dict[str, torch.Tensor]:
    """`batch` with each (input, dim) in `buckets` zero-padded up to its smallest bucket."""
    out = dict(batch)
    for key, dims in buckets.items():
        t = out[key]
        for dim, sizes in dims.items():
            size = next((s for s in sorted(sizes) if s >= t.shape[dim]), t.shape[dim])
            if size > t.shape[dim]:
                shape = list(t.shape)
                shape[dim] = size - t.shape[dim]
                t = torch.cat([t, t.new_zeros(shape)], dim=dim)
        out[key] = t
    return out


def _metrics() -> dict[str, Any]:
    import torch_xla.debug.metrics as met

    def count(name: str) -> int:
        data = met.metric_data(name)
        return int(data[0]) if data else 0

    return {"compiles": count("CompileTime"), "executions": count("ExecuteTime"),
            "to_device": count("TransferToDeviceTime"),
            "from_device": count("TransferFromDeviceTime"),
            "ops": {n.removeprefix("aten::"): int(met.counter_value(n) or 0)
                    for n in met.counter_names() if n.startswith("aten::")}}


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    ops = {op: n - before["ops"].get(op, 0) for op, n in after["ops"].items()}
    return {**{k: after[k] - before[k]
               for k in ("compiles", "executions", "to_device", "from_device")},
            "fallback_ops": {op: n for op, n in ops.items() if n}}


def port(ctx: Any, spec_dict: dict[str, Any], edited: bool = False) -> dict[str, Any]:
    """The passes above for the spec's model. ``edited``: the model is a copy the workbench
    patched (:mod:`tpu_workbench.porting.patch`); it runs once, watched and timed as variant
    ``"edited"``, with every fix that needs no edit applied, and without the Dynamo pass."""
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
    checked: list[str] = []

    def fresh(attributes: bool = False) -> tuple[torch.nn.Module, Callable[..., torch.Tensor]]:
        torch.manual_seed(spec.seed)
        model = family.build(cfg).to(device)
        if attributes:  # plain tensor attributes, as if registered as buffers
            for module in model.modules():
                for name, value in list(vars(module).items()):
                    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                        setattr(module, name, value.to(device))
        model.train()
        opt = make_optimizer(spec, family, model)
        init_optimizer_state(opt)

        def step(batch: dict[str, torch.Tensor],
                 around: Callable[[], Any] = contextlib.nullcontext) -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            with around():  # the fix under test covers the model's code only
                loss = family.loss(model, batch)
            loss.backward()
            opt.step()
            return loss
        return model, step

    def watched(variant: str, data: list[dict[str, torch.Tensor]],
                around: Callable[[], Any] = contextlib.nullcontext,
                attributes: bool = False, emit: bool = True) -> Watch:
        """The :class:`Watch` of `variant`'s first steps (not timed)."""
        watch = Watch()
        _, step = fresh(attributes)
        for batch in data[:WATCH_STEPS]:
            placed = {k: v.to(device) for k, v in batch.items()}
            with watch:
                step(placed, around)
            torch_xla.sync()
        for (event, op, file, line), n in sorted(watch.events.items()):
            # a line of the model's (inside the libraries: the autograd engine's own)
            if file and emit:
                ctx.emit({"kind": "port_event", "variant": variant, "event": event, "op": op,
                          "where": f"{file}:{line}", "file": file, "line": line,
                          "code": code_at(file, line), "calls_per_step": n / WATCH_STEPS})
        return watch

    def timed(variant: str, data: list[dict[str, torch.Tensor]],
              around: Callable[[], Any] = contextlib.nullcontext,
              attributes: bool = False) -> list[dict[str, Any]]:
        _, step = fresh(attributes)
        rows = []
        for i, batch in enumerate(data):
            ctx.check_cancel()
            placed = {k: v.to(device) for k, v in batch.items()}
            torch_xla.sync()
            torch_xla._XLAC._xla_wait_device_ops([])
            before = _metrics()
            start = time.perf_counter()
            loss = step(placed, around)
            torch_xla.sync()
            value = float(loss.detach().cpu())  # waits for the step's program (its output)
            elapsed = time.perf_counter() - start
            after = _metrics()
            row = {"kind": "port_step", "variant": variant, "step": i, "step_s": elapsed,
                   "loss": value,
                   **_delta(after, before), "from_device": after["from_device"]
                   - before["from_device"] - 1,  # less the loss read that waited
                   "shapes": {k: list(v.shape) for k, v in batch.items()}}
            row["fallbacks"] = sum(row["fallback_ops"].values())
            ctx.emit(row)
            rows.append(row)
        return rows

    # 1. watch
    first = "edited" if edited else "as written"
    try:
        watch = watched(first, batches, emit=not edited)
    except Exception as exc:  # the step itself fails on XLA: that is the finding, at its line
        file, line = _crash_line(exc)
        ctx.emit({"kind": "port_event", "variant": first, "event": "crash",
                  "op": type(exc).__name__, "where": f"{file}:{line}", "file": file,
                  "line": line, "code": code_at(file, line), "calls_per_step": 1.0,
                  "reason": _reason(exc)})
        return {"model": spec.model, "preset": spec.preset, "batch_size": batch_size,
                "steps": spec.steps, "checked": ["one training step on XLA (it failed)"],
                "op_lines": {}, "varying": {}, "buckets": {}, "made_at": {},
                "median_step_s": float("nan")}
    checked += ["host reads (.item(), float(), bool(), printing a tensor)",
                "data-dependent shapes (nonzero, unique, masked_select, boolean-mask indexing)",
                "tensors copied from the CPU inside the step (made without device=)",
                "float64 results"]
    lines = {op: {f"{f}:{ln}": n / WATCH_STEPS for (f, ln), n in where.most_common(3)}
             for op, where in watch.ops.items()}

    # 2. as written
    written = [] if edited else timed("as written", batches)
    checked += ["XLA compilations per step and which input dimension changed",
                "CPU fallback ops (torch_xla's aten:: counters)",
                "host-device transfers per step"]

    # 3. fixes that need no edit
    varying = _varying(batches)
    events = {e for e, *_ in watch.events}
    # Each fix on top of the ones before it, so one fix's gain is not hidden by another
    # blocker's cost (a compile per step of a new length dwarfs a copy from the CPU).
    buckets = {k: {d: bucket_sizes(v) for d, v in dims.items()} for k, dims in varying.items()}
    data, modes, attributes = batches, [], False
    plan: list[tuple[str, list[dict[str, torch.Tensor]], list[Callable[[], Any]], bool]] = []
    if buckets:
        data = [pad_to(b, buckets) for b in batches]
        plan.append(("pad to buckets", data, [], False))
    if "cpu_tensor" in events:  # made on the device by default; tensor attributes moved there
        modes.append(lambda: torch.device(device))
        attributes = True
        plan.append(("on device", data, list(modes), attributes))
    if "float64" in events:
        modes.append(AsFloat32)
        plan.append(("float32", data, list(modes), attributes))
    if edited:  # the patched copy, with every fix above at once
        plan = [("edited", data, list(modes), attributes)]
    for variant, variant_data, variant_modes, moved in plan:
        def around(ms: list[Callable[[], Any]] = variant_modes) -> contextlib.ExitStack:
            stack = contextlib.ExitStack()
            for mode in ms:
                stack.enter_context(mode())
            return stack

        if variant_modes or edited:  # did the lines stop firing? (padding moves no line)
            watched(variant, variant_data, around, moved)
        timed(variant, variant_data, around, moved)
    variants = ([] if edited else ["as written"]) + [v for v, *_ in plan]

    # 4. dynamo
    if not edited:
        checked.append("Dynamo graph breaks and crashes (torch.compile, backend openxla)")
        for record in _dynamo(family, fresh, batches[:2], device):
            ctx.emit(record)
    return {"model": spec.model, "preset": spec.preset, "batch_size": batch_size,
            "steps": spec.steps, "checked": checked, "op_lines": lines, "variants": variants,
            "varying": {k: {str(d): v for d, v in dims.items()} for k, dims in varying.items()},
            "buckets": {k: {str(d): v for d, v in dims.items()} for k, dims in buckets.items()},
            "made_at": {k: origins.line_of([tuple(b[k].shape) for b in batches])
                        for k in varying},
            "median_step_s": statistics.median(r["step_s"] for r in written[2:] or written)
            if written else float("nan")}


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
    try:
        explained = dynamo.explain(loss)(placed[0])
        for reason in explained.break_reasons:
            frames = [f for f in reason.user_stack
                      if not any(part in f.filename for part in _LIBRARY)] or reason.user_stack
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


_USER_CODE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _crash_line(exc: BaseException) -> tuple[str, int]:
    """The user's line an exception names: Dynamo's "from user code" frames in its message,
    else its traceback's innermost frame outside the libraries."""
    named = [(m["file"], int(m["line"])) for m in _USER_CODE.finditer(str(exc))]
    frames = [(f.filename, f.lineno or 0) for f in traceback.extract_tb(exc.__traceback__)]
    for file, line in reversed(named + frames if named else frames):
        if not any(part in file for part in _LIBRARY):
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
