"""What to run: :class:`ExperimentSpec`, its validation, and the runtime it needs.

A spec is plain data (it crosses the process boundary as JSON). :meth:`ExperimentSpec.validate`
checks every field before any worker starts or anything compiles, and raises :class:`SpecError`
naming the bad value and what would be valid. :func:`runtime_config` maps a spec onto the
:class:`RuntimeConfig` of the worker process that can run it: specs with equal runtime configs
share one warm worker.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..environment import backends
from ..environment.runtimes import Runtime, worker_thread_env
from ..errors import SpecError
from ..sharding.fit import OPTIMIZERS


@dataclass(frozen=True)
class Mode:
    """One way of executing a training step."""

    name: str
    runtime: Runtime
    description: str
    hlo: bool = False  # compiles a program whose HLO a run can capture (capture="hlo")


MODES: dict[str, Mode] = {m.name: m for m in [
    Mode("torch_eager", Runtime.TORCH, "plain PyTorch, eager (the baseline)"),
    Mode("inductor", Runtime.TORCH,
         "plain PyTorch, torch.compile with the default inductor backend"),
    Mode("eager", Runtime.XLA, "torch_xla eager mode: every op compiled and run on its own",
         hlo=True),
    Mode("lazy", Runtime.XLA,
         "torch_xla lazy tensors: one graph per step, cut by torch_xla.sync()", hlo=True),
    Mode("compile", Runtime.XLA, "torch_xla.compile of the whole train step", hlo=True),
    Mode("dynamo", Runtime.XLA, "torch.compile(backend='openxla')", hlo=True),
    # TorchTPU (torch_tpu, its own environment .venv-torchtpu; see
    # tpu_workbench.environment.torchtpu)
    Mode("tpu_eager", Runtime.TORCH_TPU,
         "TorchTPU strict eager (EagerMode.DEFER_NEVER, its default)"),
    Mode("tpu_fused", Runtime.TORCH_TPU, "TorchTPU fused eager (EagerMode.DEFER_AND_FUSE)"),
    Mode("tpu_compile", Runtime.TORCH_TPU, "TorchTPU torch.compile(backend='tpu')", hlo=True),
]}


def available_modes() -> list[str]:
    """The modes that can run here: plain PyTorch always; the XLA modes where torch_xla is
    installed; the TorchTPU modes where TorchTPU finds a chip. Notebooks offer these."""
    ok = {runtime: runtime.available() for runtime in Runtime}
    return [name for name, m in MODES.items() if ok[m.runtime]]


def default_modes() -> list[str]:
    """The modes a comparison shows by default here: the baseline and the compiled modes of the
    best backend available (TorchTPU on a chip, else torch_xla, else plain PyTorch)."""
    have = available_modes()
    for wanted in (["torch_eager", "tpu_eager", "tpu_compile"],
                   ["torch_eager", "lazy", "compile"], ["torch_eager", "inductor"]):
        if all(m in have for m in wanted):
            return wanted
    return ["torch_eager"]

def comparison_modes() -> list[str]:
    """The modes a side-by-side comparison starts with: every mode that runs here except
    inductor, whose cold compile takes 6-32 s on two cores (offered, not picked)."""
    return [m for m in available_modes() if m != "inductor"]


def hlo_modes() -> list[str]:
    """The modes that run here and compile HLO (``capture="hlo"``): torch_xla's, and
    TorchTPU's ``tpu_compile`` (StableHLO) on a chip."""
    return [m for m in available_modes() if MODES[m].hlo]


CAPTURES = ("hlo", "profile", "checkpoint")
# What a run can change at step `change_at`, to show what makes XLA compile again.
CHANGES = {
    "batch_size": "the batch doubles in size (a new input shape)",
    "item": "the step reads the loss with .item() before backward (cuts the graph in two)",
    "keep_tensor": "the step keeps one more tensor alive across steps (a new graph output)",
    "seq_len": "the sequences get a quarter shorter (a new input shape; sequence models only)",
    "dtype": "the forward pass runs under bfloat16 autocast (new dtypes inside the graph)",
}
DEVICES = ("auto", "cpu", "tpu", "cuda")
MAX_CPU_DEVICES = 64


