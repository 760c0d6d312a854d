"""A TorchTitan TOML, read and mapped onto TorchTitan 0.3.0's command line (pure: no torch).

TorchTitan shipped its configs as TOML up to v0.2.2 (``[job]``, ``[model]``, ``[training]``,
``[parallelism]``...; its Llama-3 files are in ``tpu_workbench/titan/configs/``); 0.3.0 builds a
``Trainer.Config`` from a ``config_registry`` function (``llama3_8b``...) and takes every other
setting as a command-line override (``--training.seq_len 8192``). :data:`KEYS` says, for every
TOML key the workbench knows, where 0.3.0 keeps it: a command-line field, the activation
checkpointing subcommand, or nowhere (an informational or a replaced key, with why). A key not
in the table is an error naming the key and its section's valid keys, raised before anything
starts; so is a value of the wrong type, a model other than Llama 3, a flavor without a
``config_registry`` function and degrees that do not multiply to the ranks.

``tests_torchtpu/test_titan.py`` checks that every field named here exists in the installed
TorchTitan's ``Trainer.Config``, so a release that moves one fails there.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError

# (kind, where, type). kind: "arg" (a 0.3.0 command-line field, `where` its dotted path), "ac"
# (activation checkpointing: a subcommand), "local" (a local run replaces it: `where` says with
# what), "info" (read, changes nothing), "model" (handled by the mapping itself).
Key = tuple[str, str, str]
KEYS: dict[str, dict[str, Key]] = {
    "job": {
        "dump_folder": ("local", "the run's own folder (results/<run_id>/titan)", "str"),
        "description": ("info", "a label", "str"),
        "print_config": ("arg", "debug.print_config", "bool"),
        "print_args": ("arg", "debug.print_config", "bool"),
        "use_for_integration_test": ("info", "TorchTitan's own CI", "bool"),
    },
    "profiling": {
        "enable_profiling": ("arg", "profiler.enable_profiling", "bool"),
        "save_traces_folder": ("arg", "profiler.save_traces_folder", "str"),
        "profile_freq": ("arg", "profiler.profile_freq", "int"),
        "enable_memory_snapshot": ("arg", "profiler.enable_memory_snapshot", "bool"),
        "save_memory_snapshot_folder": ("arg", "profiler.save_memory_snapshot_folder", "str"),
    },
    "metrics": {
        "log_freq": ("local", "log_freq 1 (the workbench records every step)", "int"),
        "disable_color_printing": ("arg", "metrics.disable_color_printing", "bool"),
        "enable_tensorboard": ("arg", "metrics.enable_tensorboard", "bool"),
        "save_tb_folder": ("arg", "metrics.save_tb_folder", "str"),
        "enable_wandb": ("arg", "metrics.enable_wandb", "bool"),
    },
    "model": {
        "name": ("model", "the config_registry module (llama3)", "str"),
        "flavor": ("model", "the config_registry function (llama3_<flavor>)", "str"),
        "hf_assets_path": ("local", "the workbench's own tokenizer (titan.data)", "str"),
        "tokenizer_path": ("local", "the workbench's own tokenizer (titan.data)", "str"),
        "converters": ("model", "quantization converters (float8, mx): not offered", "list"),
    },
    "optimizer": {
        "name": ("model", "AdamW (0.3.0's default_adamw)", "str"),
        "lr": ("arg", "optimizer.param_groups.0.optimizer_kwargs.lr", "float"),
        "eps": ("arg", "optimizer.param_groups.0.optimizer_kwargs.eps", "float"),
        "weight_decay": ("arg", "optimizer.param_groups.0.optimizer_kwargs.weight_decay",
                         "float"),
        "implementation": ("arg", "optimizer.implementation", "str"),
    },
    "lr_scheduler": {
        "warmup_steps": ("arg", "lr_scheduler.warmup_steps", "int"),
        "decay_ratio": ("arg", "lr_scheduler.decay_ratio", "float"),
        "decay_type": ("arg", "lr_scheduler.decay_type", "str"),
        "min_lr_factor": ("arg", "lr_scheduler.min_lr_factor", "float"),
    },
    "training": {
        "local_batch_size": ("arg", "training.local_batch_size", "int"),
        "batch_size": ("arg", "training.local_batch_size", "int"),  # before v0.2
        "global_batch_size": ("arg", "training.global_batch_size", "int"),
        "seq_len": ("arg", "training.seq_len", "int"),
        "max_norm": ("arg", "training.max_norm", "float"),
        "steps": ("arg", "training.steps", "int"),
        "dataset": ("local", "the workbench's own text (titan.data)", "str"),
        "dataset_path": ("local", "the workbench's own text (titan.data)", "str"),
        "mixed_precision_param": ("arg", "training.mixed_precision_param", "str"),
        "mixed_precision_reduce": ("arg", "training.mixed_precision_reduce", "str"),
        "dtype": ("arg", "training.dtype", "str"),
        "enable_cpu_offload": ("arg", "training.enable_cpu_offload", "bool"),
        "gc_freq": ("arg", "training.gc_freq", "int"),
        "compile": ("arg", "compile.enable", "bool"),  # before v0.2
    },
    "parallelism": {
        "data_parallel_replicate_degree": ("arg", "parallelism.data_parallel_replicate_degree",
                                           "int"),
        "data_parallel_shard_degree": ("arg", "parallelism.data_parallel_shard_degree", "int"),
        "fsdp_reshard_after_forward": ("arg", "parallelism.fsdp_reshard_after_forward", "str"),
        "tensor_parallel_degree": ("arg", "parallelism.tensor_parallel_degree", "int"),
        "enable_async_tensor_parallel": ("arg", "compile.enable_async_tensor_parallel", "bool"),
        "pipeline_parallel_degree": ("arg", "parallelism.pipeline_parallel_degree", "int"),
        "pipeline_parallel_schedule": ("arg", "parallelism.pipeline_parallel_schedule", "str"),
        "context_parallel_degree": ("arg", "parallelism.context_parallel_degree", "int"),
        "expert_parallel_degree": ("arg", "parallelism.expert_parallel_degree", "int"),
    },
    "checkpoint": {
        "enable": ("arg", "checkpoint.enable", "bool"),
        "enable_checkpoint": ("arg", "checkpoint.enable", "bool"),  # before v0.2
        "folder": ("arg", "checkpoint.folder", "str"),
        "interval": ("arg", "checkpoint.interval", "int"),
        "last_save_model_only": ("arg", "checkpoint.last_save_model_only", "bool"),
        "model_weights_only": ("arg", "checkpoint.last_save_model_only", "bool"),
        "export_dtype": ("arg", "checkpoint.export_dtype", "str"),
        "async_mode": ("arg", "checkpoint.async_mode", "str"),
    },
    "compile": {
        "enable": ("arg", "compile.enable", "bool"),
        "components": ("arg", "compile.components", "list"),
    },
    "activation_checkpoint": {
        "mode": ("ac", "activation-checkpoint:<mode> (none, selective, full)", "str"),
        "selective_ac_option": ("ac", "0.3.0's selective AC is by op; a layer count is not",
                                "str"),
    },
    "validation": {
        "enable": ("arg", "validator.enable", "bool"),
        "enabled": ("arg", "validator.enable", "bool"),
        "dataset": ("local", "the workbench's held-out text (titan.data)", "str"),
        "freq": ("arg", "validator.freq", "int"),
        "steps": ("arg", "validator.steps", "int"),
    },
}
# Float8 settings apply only with model.converters, which are refused: read, never applied.
for _section in ("float8", "quantize.linear.float8"):
    KEYS[_section] = {k: ("info", "float8 (model.converters) is not offered", t) for k, t in (
        ("enable_fsdp_float8_all_gather", "bool"),
        ("precompute_float8_dynamic_scale_for_fsdp", "bool"), ("filter_fqns", "list"))}

AC_MODES = ("none", "selective", "full")
# The Llama 3 flavors with a config_registry function in torchtitan 0.3.0, and their shapes
# (torchtitan.models.llama3.llama3_configs; checked against it in tests_torchtpu/test_titan.py).
REGISTRY = {"debugmodel": "llama3_debugmodel", "8B": "llama3_8b", "70B": "llama3_70b",
            "405B": "llama3_405b"}


@dataclass(frozen=True)
class Flavor:
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int


FLAVORS = {"debugmodel": Flavor(256, 6, 16, 16, 768, 2048),
           "8B": Flavor(4096, 32, 32, 8, 14336, 128256),
           "70B": Flavor(8192, 80, 64, 8, 28672, 128256),
           "405B": Flavor(16384, 126, 128, 8, 53248, 128256)}
DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp")  # TorchTitan's mesh order
_DEGREE_KEYS = {"dp_replicate": "data_parallel_replicate_degree",
                "dp_shard": "data_parallel_shard_degree", "cp": "context_parallel_degree",
                "tp": "tensor_parallel_degree", "pp": "pipeline_parallel_degree"}


@dataclass
class TitanConfig:
    """A TorchTitan TOML, read and checked: its values by ``section.key`` and what they mean."""

    name: str  # the file's stem, or "inline"
    text: str
    values: dict[str, Any]  # "section.key" -> value, every key of the file
    notes: list[str] = field(default_factory=list)  # keys read but not applied, and why

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    @property
    def flavor(self) -> str:
        return self.get("model.flavor", "debugmodel")

    @property
    def shape(self) -> Flavor:
        return FLAVORS[self.flavor]

    @property
    def degrees(self) -> dict[str, int]:
        """The TOML's parallel degrees (``dp_shard`` -1: whatever the others leave)."""
        return {d: int(self.get(f"parallelism.{k}", -1 if d == "dp_shard" else 1))
                for d, k in _DEGREE_KEYS.items()}

    @property
    def local_batch(self) -> int:
        return int(self.get("training.local_batch_size", self.get("training.batch_size", 8)))

    @property
    def seq_len(self) -> int:
        return int(self.get("training.seq_len", 2048))

    @property
    def ac_mode(self) -> str:
        return str(self.get("activation_checkpoint.mode", "selective"))

    @property
    def compile(self) -> bool:
        return bool(self.get("compile.enable", self.get("training.compile", False)))


