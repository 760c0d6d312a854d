"""Completed runs (:class:`RunResult`) on disk, and which may be reused instead of measured again.

The runner's results folders are the store (there is no second cache): a completed run's folder
``results/<run_id>/`` holds ``spec.json``, ``summary.json``, ``records.jsonl`` and
``environment.json``, which says where and when it was measured. A run may be reused only for
the same spec *and* the same environment :func:`fingerprint`: the package versions of the
worker's interpreter, the device kind and count, the XLA flags, the host CPU and a hash of the
workbench's measuring source (:data:`MEASURING_SOURCE` and this project's Pallas kernels: a
changed training loop, placement rule or kernel measures again) and, for a user's own model
(``model="my_model.py:make"``), a hash of that file's content and of the local modules it
imports (``model_source``: an edited model or helper measures again). A failed, cancelled or
half-written run (``-failed``, ``.partial``) never is.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..environment.backends import cpu_model, tpu_chips_on_pci, tpu_kind_on_pci
from ..environment.paths import results_dir
from ..models.user import source_digest
from ..records import records_frame
from .spec import ExperimentSpec, RuntimeConfig, runtime_config

if TYPE_CHECKING:
    import pandas as pd

# The packages whose version changes what a run measures (absent ones are recorded as None).
PACKAGES = ("torch", "torch_xla", "torch_tpu", "libtpu", "torchvision", "diffusers",
            "transformers")
ENVIRONMENT_FILE = "environment.json"


def fingerprint(config: RuntimeConfig, spec: ExperimentSpec | None = None) -> dict[str, Any]:
    """What a run's figures depend on besides its spec, known before any worker starts.

    With the `spec`, a user's own model (``file.py:make``, ``package.module:make``) adds
    ``model_source``, its file, the local modules it imports and a hash of their content: the
    spec holds only the ref, and an edited file (or helper) is another model. The workbench's
    own families are covered by the source hash.
    """
    own = getattr(spec, "worker_python", None)  # a spec whose processes run elsewhere
    python = own() if own is not None else config.runtime.python()
    env = {**os.environ, **config.env()}
    flags = env.get("XLA_FLAGS", "") if config.runtime.xla else ""
    model_source = source_digest(spec.model) if spec is not None else None
    return {
        "runtime": config.label(),
        "python": _python_version(python),
        "packages": dict(_versions(python, *getattr(spec, "packages", ()))),
        "device": _device(config),
        "xla_flags": " ".join(flags.split()),
        "host_cpu": _host_cpu(),
        "workbench_source": _source_hash(),
        **({"model_source": model_source} if model_source is not None else {}),
    }


@dataclass
class RunResult:
    """A finished run: its spec, streamed records, summary and where its artifacts are."""

    spec: ExperimentSpec
    run_id: str
    runtime: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    out_dir: Path | None
    wall_s: float
    artifacts: dict[str, str] = field(default_factory=dict)
    measured_at: str = ""  # local time the run ended, "2026-12-01 12:03:04"
    reused: bool = False  # loaded from the results folder instead of measured now
    worker_start_s: float = 0.0  # spawn to ready of a fresh worker (0: a warm one served it)
    fingerprint: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self):
        """Per-step records as a DataFrame (one row per streamed ``step`` record)."""
        return records_frame(self.records)


def reusable(spec: ExperimentSpec, task: str = "train", out_dir: Path | None = None,
             cold: bool = False) -> RunResult | None:
    """The newest completed run of `spec` in the results folder that was measured in this very
    environment (same :func:`~tpu_workbench.runs.store.fingerprint`), or None. With `cold`, only a
    run measured in a fresh worker counts (a warm worker's first step may compile nothing)."""
    fp = fingerprint(runtime_config(spec), spec)
    folder = find_folder(spec, task, fp, out_dir or results_dir(), cold=cold)
    return None if folder is None else load_result(folder, type(spec))


def load_result(folder: Path, spec_type: type[ExperimentSpec] = ExperimentSpec) -> RunResult:
    """A completed run, read back from its results folder (``reused=True``); `spec_type`: the
    spec's class (a :class:`~tpu_workbench.generation.spec.GenerationSpec` for a generate run)."""
    environment = json.loads((folder / ENVIRONMENT_FILE).read_text())
    spec = spec_type.from_dict(json.loads((folder / "spec.json").read_text()))
    with (folder / "records.jsonl").open() as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    return RunResult(spec, folder.name, environment.get("runtime") or {}, records,
                     json.loads((folder / "summary.json").read_text()), folder,
                     float(environment.get("wall_s") or 0.0), artifacts=artifacts(folder),
                     measured_at=str(environment.get("measured_at") or ""), reused=True,
                     worker_start_s=float(environment.get("worker_start_s") or 0.0),
                     fingerprint=environment.get("fingerprint") or {})


def derived(result: RunResult, name: str, compute: Callable[[], dict[str, Any]]
            ) -> dict[str, Any]:
    """A JSON-ready figure computed from a completed run's files, kept in its folder as
    ``derived/NAME.json`` (written whole) so that showing the run again reads it instead of
    computing it again. A run's folder never changes once written, and a reused run comes from
    the same workbench source (its fingerprint), so the kept figure stays true."""
    folder = result.out_dir
    path = None if folder is None else Path(folder) / "derived" / f"{name}.json"
    if path is not None and path.is_file():
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text())
    value = compute()
    if path is not None:
        with contextlib.suppress(OSError):  # a read-only results folder: just not kept
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(value))
            os.replace(tmp, path)
    return value


