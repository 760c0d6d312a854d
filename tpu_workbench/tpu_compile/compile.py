"""The TPU's own compiler on a laptop: a model's training step, traced by torch_xla on virtual
XLA:CPU devices (never run), compiled by libtpu for a named slice (no chip needed).

Two processes, neither the caller's: a workbench worker traces the step (the ``trace`` task,
:mod:`tpu_workbench.worker.tpu_trace`) and a fresh ``.venv-libtpu`` interpreter compiles it
(:mod:`tpu_workbench.tpu_compile.libtpu_main`): jaxlib and torch_xla each carry an XLA, so they
never share a process. The compile-only client allocates nothing and opens no chip (beside a
training job on a TPU VM: not checked, no TPU here).

>>> c = tpu_compile("hf:llama", "llama-3-8b", "v6e-8", layers=1)   # doctest: +SKIP
>>> c.label, c.memory["total_bytes"], c.collectives.kind.value_counts()

A compiled result is kept under ``results/tpu_compiles/`` by (HLO fingerprint, topology,
libtpu version), with its provenance (``request.json``); asking again is instant.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .. import models, sharding
from ..environment.chips import Slice, get_slice
from ..environment.paths import results_dir
from ..errors import SpecError
from ..hlo.parse import clip
from ..runs.runner import run
from ..runs.spec import ExperimentSpec
from ..runs.workers import WorkerPool
from . import results

ROOT = Path(__file__).resolve().parents[2]  # the checkout, beside .venv-libtpu
LIBTPU_VENV = ROOT / ".venv-libtpu"
MAIN = Path(__file__).with_name("libtpu_main.py")
LOCK = Path(tempfile.gettempdir()) / "tpu_workbench_libtpu.lock"
ATTEMPTS = 3  # libtpu aborts now and then beside another libtpu (see compile_proto)
MAX_TRACE_DEVICES = 64  # torch_xla 2.9 traces a backward pass on at most 64 virtual devices
DTYPES = tuple(sharding.STATE_BYTES)
INSTALL_HINT = ("set it up with `python3 scripts/dev.py setup` (it builds .venv-libtpu from "
                "requirements-libtpu.txt: jax, jaxlib and libtpu; no TPU needed), or point "
                "TPU_WORKBENCH_LIBTPU_PYTHON at an interpreter that has them")


class DoesNotFit(SpecError):
    """The TPU compiler refused the program: it needs more HBM than a chip has."""


def libtpu_python() -> Path:
    """The interpreter that compiles: ``TPU_WORKBENCH_LIBTPU_PYTHON`` or .venv-libtpu's."""
    return Path(os.environ.get("TPU_WORKBENCH_LIBTPU_PYTHON", LIBTPU_VENV / "bin" / "python"))


@functools.cache
def libtpu_version(python: str | None = None) -> str:
    """libtpu's version in the compiling interpreter; SpecError (how to install) if absent."""
    python = python or str(libtpu_python())
    if not Path(python).exists():
        raise SpecError(f"the TPU compiler (jax + libtpu) is not installed: {python} does not "
                        f"exist; {INSTALL_HINT}")
    found = subprocess.run(
        [python, "-c", "from importlib import metadata as m; import jax.experimental.topologies;"
                       " print(m.version('libtpu'))"],
        capture_output=True, text=True, timeout=120)
    if found.returncode:
        raise SpecError(f"the TPU compiler (jax + libtpu) is not usable in {python}: "
                        f"{(found.stderr.strip().splitlines() or ['?'])[-1]}; {INSTALL_HINT}")
    return found.stdout.strip()


def topology_name(sl: Slice) -> tuple[str, list[int] | None]:
    """libtpu's name of a slice's topology (``v6e:2x4``) and its chips per host where libtpu's
    default (2x2x1) does not divide it (a one-chip slice)."""
    bounds = [1, 1, 1] if sl.chips == 1 else None
    return f"{sl.chip}:{sl.topology_text}", bounds