# The worker tasks of ``port`` (tpu_workbench.porting): their workers explain every execution.
PORT_TASKS = ("port", "port_edited", "port_edited_dynamo")


@dataclass(frozen=True)
class RuntimeConfig:
    """The process-wide settings of a worker: what torch_xla reads once, at import.

    Two specs with the same RuntimeConfig can share a warm worker (and its compile cache).
    """

    runtime: Runtime
    device: str  # "cpu" | "tpu" | "cuda"
    num_devices: int = 1
    spmd: bool = False
    xla_flags: tuple[str, ...] = ()
    explain_compiles: bool = False  # torch_xla's compilation analysis (PT_XLA_DEBUG_LEVEL=1)
    # and every execution's too, with its cause and Python frames (PT_XLA_DEBUG_LEVEL=2)
    explain_executions: bool = False
    dump_hlo: bool = False  # XLA dumps the HLO of every compiled module (capture="hlo")
    persistent_cache: bool = False  # torch_xla.runtime.initialize_cache, one folder per config

    def __post_init__(self) -> None:
        object.__setattr__(self, "runtime", Runtime(self.runtime))  # "xla" read back from JSON

    def env(self) -> dict[str, str]:
        """Environment variables the worker must see before it imports torch_xla."""
        env = {"TF_CPP_MIN_LOG_LEVEL": "2", "TPU_WORKBENCH_WORKER": "1",
               **worker_thread_env(), **self.runtime.env()}
        if self.runtime.xla:
            env["PJRT_DEVICE"] = self.device.upper()
            if self.device == "cpu":
                env["CPU_NUM_DEVICES"] = str(self.num_devices)
            if self.xla_flags:
                env["XLA_FLAGS"] = " ".join(self.xla_flags)
            if self.spmd:
                env["XLA_USE_SPMD"] = "1"
            if self.persistent_cache:
                env["TPU_WORKBENCH_XLA_CACHE"] = str(self.cache_folder())
        return env

    def cache_folder(self) -> Path:
        """The persistent compilation cache of this configuration: executables compiled for one
        device kind, device count and set of flags are of no use to another."""
        from ..environment.paths import cache_dir

        key = dataclasses.replace(self, explain_compiles=False, explain_executions=False,
                                  dump_hlo=False).label()
        return cache_dir() / "xla_cache" / re.sub(r"[^A-Za-z0-9_.=-]+", "_", key).strip("_")

    def label(self) -> str:
        """Short human-readable name, e.g. ``xla:cpu x8 spmd``."""
        text = f"{self.runtime}:{self.device}"
        if self.runtime.xla:
            text += f" x{self.num_devices}"
        if self.spmd:
            text += " spmd"
        if self.xla_flags:
            text += " " + " ".join(self.xla_flags)
        if self.explain_compiles:
            text += " explain"
        if self.explain_executions:
            text += " explain-executions"
        if self.dump_hlo:
            text += " dump-hlo"
        if self.persistent_cache:
            text += " persistent-cache"
        return text