def read(source: str | Path, name: str | None = None) -> TitanConfig:
    """A TorchTitan TOML: a path, a name of :data:`tpu_workbench.titan.SHIPPED`
    (``llama3_8b``) or the TOML text itself. Raises SpecError naming a missing file, a TOML
    syntax error, an unknown key (and its section's valid keys), a value of the wrong type, a
    model other than Llama 3 or a flavor TorchTitan 0.3.0 has no config for."""
    from . import SHIPPED

    text, name = _text(source, name, SHIPPED)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"TorchTitan config {name!r} is not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    notes: list[str] = []
    for section, key, value in _flatten(data):
        known = KEYS.get(section)
        if known is None:
            raise SpecError(f"TorchTitan config {name!r}: unknown section [{section}]; valid "
                            f"sections: {', '.join(f'[{s}]' for s in KEYS)}")
        if key not in known:
            raise SpecError(f"TorchTitan config {name!r}: unknown key {key!r} in [{section}]; "
                            f"valid keys there: {', '.join(known)}")
        kind, where, want = known[key]
        _check_type(name, f"{section}.{key}", value, want)
        values[f"{section}.{key}"] = value
        if kind == "local":
            notes.append(f"{section}.{key} = {value!r}: replaced here by {where}")
    config = TitanConfig(name, text, values, notes)
    _check_model(config)
    return config


