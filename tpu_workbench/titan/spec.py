"""A TorchTitan run (:class:`TitanSpec`): TorchTitan's trainer over a gang of ranks, with the
TOML it trains and the degrees it lays the model out with, checked before any rank starts.

A TitanSpec is an :class:`~tpu_workbench.runs.spec.ExperimentSpec` with a mesh (the degrees
above 1), so the runner treats it as any gang run: one results folder, streamed records,
reuse. Its ranks run :mod:`tpu_workbench.worker.titan` under the interpreter that has
TorchTitan (``.venv-torchtpu``; :func:`titan_python`), whichever environment starts them.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..environment import torchtpu
from ..errors import SpecError
from ..runs.spec import ExperimentSpec
from . import DEFAULT_CONFIG, SHIPPED
from . import config as titan_config

SUPPORTED_VERSION = "0.3.0"  # the TorchTitan the launcher was written against
RANK_MODULE = "tpu_workbench.worker.titan"
MODEL = "titan:llama3"


@dataclass(frozen=True)
class TitanSpec(ExperimentSpec):
    """TorchTitan's trainer on `config` (TOML text) over `ranks` processes.

    `dp_shard`, `tp`, `pp` replace the TOML's degrees (None keeps them; ``dp_shard`` -1 takes
    what the others leave), `global_batch` (sequences per step, split over the data-parallel
    ranks) and `seq_len` the TOML's batch and sequence length, `steps` and `seed` its steps and
    TorchTitan's ``debug.seed``. Build one with :func:`titan_spec`, which fills in ``model``,
    ``preset`` (the flavor), ``mode``, ``mesh`` (the degrees above 1) and ``strategy``.
    """

    config: str = ""
    config_name: str = DEFAULT_CONFIG
    ranks: int = 4
    dp_shard: int | None = None
    tp: int | None = None
    pp: int | None = None
    global_batch: int | None = None
    seq_len: int | None = None

    packages: ClassVar[tuple[str, ...]] = ("torchtitan",)  # what the fingerprint adds

    def replace(self, **changes: Any) -> TitanSpec:
        """A copy with some fields changed, its derived fields made again."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name in _OWN}
        return titan_spec(**{**fields, **changes})

    def read(self) -> titan_config.TitanConfig:
        """The TOML (``config`` empty: the shipped one named ``config_name``)."""
        return titan_config.read(self.config or SHIPPED[self.config_name], self.config_name)

    def compact(self) -> dict[str, Any]:
        """:meth:`to_dict` with a shipped config's text left out (its name says which), for a
        job file a launch plan writes on every host."""
        d = self.to_dict()
        shipped = SHIPPED.get(self.config_name)
        if shipped is not None and shipped.read_text() == self.config:
            d["config"] = ""
        return d

    def degrees(self) -> dict[str, int]:
        return titan_config.resolve_degrees(self.read(), self.ranks, dp_shard=self.dp_shard,
                                            tp=self.tp, pp=self.pp)

    def worker_python(self) -> str:
        """The interpreter the ranks run under (the one with TorchTitan)."""
        return titan_python()

    def gang_launch(self, out_dir: Path) -> tuple[str, str, dict[str, Any]]:
        """What :class:`tpu_workbench.runs.gang.Gang` starts for this run: the interpreter and
        module of each rank (their job file holds the spec and the run's folder `out_dir`, for
        TorchTitan's own output; each rank derives the rest, :func:`rank_job`). Makes the data
        first, so the ranks do not all make it at once."""
        from . import data

        data.assets()
        return titan_python(), RANK_MODULE, {"dump_to": str(out_dir)}

    def validate(self, check_env: bool = True) -> TitanSpec:
        """Everything checked before a rank starts: the TOML (keys, types, model), the
        degrees against the ranks, the batch against the data-parallel ranks, the sequence
        length against tp, steps and seed, and (`check_env`) that ``.venv-torchtpu`` holds
        TorchTitan here."""
        for name in ("ranks", "steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise SpecError(f"seed must be a non-negative int (TorchTitan's debug.seed), got "
                            f"{self.seed!r}")
        cfg = self.read()
        degrees = self.degrees()
        if degrees["pp"] > 1:
            raise SpecError(f"pp={degrees['pp']}: TorchTitan 0.3.0's pipeline parallelism fails "
                            "on torch 2.13 (checked here), so runs take dp_shard and tp; "
                            "`predict --titan-config` plans the rest")
        if degrees["cp"] > 1 or degrees["dp_replicate"] > 1:
            raise SpecError(f"{titan_config.strategy_label(degrees)}: runs here take dp_shard "
                            "(FSDP2) and tp; context parallelism and replicated data "
                            "parallelism are not offered")
        titan_config.batch(cfg, degrees, self.global_batch)
        seq = self.seq_len if self.seq_len is not None else cfg.seq_len
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 2 or seq % degrees["tp"]:
            raise SpecError(f"seq_len {seq!r} must be an int of at least 2 that tp="
                            f"{degrees['tp']} divides (sequence parallelism splits it)")
        if self.device not in ("auto", "cpu", "tpu"):
            raise SpecError(f"device {self.device!r}: TorchTitan runs here on 'cpu' (gloo) or a "
                            "TPU's 'tpu' device (TorchTitan's own fallback, 'cuda', is not "
                            "offered); use 'auto'")
        if check_env:
            require_titan()
        return self


# What every local run changes besides the TOML's replaced keys (cfg.notes names those).
LOCAL_NOTES = [
    "metrics every step (metrics.log_freq 1), the held-out loss after the first and the last "
    "step (validator.enable, validator.freq = steps)",
    "attention: causal SDPA on each rank's heads (tpu_workbench.worker.titan_overrides: "
    "FlexAttention has no backward on a CPU)",
    "parallelism.spmd_backend partial_dtensor (0.3.0's default, spmd_types, refuses FSDP2 over "
    "gloo here: 'all parameters must be DTensors on the full SPMD mesh')",
]


def command(spec: TitanSpec, tokenizer: str, dump_folder: str) -> list[str]:
    """TorchTitan's command line of a local run of `spec`: the TOML's keys and the degrees
    (:func:`tpu_workbench.titan.config.torchtitan_args`), then what the run sets itself
    (:data:`LOCAL_NOTES`, the data and tokenizer made here, the steps, batch, seed)."""
    cfg = spec.read()
    degrees = spec.degrees()
    local, total = titan_config.batch(cfg, degrees, spec.global_batch)
    steps = spec.steps
    overrides: dict[str, Any] = {
        "hf_assets_path": tokenizer, "dump_folder": dump_folder,
        "dataloader.dataset": "workbench_train",
        "validator.dataloader.dataset": "workbench_heldout",
        "validator.enable": True, "validator.freq": steps,
        "validator.steps": int(cfg.get("validation.steps", 4)),
        "metrics.log_freq": 1, "metrics.disable_color_printing": True,
        "training.steps": steps, "training.local_batch_size": local,
        "training.global_batch_size": total, "debug.seed": spec.seed,
        "parallelism.spmd_backend": "partial_dtensor",
        "override.imports": "tpu_workbench.worker.titan_overrides.causal_sdpa",
    }
    if spec.seq_len is not None:
        overrides["training.seq_len"] = spec.seq_len
    return titan_config.torchtitan_args(cfg, degrees, overrides=overrides)


def rank_job(spec: TitanSpec, out_dir: str) -> dict[str, Any]:
    """What a rank of `spec` runs, derived where it runs (a TPU VM of a launch plan makes its
    own data): TorchTitan's command line (``args``), the data and tokenizer folders
    (``assets``), the layout's label, the batch, and the notes of what a local run replaces.
    TorchTitan's own output goes to ``<out_dir>/titan``."""
    from ..environment.paths import cache_dir
    from . import data

    assets = {k: str(v) for k, v in data.assets().items()}
    cfg = spec.read()
    degrees = spec.degrees()
    local, total = titan_config.batch(cfg, degrees, spec.global_batch)
    seq = spec.seq_len if spec.seq_len is not None else cfg.seq_len
    return {"args": command(spec, assets["tokenizer"], str(Path(out_dir) / "titan")),
            "assets": assets, "label": titan_config.strategy_label(degrees),
            "datasets_cache": str(cache_dir() / "titan" / "hf_datasets"),
            "notes": cfg.notes + LOCAL_NOTES, "degrees": degrees, "local_batch": local,
            "global_batch": total, "seq_len": seq, "tokens_per_step": total * seq}


_OWN = ("config", "config_name", "ranks", "dp_shard", "tp", "pp", "global_batch", "seq_len",
        "steps", "seed", "device")


def titan_spec(config: str | Path | None = None, ranks: int = 4, *, dp_shard: int | None = None,
               tp: int | None = None, pp: int | None = None, steps: int = 30, seed: int = 0,
               global_batch: int | None = None, seq_len: int | None = None,
               device: str = "auto", config_name: str | None = None,
               check_env: bool = True) -> TitanSpec:
    """A :class:`TitanSpec` of `config` (a path, a shipped name such as ``llama3_8b`` or
    TOML text; default :data:`~tpu_workbench.titan.DEFAULT_CONFIG`), validated. Raises
    SpecError for anything :meth:`TitanSpec.validate` refuses, before any rank starts
    (``check_env=False``: not whether TorchTitan is installed here, for a plan of another
    machine's run)."""
    source = config if config is not None else SHIPPED[DEFAULT_CONFIG]
    cfg = titan_config.read(source, config_name)
    spec = TitanSpec(config=cfg.text, config_name=cfg.name, ranks=ranks, dp_shard=dp_shard,
                     tp=tp, pp=pp, global_batch=global_batch, seq_len=seq_len, steps=steps,
                     seed=seed, device=device)
    degrees = spec.degrees()
    on_tpu = device == "tpu" or (device == "auto" and torchtpu.status().available)
    mesh = tuple(v for v in degrees.values() if v > 1) or (1,)
    spec = dataclasses.replace(spec, model=MODEL, preset=cfg.flavor,
                               mode="tpu_eager" if on_tpu else "torch_eager", mesh=mesh,
                               strategy=workbench_strategy(degrees))
    return spec.validate(check_env)


def workbench_strategy(degrees: dict[str, int]) -> str:
    """The workbench's name for a layout (its sharding tables and plans use it): ``fsdp``,
    ``tp``, ``fsdp_tp`` (TorchTitan's 2-D FSDP2 x TP), ``dp``; else the degrees as text."""
    shard, tp = degrees["dp_shard"], degrees["tp"]
    rest = degrees["dp_replicate"] * degrees["cp"] * degrees["pp"]
    if rest == 1:
        if tp == 1:
            return "fsdp"
        return "tp" if shard == 1 else "fsdp_tp"
    if degrees["dp_replicate"] > 1 and shard == tp == rest // degrees["dp_replicate"] == 1:
        return "dp"
    return titan_config.strategy_label(degrees)


# --------------------------------------------------------------------------------------------
# Where TorchTitan is installed (no import: read from the environment's site-packages)
# --------------------------------------------------------------------------------------------
def titan_python() -> str:
    """The interpreter with TorchTitan: this one if it has it, else ``.venv-torchtpu``'s."""
    if _version(sys.executable) is not None:
        return sys.executable
    return str(torchtpu.venv_python())


def _version(python: str) -> str | None:
    if python == sys.executable:
        from importlib import metadata

        try:
            return metadata.version("torchtitan")
        except metadata.PackageNotFoundError:
            return None
    lib = Path(python).parent.parent / "lib"
    for dist in sorted(lib.glob("python*/site-packages/torchtitan-*.dist-info")):
        return dist.name.removeprefix("torchtitan-").removesuffix(".dist-info")
    return None


def require_titan() -> str:
    """The version of TorchTitan the ranks will run; SpecError when there is none (no
    ``.venv-torchtpu``, or one without TorchTitan) or not the one the launcher supports."""
    python = titan_python()
    where = torchtpu.ROOT / torchtpu.VENV_NAME
    if python != sys.executable and not Path(python).exists():
        raise SpecError(f"TorchTitan runs in {torchtpu.VENV_NAME} (torch 2.13 + torchtitan "
                        f"{SUPPORTED_VERSION}), which does not exist at {where}: set it up with "
                        "`python3 scripts/dev.py setup-torchtpu`")
    version = _version(python)
    if version is None:
        raise SpecError(f"{where} has no torchtitan: run `python3 scripts/dev.py "
                        f"setup-torchtpu` again (requirements-torchtpu.txt pins torchtitan=="
                        f"{SUPPORTED_VERSION})")
    if version != SUPPORTED_VERSION:
        raise SpecError(f"torchtitan {version} is installed ({python}) but the launcher was "
                        f"written against {SUPPORTED_VERSION}: pip install "
                        f"torchtitan=={SUPPORTED_VERSION}")
    return version