@dataclass(frozen=True)
class ExperimentSpec:
    """One experiment: train `model`/`preset` for `steps` steps in execution `mode`.

    Fields:
        model, preset: a model family and one of its size presets (see ``tpu_workbench.models``),
            or your own model, ``"path/to/file.py:make"`` or ``"package.module:make"``, kept as
            written (a path is relative to the current directory, which workers inherit), with
            its own presets, or ``"default"`` for a factory (:mod:`tpu_workbench.models.user`).
        mode: one of :data:`MODES` (``torch_eager``, ``inductor``, ``eager``, ``lazy``,
            ``compile``, ``dynamo``; TorchTPU on a chip: ``tpu_eager``, ``tpu_fused``,
            ``tpu_compile``); :func:`available_modes` lists those that run here.
        steps: training steps to run (the first one includes compilation). ``0`` with a mesh
            and an XLA mode (and no capture): build the model, place it on the mesh and report
            its layout only; nothing compiles.
        batch_size: None for the preset's default.
        seed: seeds the weights and the generated data.
        device: ``auto`` (TPU if one is free, else CPU), ``cpu``, ``tpu`` or ``cuda``.
        num_devices: virtual XLA:CPU devices; None (the default): the mesh's device count, or 8
            (a v6e-8 host) without a mesh. Ignored on a TPU. :attr:`device_count` says which.
        mesh, strategy: SPMD device mesh shape and sharding strategy (sharding issue); with
            ``torch_eager`` or a TorchTPU mode, a gang: one process per device under torchrun,
            DTensor over gloo (``tpu_dist`` on chips), see :mod:`tpu_workbench.runs.gang`.
        xla_flags: extra ``XLA_FLAGS``, e.g. ``("--xla_cpu_use_thunk_runtime=true",)``.
        capture: artifacts to capture in the worker: ``hlo`` (XLA's dumps), ``profile`` (a
            trace of the steps), ``checkpoint`` (the trained weights, ``model.pt``).
        options: model-config overrides, e.g. ``{"n_layer": 2}``.
        lr: learning rate (None for the model's default).
        optimizer: one of :data:`OPTIMIZERS` (``adamw``, or ``adafactor``: factored second
            moment, a few bytes per matrix row and column instead of 8 per weight).
        change, change_at: from step `change_at` on, make one change that forces XLA to
            compile again (one of :data:`CHANGES`), to see the recompilation and its cause.
        persistent_cache: keep compiled executables on disk between worker processes
            (``torch_xla.runtime.initialize_cache``, one folder per runtime configuration).
            XLA:CPU writes the cache but cannot read it back; the run's ``cache`` summary says so.
        explain_compiles: record torch_xla's cause for every compilation. It costs steady-state
            time (torch_xla's debug mode: ~20% on minGPT tiny), so it is off by default and on
            (None = auto) when `change` is set. Compilations are counted either way.
    """

    model: str = "mingpt"
    preset: str = "tiny"
    mode: str = "compile"
    steps: int = 20
    batch_size: int | None = None
    seed: int = 0
    device: str = "auto"
    num_devices: int | None = None
    mesh: tuple[int, ...] | None = None
    strategy: str | None = None
    xla_flags: tuple[str, ...] = ()
    capture: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    lr: float | None = None
    optimizer: str = "adamw"
    change: str | None = None
    change_at: int = 5
    explain_compiles: bool | None = None
    persistent_cache: bool = False

    def __post_init__(self) -> None:
        # Forgiving spellings of the sequence fields: capture="hlo" means ("hlo",) (not the
        # letters 'h', 'l', 'o'), xla_flags="--a --b" is split as XLA splits XLA_FLAGS, and
        # lists (what JSON gives back) become tuples. Anything else is left for validate().
        for name in ("capture", "xla_flags", "mesh"):
            value = getattr(self, name)
            if isinstance(value, str) and name != "mesh":
                value = (value,) if name == "capture" else tuple(value.split())
            elif isinstance(value, list):
                value = tuple(value)
            object.__setattr__(self, name, value)

    @property
    def device_count(self) -> int:
        """The XLA:CPU devices the run gets: `num_devices`, else the mesh's, else 8."""
        if self.num_devices is not None:
            return self.num_devices
        if isinstance(self.mesh, tuple) and self.mesh and all(
                _is_int(n) and n > 0 for n in self.mesh):
            return math.prod(self.mesh)
        return backends.DEFAULT_CPU_DEVICES

    def replace(self, **changes: Any) -> ExperimentSpec:
        """A copy with some fields changed (validated again when run)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mesh"] = list(self.mesh) if self.mesh else None
        d["xla_flags"] = list(self.xla_flags)
        d["capture"] = list(self.capture)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExperimentSpec:
        d = dict(d)
        if d.get("mesh") is not None:
            d["mesh"] = tuple(d["mesh"])
        for key in ("xla_flags", "capture"):
            if key in d:
                d[key] = tuple(d[key])
        return cls(**d)

    def validate(self) -> ExperimentSpec:
        """Check every field; raise :class:`SpecError` naming the bad value. Returns self."""
        # One check per field, in the order a reader finds them in the dataclass: long, not deep.
        from .. import models  # imports torch (not torch_xla)

        _check_types(self)  # first: the checks below look values up in dicts and do arithmetic
        if self.mode not in MODES:
            raise SpecError(f"unknown mode {self.mode!r}; valid modes: {', '.join(MODES)}")
        _check_runtime(self)
        family = models.get_model(self.model)  # raises SpecError for an unknown model
        _check_option_types(family, self.preset, self.options)
        cfg = family.config(self.preset, **self.options)  # raises for a bad preset or option
        if _is_int(self.steps) and self.steps == 0:  # lay the model out on a mesh, no step
            if self.mesh is None or not MODES[self.mode].runtime.xla or self.capture:
                raise SpecError("steps=0 (lay the model out, train no step) needs a mesh and an "
                                "XLA mode and captures nothing, e.g. mesh=(2, 4), "
                                "mode='compile'; otherwise steps must be a positive int")
        else:
            _positive_int("steps", self.steps)
        if self.batch_size is not None:
            _positive_int("batch_size", self.batch_size)
        if self.optimizer not in OPTIMIZERS:
            raise SpecError(f"unknown optimizer {self.optimizer!r}; valid: "
                            f"{', '.join(OPTIMIZERS)}")
        if self.device not in DEVICES:
            raise SpecError(f"unknown device {self.device!r}; valid: {', '.join(DEVICES)}")
        if self.num_devices is not None:
            _positive_int("num_devices", self.num_devices)
        if self.device_count > MAX_CPU_DEVICES:
            raise SpecError(f"num_devices={self.device_count} is more than the "
                            f"{MAX_CPU_DEVICES} virtual devices XLA:CPU is tested with")
        for c in self.capture:
            if c not in CAPTURES:
                raise SpecError(f"unknown capture {c!r}; valid: {', '.join(CAPTURES)}")
        if "hlo" in self.capture and not MODES[self.mode].hlo:
            raise SpecError("capture='hlo' needs a mode that compiles HLO ("
                            + ", ".join(m for m, v in MODES.items() if v.hlo)
                            + f"); mode {self.mode!r} compiles none")
        if self.change is not None:
            if self.change not in CHANGES:
                raise SpecError(f"unknown change {self.change!r}; valid: {', '.join(CHANGES)}")
            if not 0 < self.change_at < self.steps:
                raise SpecError(f"change_at must be a step between 1 and steps-1={self.steps - 1}, "
                                f"got {self.change_at!r}")
            if self.change == "seq_len" and family.sequence_dim is None:
                raise SpecError(f"change='seq_len' needs a sequence model (mingpt); model "
                                f"{self.model!r} has fixed-size inputs")
        if self.persistent_cache and not MODES[self.mode].runtime.xla:
            raise SpecError(f"persistent_cache=True needs an XLA mode (eager, lazy, compile, "
                            f"dynamo); mode {self.mode!r} compiles no XLA executables")
        if self.mesh is not None:
            if MODES[self.mode].runtime.gang_device:  # a process per device (torchrun)
                _check_gang(self)
            if self.num_devices is not None and math.prod(self.mesh) != self.num_devices:
                raise SpecError(
                    f"mesh {'x'.join(map(str, self.mesh))} has {math.prod(self.mesh)} devices but "
                    f"num_devices={self.num_devices}; use a mesh whose sizes multiply to "
                    f"{self.num_devices} or set num_devices={math.prod(self.mesh)}")
        if self.mesh is not None:
            from .. import sharding

            # strategy, mesh rank, batch divisible by the data axis, widths by the model axis
            sharding.validate(self.mesh, self.strategy, family, cfg,
                              self.batch_size or family.default_batch_size(cfg))
        elif self.strategy is not None:
            raise SpecError(f"strategy={self.strategy!r} needs a mesh, e.g. mesh=(2, 4)")
        from ..environment.xla_flags import validate_xla_flags

        validate_xla_flags(self.xla_flags)
        return self


SEED_RANGE = (-(2**63), 2**64 - 2)  # torch.manual_seed's; the evaluation batch uses seed + 1
_TEXT_FIELDS = {"model": "mingpt", "preset": "tiny", "mode": "compile", "device": "auto",
                "optimizer": "adamw"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_types(spec: ExperimentSpec) -> None:
    """Every field has the type it must have (the values are checked after this)."""
    for name, example in _TEXT_FIELDS.items():
        value = getattr(spec, name)
        if not isinstance(value, str):
            raise SpecError(f"{name} must be a string like {example!r}, got {value!r}")
    for name, valid in (("strategy", "dp, fsdp, tp, dp_tp, table, row, column"),
                        ("change", ", ".join(CHANGES))):
        value = getattr(spec, name)
        if value is not None and not isinstance(value, str):
            raise SpecError(f"{name} must be None or one of {valid} (a string), got {value!r}")
    lo, hi = SEED_RANGE
    if not _is_int(spec.seed) or not lo <= spec.seed <= hi:
        raise SpecError(f"seed must be an int from -2**63 to 2**64 - 2 (torch.manual_seed's "
                        f"range; the evaluation batch uses seed + 1), got {spec.seed!r}")
    if not _is_int(spec.change_at):
        raise SpecError(f"change_at must be an int (the step `change` starts at), got "
                        f"{spec.change_at!r}")
    lr = spec.lr
    if lr is not None and not (isinstance(lr, int | float) and not isinstance(lr, bool)
                               and math.isfinite(lr) and lr > 0):
        raise SpecError(f"lr must be a positive finite number or None, got {lr!r}")
    if not isinstance(spec.persistent_cache, bool):
        raise SpecError(f"persistent_cache must be True or False, got {spec.persistent_cache!r}")
    if spec.explain_compiles is not None and not isinstance(spec.explain_compiles, bool):
        raise SpecError(f"explain_compiles must be True, False or None (auto), got "
                        f"{spec.explain_compiles!r}")
    for name, example in (("capture", "('hlo', 'profile')"),
                          ("xla_flags", "('--xla_cpu_use_thunk_runtime=true',)")):
        if not isinstance(getattr(spec, name), tuple):
            raise SpecError(f"{name} must be a tuple of strings like {example}, got "
                            f"{getattr(spec, name)!r}")
    mesh = spec.mesh
    if mesh is not None and (not isinstance(mesh, tuple) or not mesh
                             or any(not _is_int(n) or n <= 0 for n in mesh)):
        raise SpecError(f"mesh must be a tuple of positive ints like (2, 4), or None, got "
                        f"{mesh!r}")
    if not isinstance(spec.options, dict) or any(not isinstance(k, str) for k in spec.options):
        raise SpecError(f"options must be a dict of model-config overrides with string keys, "
                        f"e.g. {{'n_layer': 4}}, got {spec.options!r}")


def _check_option_types(family: Any, preset: str, options: dict[str, Any]) -> None:
    """Each option has the type of the preset's value it overrides (True is no int, "2" no
    int, 2.0 no int); the family's own check_config then checks the values."""
    base = family.presets.get(preset)
    if base is None:
        return  # family.config names the valid presets
    for key, value in options.items():
        default = getattr(base, key, None)
        if default is None:
            continue  # an unknown option: family.config lists the valid ones
        if isinstance(default, bool):
            ok, want = isinstance(value, bool), "True or False"
        elif isinstance(default, int):
            ok, want = _is_int(value), "an int"
        elif isinstance(default, float):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            ok, want = ok and math.isfinite(value), "a finite number"
        elif isinstance(default, str):
            ok, want = isinstance(value, str), "a string"
        elif isinstance(default, tuple | list):
            inner = type(default[0]) if default else int
            ok = isinstance(value, tuple | list) and all(
                _is_int(v) if inner is int else isinstance(v, inner) for v in value)
            want = f"a tuple of {inner.__name__}s"
        else:
            continue
        if not ok:
            raise SpecError(f"{family.name} option {key} must be {want} (preset {preset!r} has "
                            f"{default!r}), got {value!r}")