def _text(source: str | Path, name: str | None, shipped: dict[str, Path]) -> tuple[str, str]:
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source
                                    and "=" not in source):
        path = shipped.get(str(source)) or Path(source)
        if not path.is_file():
            raise SpecError(f"TorchTitan config {str(source)!r} is neither a file nor a shipped "
                            f"config ({', '.join(shipped)})")
        return path.read_text(), name or path.stem
    if not isinstance(source, str):
        raise SpecError(f"a TorchTitan config is a path or TOML text, got {source!r}")
    return source, name or "inline"


def _flatten(data: dict[str, Any], prefix: str = ""):
    """(section, key, value) for every key; nested tables ([quantize.linear.float8]) joined."""
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        elif not prefix:
            raise SpecError(f"TorchTitan config key {key!r} is outside any [section]")
        else:
            yield prefix[:-1], key, value


def _check_type(name: str, key: str, value: Any, want: str) -> None:
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, int | float) and not isinstance(value, bool),
          "bool": isinstance(value, bool),
          "str": isinstance(value, str),
          "list": isinstance(value, list | str)}[want]
    if not ok:
        raise SpecError(f"TorchTitan config {name!r}: {key} must be {want}, got {value!r}")


def _check_model(config: TitanConfig) -> None:
    model = config.get("model.name", "llama3")
    if model != "llama3":
        raise SpecError(f"TorchTitan config {config.name!r}: model.name {model!r} is not "
                        "offered; the workbench runs and plans TorchTitan's Llama 3 (llama3)")
    if config.flavor not in REGISTRY:
        raise SpecError(f"TorchTitan config {config.name!r}: flavor {config.flavor!r} has no "
                        f"config_registry function in torchtitan 0.3.0; valid: "
                        f"{', '.join(REGISTRY)}")
    if config.get("model.converters"):
        raise SpecError(f"TorchTitan config {config.name!r}: model.converters "
                        f"{config.get('model.converters')!r} (float8, mx quantization) are not "
                        "offered; remove the key")
    if config.get("optimizer.name", "AdamW") != "AdamW":
        raise SpecError(f"TorchTitan config {config.name!r}: optimizer.name "
                        f"{config.get('optimizer.name')!r} is not offered; 0.3.0's configs "
                        "use AdamW")
    if config.ac_mode not in AC_MODES:
        raise SpecError(f"TorchTitan config {config.name!r}: activation_checkpoint.mode "
                        f"{config.ac_mode!r} is not one of {', '.join(AC_MODES)}")
    option = config.get("activation_checkpoint.selective_ac_option")
    if option is not None and str(option) != "op":
        config.notes.append(f"activation_checkpoint.selective_ac_option = {option!r}: TorchTitan "
                            "0.3.0 has no every-Nth-layer option; its selective AC (by op) runs")