def derived_frame(result: RunResult, name: str, compute: Callable[[], pd.DataFrame]
                  ) -> pd.DataFrame:
    """:func:`derived` for a DataFrame of plain values (kept with its columns and dtypes)."""
    import io

    import pandas as pd

    kept = derived(result, name, lambda: json.loads(compute().to_json(orient="table")))
    return pd.read_json(io.StringIO(json.dumps(kept)), orient="table")


def artifacts(folder: Path) -> dict[str, str]:
    """Every file under a run's folder: its path relative to the folder -> its full path."""
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): str(p) for p in sorted(folder.rglob("*"))
            if p.is_file()}


def find_folder(spec: ExperimentSpec, task: str, fp: dict[str, Any], root: Path,
                cold: bool = False) -> Path | None:
    """The newest completed run folder under `root` for `spec`, `task` and fingerprint `fp`;
    with `cold`, only a run that was its worker's first (no compile cache could serve it)."""
    if not root.is_dir():
        return None
    want = _canonical(spec.to_dict())
    found: list[tuple[str, Path]] = []
    for folder in root.iterdir():
        if folder.name.endswith(("-failed", ".partial")) or not folder.is_dir():
            continue
        try:
            env = json.loads((folder / ENVIRONMENT_FILE).read_text())
            stored = json.loads((folder / "spec.json").read_text())
            complete = (folder / "summary.json").is_file() and (folder / "records.jsonl").is_file()
        except (OSError, ValueError):  # not a run folder, or an older run without environment
            continue
        first = float(env.get("worker_start_s") or 0.0) > 0  # a fresh worker ran it
        if (complete and env.get("task") == task and env.get("fingerprint") == fp
                and _canonical(stored) == want and (first or not cold)):
            found.append((str(env.get("measured_at", "")), folder))
    return max(found)[1] if found else None


def _canonical(d: dict[str, Any]) -> str:
    return json.dumps(d, sort_keys=True, default=str)


@functools.cache
def _versions(python: str, *extra: str) -> tuple[tuple[str, str | None], ...]:
    names = (*PACKAGES, *extra)
    if python == sys.executable:  # a lookup by name: walking every distribution took 0.1-0.4 s
        found_here: dict[str, str | None] = {}
        for name in names:
            try:
                found_here[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                found_here[name] = None
        return tuple(found_here.items())
    # another environment (.venv-torchtpu): read its site-packages without running it
    lib = Path(python).resolve().parent.parent / "lib"
    paths = [str(p) for p in lib.glob("python*/site-packages")] or [
        str(p) for p in (Path(python).parent.parent / "lib").glob("python*/site-packages")]
    found: dict[str, str | None] = dict.fromkeys(names)
    for dist in metadata.distributions(path=paths):
        name = (dist.metadata["Name"] or "").lower().replace("-", "_")
        if name in found and found[name] is None:
            found[name] = dist.version
    return tuple(found.items())


def _python_version(python: str) -> str:
    if python == sys.executable:
        return platform.python_version()
    lib = Path(python).parent.parent / "lib"
    return ",".join(sorted(p.name for p in lib.glob("python*"))) or python


def _device(config: RuntimeConfig) -> dict[str, Any]:
    if config.device == "tpu":
        return {"kind": tpu_kind_on_pci() or "TPU", "count": len(tpu_chips_on_pci())}
    count = config.num_devices if config.runtime.xla else 1
    return {"kind": config.device, "count": count}


# The workbench's source that decides what a run measures (not the charts or notebook helpers):
# the worker, the models, the placement rules the worker lays a mesh out with (sharding/), the
# specs; and this project's Pallas kernels (:func:`kernels_package`).
PACKAGE = Path(__file__).resolve().parents[1]  # tpu_workbench/
MEASURING_SOURCE = ("worker", "models", "sharding", "runs/spec.py", "generation/spec.py",
                    "generation/analysis.py", "titan/config.py", "titan/data.py",
                    "titan/spec.py")
# Files only this project's top-level ``kernels`` has (``kernels`` is also a Hugging Face
# package's name): minGPT's attention="pallas" imports kernels.torch_bridge.
KERNELS_MARKERS = ("torch_bridge.py", "flash_attention.py")


def kernels_package() -> Path | None:
    """The folder of this project's ``kernels`` package (the Pallas kernels beside
    tpu_workbench/): the one the import system finds, if it is this project's, else the one
    beside :data:`PACKAGE`; None where neither is (nothing of it to hash)."""
    candidates = []
    with contextlib.suppress(ImportError, ValueError):  # finding it imports nothing
        spec = importlib.util.find_spec("kernels")
        if spec is not None and spec.origin:
            candidates.append(Path(spec.origin).resolve().parent)
    candidates.append(PACKAGE.parent / "kernels")
    return next((c for c in candidates if all((c / m).is_file() for m in KERNELS_MARKERS)),
                None)


@functools.cache
def _source_hash() -> str:
    kernels = kernels_package()
    roots = [(PACKAGE / part, PACKAGE) for part in MEASURING_SOURCE]
    roots += [(kernels, kernels.parent)] if kernels is not None else []
    digest = hashlib.sha256()
    for root, base in roots:
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            digest.update(path.relative_to(base).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def _host_cpu() -> str:
    return f"{cpu_model()} x{os.cpu_count()}"