def _check_runtime(spec: ExperimentSpec) -> None:
    """The mode's runtime must be installed here (XLA and TorchTPU live in two environments)."""
    import importlib.util
    import sys

    runtime = MODES[spec.mode].runtime
    if runtime.xla and not backends.have_torch_xla():
        raise SpecError(f"mode {spec.mode!r} needs torch_xla, which is not installed in this "
                        f"environment ({sys.prefix}); use .venv (python3 scripts/dev.py setup), "
                        f"or here a plain PyTorch mode (torch_eager, inductor)"
                        + (" or a TorchTPU mode on a TPU (tpu_eager, tpu_fused, tpu_compile)"
                           if importlib.util.find_spec("torch_tpu") else ""))
    if runtime is Runtime.TORCH_TPU:
        from ..environment import torchtpu

        torchtpu.require(spec)
    if spec.model == "resnet" and importlib.util.find_spec("torchvision") is None:
        raise SpecError(f"model 'resnet' needs torchvision, which is not installed in this "
                        f"environment ({sys.prefix}; PyPI's torchvision does not import beside "
                        "torch 2.13 in .venv-torchtpu); use .venv, or mingpt, unet or mlp here")


GANG_MODES = ("torch_eager", "tpu_eager", "tpu_fused", "tpu_compile")