def resolve_degrees(config: TitanConfig, ranks: int, **given: int | None) -> dict[str, int]:
    """The parallel degrees of a run over `ranks` processes (or chips): the TOML's, each
    replaced by `given` (``dp_shard``, ``tp``, ``pp``, ``cp``, ``dp_replicate``: None keeps the
    TOML's), ``dp_shard`` -1 taking what the others leave, as TorchTitan does. SpecError when
    they do not multiply to `ranks`, or a degree does not divide what it splits."""
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise SpecError(f"ranks must be a positive int, got {ranks!r}")
    degrees = config.degrees
    for key, value in given.items():
        if key not in degrees:
            raise SpecError(f"unknown parallel degree {key!r}; valid: {', '.join(DEGREES)}")
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or (
                    value < 1 and not (key == "dp_shard" and value == -1)):
                raise SpecError(f"{key} must be a positive int (dp_shard also -1: what the "
                                f"others leave), got {value!r}")
            degrees[key] = value
    others = math.prod(v for k, v in degrees.items() if k != "dp_shard")
    if degrees["dp_shard"] == -1:
        if ranks % others:
            raise SpecError(f"{_text_of(degrees, skip='dp_shard')} = {others} does not divide "
                            f"{ranks} ranks: pick degrees whose product divides {ranks}")
        degrees["dp_shard"] = ranks // others
    if math.prod(degrees.values()) != ranks:
        raise SpecError(f"{_text_of(degrees)} = {math.prod(degrees.values())}, not the {ranks} "
                        f"ranks: the degrees must multiply to the ranks (e.g. "
                        f"{_example(ranks, degrees['tp'])})")
    shape = config.shape
    for what, size in (("heads", shape.heads), ("kv_heads", shape.kv_heads),
                       ("ffn_hidden", shape.ffn_hidden), ("vocab", shape.vocab)):
        if size % degrees["tp"]:
            raise SpecError(f"tp={degrees['tp']} does not divide the {config.flavor} model's "
                            f"{size} {what}: use a tp that divides {size}")
    return degrees