def step_options(family: Any, preset: str, seq_len: int, dtype: str,
                 options: dict[str, Any]) -> dict[str, Any]:
    """Options of a traced or compiled step of `seq_len` tokens: the task's ``length`` (the
    step's sequences are ``2 * length``), the dtype, room in the position table."""
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 2 or seq_len % 2:
        raise SpecError(f"seq_len must be an even int of at least 2, got {seq_len!r}")
    if dtype not in DTYPES:
        raise SpecError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    out = {**options, "length": seq_len // 2}
    cfg = family.config(preset, **options)
    if family.planning_dtype == "bfloat16":
        if dtype == "bfloat16":
            out["dtype"] = "bfloat16"
        if family.positions(cfg) < seq_len:
            raise SpecError(f"seq_len={seq_len} is longer than {family.name} {preset}'s "
                            f"{family.positions_field}={family.positions(cfg)}")
    else:
        if dtype != "float32":
            raise SpecError(f"dtype={dtype!r}: {family.name} builds in {family.planning_dtype} "
                            "only; the hf:* families also build in bfloat16")
        out["block_size"] = max(getattr(cfg, "block_size", seq_len), seq_len)
    return out


@dataclass
class CompiledProgram:
    """One HLO module compiled by libtpu for one slice: what the TPU compiler made of it.

    ``memory`` (per chip, bytes, :func:`results.memory_summary`), ``ops`` (every top-level
    op of chip 0's program, :data:`results.OP_COLUMNS`), ``collectives`` (as compiled, with
    their ICI time), ``buffers`` (the largest HBM buffers), ``hlo_text`` (the TPU program)."""

    slice: str
    mesh: tuple[int, ...]
    folder: Path
    compiled: dict[str, Any]
    cached: bool = False

    @property
    def label(self) -> str:
        return (f"compiled for {self.slice} ({self.compiled['device_kind']}, "
                f"{self.compiled['topology']}) by libtpu {self.compiled['libtpu']} (not run)")

    @functools.cached_property
    def hlo_text(self) -> str:
        return (self.folder / "tpu_hlo.txt").read_text()

    @functools.cached_property
    def memory(self) -> dict[str, Any]:
        return results.memory_summary(self.compiled, get_slice(self.slice).chip)

    @functools.cached_property
    def ops(self) -> pd.DataFrame:
        return results.ops_frame(self.hlo_text)

    @functools.cached_property
    def collectives(self) -> pd.DataFrame:
        sl = get_slice(self.slice)
        return results.collectives_frame(self.hlo_text, sl.chip, self.mesh, sl.topology)

    @functools.cached_property
    def buffers(self) -> pd.DataFrame:
        return results.buffers_frame(self.folder / "dump")


@dataclass
class TPUCompile(CompiledProgram):
    """A model's training step compiled by libtpu (:func:`tpu_compile`)."""

    model: str = ""
    preset: str = ""
    strategy: str = ""
    batch_size: int = 0
    seq_len: int = 0
    dtype: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)

    def provenance(self) -> dict[str, Any]:
        """What was compiled, for which slice, by which compiler, when (for a saved figure)."""
        keep = ("topology", "chips", "device_kind", "libtpu", "jax", "libtpu_flags", "compile_s",
                "compiled_at")
        return {"model": self.model, "preset": self.preset, "slice": self.slice,
                "strategy": self.strategy, "mesh": list(self.mesh),
                "batch_size": self.batch_size, "seq_len": self.seq_len, "dtype": self.dtype,
                "options": self.options, **{k: self.compiled.get(k) for k in keep},
                "executions": 0}


def checked_flags(libtpu_flags: Sequence[str]) -> tuple[str, ...]:
    """`libtpu_flags` as a tuple, each ``--name=value`` (SpecError naming the others)."""
    flags = tuple(libtpu_flags)
    bad = [f for f in flags if not re.fullmatch(r"--[A-Za-z0-9_]+=\S+", str(f))]
    if bad:
        raise SpecError(f"libtpu_flags must each look like --name=value, got {bad}")
    return flags