def _check_gang(spec: ExperimentSpec) -> None:
    """A mesh with a plain-PyTorch or TorchTPU mode runs as a gang, one process per device
    under torchrun with DTensor (:mod:`tpu_workbench.runs.gang`): gloo on the CPU, tpu_dist on
    chips. What a gang does not offer is refused here, before anything starts."""
    if spec.mode not in GANG_MODES:
        raise SpecError(f"mesh={spec.mesh} with mode {spec.mode!r}: a mesh runs SPMD in an XLA "
                        f"mode (eager, lazy, compile, dynamo) or as a gang of processes in "
                        f"{', '.join(GANG_MODES)}; inductor is not offered for a gang")
    if MODES[spec.mode].runtime.gang_device == "cpu" and spec.device not in ("auto", "cpu"):
        raise SpecError(f"device={spec.device!r} with mesh={spec.mesh}: a plain-PyTorch gang "
                        "runs on the CPU (gloo); use device='auto' or 'cpu'")
    from ..sharding.mesh import EMBEDDING_STRATEGIES

    if spec.strategy in EMBEDDING_STRATEGIES:
        raise SpecError(f"strategy {spec.strategy!r} with mode {spec.mode!r}: the embedding "
                        "strategies run under SPMD (an XLA mode: eager, lazy, compile, dynamo); "
                        "a gang of processes offers dp, fsdp, tp and dp_tp")
    for name, value in (("capture", spec.capture), ("change", spec.change)):
        if value:
            raise SpecError(f"{name}={value!r} is not offered for a gang (mesh={spec.mesh} with "
                            f"mode {spec.mode!r}); run it in one process (no mesh) or SPMD")


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecError(f"{name} must be a positive int, got {value!r}")


def runtime_config(spec: ExperimentSpec) -> RuntimeConfig:
    """The worker configuration that can run `spec` (validates the spec's device first)."""
    runtime = MODES[spec.mode].runtime
    if spec.mesh is not None and runtime.gang_device:  # a gang: torchrun's ranks
        return RuntimeConfig(runtime, runtime.gang_device)
    device = runtime.device(spec.device)
    if not runtime.xla:
        return RuntimeConfig(runtime, device)
    explain = spec.explain_compiles
    if explain is None:
        explain = spec.change is not None
    return RuntimeConfig(runtime, device, spec.device_count if device == "cpu" else 0,
                         spmd=spec.mesh is not None, xla_flags=tuple(spec.xla_flags),
                         explain_compiles=explain, dump_hlo="hlo" in spec.capture,
                         persistent_cache=spec.persistent_cache)