def _text_of(degrees: dict[str, int], skip: str = "") -> str:
    return " x ".join(f"{k} {v}" for k, v in degrees.items() if k != skip)


def _example(ranks: int, tp: int) -> str:
    tp = tp if ranks % tp == 0 else 1
    return f"--dp-shard {ranks // tp} --tp {tp}"


def strategy_label(degrees: dict[str, int]) -> str:
    """A short name of a run's layout: ``FSDP2 x4``, ``TP x4``, ``FSDP2 2 x TP 2``..."""
    parts = []
    if degrees.get("dp_replicate", 1) > 1:
        parts.append(f"DDP {degrees['dp_replicate']}")
    if degrees.get("dp_shard", 1) > 1:
        parts.append(f"FSDP2 {degrees['dp_shard']}")
    for key, label in (("cp", "CP"), ("tp", "TP"), ("pp", "PP")):
        if degrees.get(key, 1) > 1:
            parts.append(f"{label} {degrees[key]}")
    return " x ".join(parts) or "one rank"


def batch(config: TitanConfig, degrees: dict[str, int], global_batch: int | None = None
          ) -> tuple[int, int]:
    """(local batch per data-parallel rank, global batch). `global_batch` (sequences per step)
    sets both, split over the data-parallel ranks; else the TOML's (its ``global_batch_size``,
    where set, accumulates gradients over several local batches)."""
    dp = degrees["dp_replicate"] * degrees["dp_shard"]
    if global_batch is not None:
        if not isinstance(global_batch, int) or isinstance(global_batch, bool) \
                or global_batch < 1 or global_batch % dp:
            raise SpecError(f"global batch {global_batch!r} must be a positive multiple of the "
                            f"{dp} data-parallel ranks ({_text_of(degrees)})")
        return global_batch // dp, global_batch
    local = config.local_batch
    total = int(config.get("training.global_batch_size", -1))
    if total > 0 and total % (local * dp):
        raise SpecError(f"training.global_batch_size {total} is not a multiple of "
                        f"local_batch_size {local} x {dp} data-parallel ranks")
    return local, total if total > 0 else local * dp


def torchtitan_args(config: TitanConfig, degrees: dict[str, int], *,
                    overrides: dict[str, Any] | None = None) -> list[str]:
    """TorchTitan 0.3.0's command line for `config` with `degrees`: ``--module llama3 --config
    llama3_<flavor>`` then one ``--section.field value`` per applied key, the degrees, then
    `overrides` (dotted 0.3.0 paths: what a local run sets itself), then the activation
    checkpointing subcommand. What ``torchrun ... -m torchtitan.train`` takes too."""
    fields: dict[str, Any] = {}
    for dotted, value in config.values.items():
        section, key = dotted.rsplit(".", 1)
        kind, where, _ = KEYS[section][key]
        if kind == "arg":
            fields[where] = value
    for d, key in _DEGREE_KEYS.items():
        fields[f"parallelism.{key}"] = degrees[d]
    fields.update(overrides or {})
    args = ["--module", "llama3", "--config", REGISTRY[config.flavor]]
    for path, value in fields.items():
        args += _flag(path, value)
    return [*args, f"activation-checkpoint:{config.ac_mode}"]


def _flag(path: str, value: Any) -> list[str]:
    if isinstance(value, bool):  # tyro's flags: --a.b / --a.no_b
        head, _, leaf = path.rpartition(".")
        return [f"--{path}" if value else f"--{head + '.' if head else ''}no_{leaf}"]
    if isinstance(value, list | tuple):
        return [f"--{path}", ",".join(map(str, value))]
    return [f"--{path}", str(value)]