def compile_proto(proto: Path | str, slice: str, mesh: tuple[int, ...] | None = None,
                  retarget_from: int | None = None, timeout: float = 1800.0,
                  what: str = "the program", provenance: dict[str, Any] | None = None,
                  libtpu_flags: Sequence[str] = ()) -> CompiledProgram:
    """Compile an HLO module proto (``torch_xla._XLAC._get_xla_tensors_hlo_proto``, sharding
    annotations included) for `slice` with libtpu, in a process of its own; cached by (HLO
    fingerprint, topology, libtpu version, the compile script). `retarget_from`: the device
    count of the 1-D mesh it was traced on, when smaller than the slice. `libtpu_flags`: the
    compiler's own flags (``LIBTPU_INIT_ARGS``), e.g. MaxText's
    ``--xla_jf_spmd_threshold_for_windowed_einsum_mib=1000000`` (no collective matmuls).
    Raises :class:`DoesNotFit` or SpecError."""
    sl = get_slice(slice)
    flags = checked_flags(libtpu_flags)
    version = libtpu_version()
    proto = Path(proto)
    topology, bounds = topology_name(sl)
    key = hashlib.sha256(proto.read_bytes() + _read(proto.with_name("aliases.json"))
                         + MAIN.read_bytes() + json.dumps(
        [topology, bounds, retarget_from and sl.chips, version, flags]).encode()).hexdigest()[:20]
    folder = results_dir() / "tpu_compiles" / f"{sl.name}-{key}"
    mesh = tuple(mesh or (sl.chips,))
    if (folder / "compiled.json").exists():
        return CompiledProgram(sl.name, mesh, folder,
                               json.loads((folder / "compiled.json").read_text()), cached=True)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    aliases = proto.with_name("aliases.json")
    request = {"proto": str(proto.resolve()), "topology": topology, "host_bounds": bounds,
               "out": str(partial), "retarget_from": retarget_from,
               "aliases": json.loads(aliases.read_text()) if aliases.exists() else [],
               "libtpu_flags": list(flags)}
    (partial / "request.json").write_text(json.dumps(
        {**request, "slice": sl.name, **(provenance or {})}, indent=1, default=str))
    started = time.perf_counter()
    try:
        # One compile at a time on a machine, and again if libtpu aborts. Checked here: with
        # another libtpu loaded at the same time (libtpu 0.0.21 in .venv, imported by a
        # torch_xla worker tracing beside it) the compiler aborted now and then in a
        # windowing check ("pad_high", a bound read from garbage) on programs that compile
        # alone. The compile-only client never opens a chip, so beside a training job on a
        # TPU VM it need not wait for libtpu's one-process lock (not checked: no TPU here).
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for attempts in range(1, ATTEMPTS + 1):  # noqa: B007 - the count is recorded
                done = subprocess.run(
                    [str(libtpu_python()), str(MAIN), str(partial / "request.json")],
                    capture_output=True, text=True, timeout=timeout,
                    env={**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
                         "LIBTPU_INIT_ARGS": " ".join(flags)})
                if done.returncode >= 0:  # compiled, or refused with a message
                    break
                (partial / f"aborted-{attempts}.log").write_text(done.stderr)
    except subprocess.TimeoutExpired:
        shutil.rmtree(partial, ignore_errors=True)
        raise SpecError(f"libtpu {version} did not finish compiling {what} for {sl.name} "
                        f"within {timeout:.0f} s") from None
    if done.returncode:
        error = partial / "error.txt"
        message = error.read_text() if error.exists() else (
            f"the compiler process ended with code {done.returncode}: "
            + " | ".join(done.stderr.strip().splitlines()[-4:]))
        failed = folder.with_name(folder.name + ".failed")  # kept: what libtpu said, in full
        shutil.rmtree(failed, ignore_errors=True)
        partial.rename(failed)
        shutil.rmtree(failed / "dump", ignore_errors=True)  # the request and stderr are enough
        (failed / "stderr.txt").write_text(done.stderr)
        if "RESOURCE_EXHAUSTED" in message:
            raise DoesNotFit(f"{what} does not fit {sl.name}: libtpu {version} says "
                             f"{clip(' '.join(message.split()), 600)}")
        raise SpecError(f"libtpu {version} could not compile {what} for {sl.name}: "
                        f"{clip(' '.join(message.split()), 600)}")
    compiled = json.loads((partial / "compiled.json").read_text())
    compiled["compiled_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    compiled["wall_s"] = time.perf_counter() - started
    compiled["attempts"] = attempts
    compiled["libtpu_flags"] = list(flags)
    (partial / "compiled.json").write_text(json.dumps(compiled, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)  # whole or not at all
    return CompiledProgram(sl.name, mesh, folder, compiled)


@dataclass(frozen=True)
class StepPlan:
    """A validated step to trace (:func:`step_plan`): the worker's spec, the slice's mesh,
    and the device count the trace's shardings are rewritten from (None: traced as is)."""

    spec: ExperimentSpec
    slice: str
    mesh: tuple[int, ...]
    dtype: str
    retarget_from: int | None


def step_plan(model: str, preset: str, slice: str = "v6e-8", strategy: str = "fsdp",
              seq_len: int = 2048, batch_size: int = 8, dtype: str | None = None,
              layers: int | None = None, options: dict[str, Any] | None = None,
              libtpu_flags: Sequence[str] = (), model_axis: int | None = None,
              optimizer: str = "adamw") -> StepPlan:
    """Everything :func:`tpu_compile` checks before it traces anything: SpecError naming the
    value for a bad slice, strategy, batch, option, flag, model axis, optimizer or a model
    that is no transformer."""
    family = models.get_model(model)
    sl = get_slice(slice)
    checked_flags(libtpu_flags)
    strategy = sharding.strategy_name(strategy)
    if strategy is None:
        raise SpecError(f"strategy must be one of {', '.join(sharding.STRATEGIES)}, got None")
    dtype = dtype or family.planning_dtype
    cfg = family.config(preset, **dict(options or {}))
    if family.batch_shapes(cfg, 1) is not None:  # no sequence model (dlrm): its own batch
        if dtype != family.planning_dtype or layers is not None:
            raise SpecError(f"{family.name} compiles in {family.planning_dtype} with all its "
                            f"layers; got dtype={dtype!r}, layers={layers!r}")
        opts = dict(options or {})
    else:
        family.block_shape(cfg)  # a transformer's step only
        opts = step_options(family, preset, seq_len, dtype, dict(options or {}))
    if layers is not None:
        opts[family.block_shape(family.config(preset, **opts)).layers_option] = layers
    mesh = sharding.slice_mesh(sl, strategy, model_axis)
    ways = sharding.batch_ways(strategy, mesh)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0 \
            or batch_size % ways:
        raise SpecError(f"batch_size={batch_size!r} does not split over {ways} data shards "
                        f"({strategy} on {sl.name}, mesh {'x'.join(map(str, mesh))}): use a "
                        f"multiple of {ways}")
    trace_mesh, retarget_from = mesh, None
    if sl.chips > MAX_TRACE_DEVICES:
        if len(mesh) != 1:
            raise SpecError(f"{strategy} on {sl.name} ({sl.chips} chips, mesh "
                            f"{'x'.join(map(str, mesh))}): slices above {MAX_TRACE_DEVICES} "
                            "chips compile only 1-D strategies (dp, fsdp) here; "
                            "tpu_workbench.predict compiles the per-chip equivalent instead "
                            "(equivalent_slice())")
        if opts.get("attn_implementation") == "flash":
            raise SpecError(
                f"flash attention on {sl.name}: above {MAX_TRACE_DEVICES} chips the step is "
                f"traced on {MAX_TRACE_DEVICES} devices and its shardings rewritten, but the "
                "flash kernel is traced at each device's own shapes, which no rewrite can "
                "change; compile the per-chip equivalent instead (tpu_workbench.predict does: "
                f"equivalent_slice()), use eager or sdpa attention, or a slice of at most "
                f"{MAX_TRACE_DEVICES} chips")
        trace_mesh, retarget_from = (MAX_TRACE_DEVICES,), MAX_TRACE_DEVICES
    spec = ExperimentSpec(model=model, preset=preset, mode="lazy", mesh=trace_mesh,
                          device="cpu", strategy=strategy, batch_size=batch_size, steps=1,
                          options=opts, optimizer=optimizer)
    spec.validate()  # e.g. heads the model axis does not divide
    return StepPlan(spec, sl.name, mesh, dtype, retarget_from)


def equivalent_slice(slice: str, batch_size: int) -> tuple[str, int]:
    """The slice of :data:`MAX_TRACE_DEVICES` chips of the same chip, and the global batch that
    gives each of its chips the sequences a chip of `slice` gets, on a slice too large to trace
    (a 2-D strategy, or flash attention). Per chip the step is then the same program, on a
    (data, model) mesh the same model axis: the same batch, the same gathered weights, the same
    kernels; what differs is the size of each weight and Adam shard and of each collective's
    ring over the data axis, which the caller rescales
    (:func:`tpu_workbench.planning.predict.predict`)."""
    from ..environment.chips import SLICES

    sl = get_slice(slice)
    if sl.chips <= MAX_TRACE_DEVICES:
        return sl.name, batch_size
    small = [s for s in SLICES.values() if s.chip == sl.chip and s.chips == MAX_TRACE_DEVICES]
    if not small or sl.chips % MAX_TRACE_DEVICES or batch_size % sl.chips:
        raise SpecError(f"{sl.name} at batch_size={batch_size}: no per-chip equivalent on "
                        f"{MAX_TRACE_DEVICES} {sl.chip} chips (needs such a slice, a slice of a "
                        f"multiple of {MAX_TRACE_DEVICES} chips and a batch that is a multiple "
                        f"of {sl.chips})")
    return small[0].name, batch_size * MAX_TRACE_DEVICES // sl.chips


def tpu_compile(model: str, preset: str, slice: str = "v6e-8", strategy: str = "fsdp",
                seq_len: int = 2048, batch_size: int = 8, dtype: str | None = None,
                layers: int | None = None, options: dict[str, Any] | None = None,
                libtpu_flags: Sequence[str] = (), pool: WorkerPool | None = None,
                timeout: float = 1800.0, on_progress: Callable[[str], None] | None = None,
                model_axis: int | None = None, optimizer: str = "adamw") -> TPUCompile:
    """Compile one training step (forward, backward, the `optimizer`'s update: ``adamw`` or
    ``adafactor``) of `model`/`preset` at global `batch_size` x `seq_len` tokens for `slice`
    with `strategy`, on libtpu, with no chip.

    `dtype`: ``bfloat16`` (hf:* default; mixed precision: fp32 weights and Adam state, bf16
    compute) or ``float32``. `layers`: compile this many blocks instead of the model's own
    (:func:`tpu_workbench.predict` extrapolates from two). `libtpu_flags`: see
    :func:`compile_proto`. `model_axis`: the 2-D strategies' model axis (default the slice's
    last physical axis). Raises SpecError before any work for bad input
    (:func:`step_plan`); :class:`DoesNotFit` when the compiler says the program needs more
    HBM than a chip has; SpecError naming the spec and slice for any other compile error.
    """
    plan = step_plan(model, preset, slice, strategy, seq_len, batch_size, dtype, layers,
                     options, libtpu_flags, model_axis, optimizer)
    spec = plan.spec
    version = libtpu_version()  # before the trace: a missing compiler fails fast
    say = on_progress or (lambda _m: None)
    say(f"tracing {model} {preset} {spec.strategy} on {'x'.join(map(str, spec.mesh))} virtual "
        "devices (nothing runs)")
    traced = run(spec, task="trace", pool=pool, timeout=timeout, reuse=True)
    seq_len = int(traced.summary.get("seq_len", seq_len))  # 0: no sequence model (dlrm)
    what = f"{model} {preset} {spec.strategy} (batch {batch_size}" + (
        f" x {seq_len} tokens)" if seq_len else ")")
    say(f"compiling {what} for {plan.slice} with libtpu {version}")
    program = compile_proto(Path(traced.out_dir) / "step.pb", plan.slice, plan.mesh,
                            plan.retarget_from, timeout, what,
                            {"spec": spec.to_dict(), "trace_run": traced.run_id}, libtpu_flags)
    return TPUCompile(program.slice, plan.mesh, program.folder, program.compiled,
                      program.cached, model=model, preset=preset, strategy=spec.strategy,
                      batch_size=batch_size, seq_len=seq_len, dtype=plan.dtype,
                      options=dict(spec.options), trace=dict(traced.summary))


def _read(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""
