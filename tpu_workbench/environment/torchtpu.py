"""The TorchTPU backend (``torch_tpu`` 0.2.0): the native ``"tpu"`` device of PyTorch.

TorchTPU needs torch >= 2.11 (and libtpu >= 0.0.50), so it cannot share an environment with
torch_xla 2.9: it lives in ``.venv-torchtpu`` (``python3 scripts/dev.py setup-torchtpu``). A
notebook in the main ``.venv`` still drives it: the runner starts a TorchTPU worker with that
environment's interpreter (:func:`worker_python`).

Modes (``runtime="torch_tpu"`` in :data:`tpu_workbench.runs.spec.MODES`):

===============  ==========================================================================
``tpu_eager``    strict eager, ``torch.tpu.EagerMode.DEFER_NEVER`` (TorchTPU's default)
``tpu_fused``    fused eager, ``EagerMode.DEFER_AND_FUSE``: ops are deferred and fused
``tpu_compile``  ``torch.compile(model, backend="tpu", dynamic=False)``
===============  ==========================================================================

What a run records: per step the compile-cache counters of ``torch.tpu._get_cache_stats()``
(``compiles`` = new compilations, ``cached`` = cache hits, ``compile_ms`` = compile time of the
new cache entries, ``executions`` = cache requests); ``capture="hlo"`` with ``tpu_compile``
writes the StableHLO the ``debug_callback`` of ``torch.compile(..., options=...)`` hands back
(``hlo/*.stablehlo.txt``, FX graphs in ``hlo/*.fx.txt``); ``capture="profile"`` runs
``torch.profiler.profile(experimental_config=torch.tpu.profiler.TpuProfilerConfig(run_dir=...))``
(xprof's ``.xplane.pb`` under ``profile/``, plus a Chrome trace of the host side). Sharding runs
through DTensor, one process per chip: :mod:`tpu_workbench.scale.dtensor_sharding`.

Without a chip (every machine but a TPU VM) ``torch_tpu`` still imports and installs
``torch.tpu``, but it registers no ``"tpu"`` device and leaves ``torch.compile`` alone: the
TorchTPU modes are refused with a :class:`~tpu_workbench.errors.SpecError` that says what runs
instead (plain PyTorch: ``torch_eager``, ``inductor``). :data:`API` lists every ``torch_tpu`` /
``torch.tpu`` name this adapter calls; :func:`missing_api` looks each one up in the installed
wheel, so an API drift fails CI instead of a user's TPU session.

This module is the parent's half: nothing here imports torch at module import, so
:func:`status` and :func:`worker_python` are safe in the notebook's own process. The worker's half
(the device, the modes, cache counters, StableHLO capture, profiler) is
:mod:`tpu_workbench.worker.torchtpu`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SUPPORTED_VERSION = "0.2.0"  # the wheel this adapter was written against
VENV_NAME = ".venv-torchtpu"
ROOT = Path(__file__).resolve().parents[2]  # the checkout, beside .venv-torchtpu
FALLBACK = "plain PyTorch on CPU (modes torch_eager and inductor)"
FALLBACK_XLA = ("torch_xla on XLA:CPU (modes eager, lazy, compile, dynamo) and plain PyTorch "
                "(torch_eager, inductor)")


def fallback() -> str:
    """What runs here instead of the TorchTPU modes."""
    from .backends import have_torch_xla

    return FALLBACK_XLA if have_torch_xla() else FALLBACK

# Every name the adapter calls, as a dotted path: a module, then attributes. Checked by import
# and attribute lookup (missing_api). All of them exist in the 0.2.0 wheel without a chip:
# torch_tpu's public table (torch_tpu._internal.public_api._PUBLIC_MODULES) installs the whole
# torch.tpu namespace on import; only *calling* the device functions needs a chip.
API: tuple[str, ...] = (
    # device and synchronisation (torch.tpu.is_available() & co raise in 0.2.0: use accelerator)
    "torch.accelerator.is_available",
    "torch.accelerator.device_count",
    "torch.accelerator.synchronize",
    "torch.tpu.get_device_name",
    "torch.tpu.get_device_properties",
    "torch_tpu._internal.utils.hardware.get_tpu_device_count",
    "torch_tpu._internal.utils.hardware.get_bf16_flops_per_device",
    "torch_tpu._internal.utils.hardware.get_hbm_bytes_per_device",
    # modes
    "torch.tpu.EagerMode.DEFER_NEVER",
    "torch.tpu.EagerMode.DEFER_AND_FUSE",
    "torch.tpu.eager_mode",
    "torch.tpu.set_eager_mode",
    # compile: backend "tpu", the debug callback's payload, resets between runs
    "torch._dynamo.list_backends",
    "torch_tpu._internal.compile.TpuCompileDebug",
    "torch_tpu._internal.compile.TpuCompileDebug.stablehlo_forward_text",
    "torch_tpu._internal.compile.TpuCompileDebug.stablehlo_backward_text",
    "torch_tpu._internal.compile.TpuCompileDebug.pre_autograd_fx_readable",
    "torch.compiler.reset",
    # compile-cache statistics
    "torch.tpu._get_cache_stats",
    "torch.tpu._clear_cache",
    "torch.tpu._hbm_usage_summary",
    # profiling
    "torch.tpu.profiler.TpuProfilerConfig",
    "torch.profiler.profile",
    "torch.profiler.ProfilerActivity.CPU",
    "torch.profiler.ProfilerActivity.PrivateUse1",
    "torch.profiler.record_function",
    # sharding (DTensor, one process per chip)
    "torch.tpu.distributed.set_tpu_launch_env",
    "torch.distributed.init_process_group",
    "torch.distributed.device_mesh.init_device_mesh",
    "torch.distributed.tensor.distribute_tensor",
    "torch.distributed.tensor.Shard",
    "torch.distributed.tensor.Replicate",
    "torch.distributed.tensor._utils.compute_local_shape_and_global_offset",
)
# Fields of torch.tpu._get_cache_stats()'s PerfStats (checked on an instance, see missing_api).
CACHE_STATS_FIELDS = ("num_cache_reqs", "num_cache_hits", "num_compilations",
                      "peak_compilation_host_memory_bytes", "per_entry_stats")
MODE_EAGER = {"tpu_eager": "DEFER_NEVER", "tpu_fused": "DEFER_AND_FUSE"}
DEVICE_TYPE = "tpu"
# Test-only: TPU_WORKBENCH_TORCHTPU_DRY_RUN=1 lets the TorchTPU modes through validation without
# a chip and starts their worker (under .venv-torchtpu's interpreter when driven from .venv),
# which reports a CPU device, so CI checks that path where no TPU exists. It trains nothing: with
# torch_tpu 0.2.0 loaded and no chip, the first backward pass on the CPU initialises libtpu's
# PJRT client and hangs (seen here: > 60 s), which is also why plain-PyTorch workers run with
# TORCH_DEVICE_BACKEND_AUTOLOAD=0 (spec.RuntimeConfig.env).
DRY_RUN_ENV = "TPU_WORKBENCH_TORCHTPU_DRY_RUN"
DIST_BACKEND = "tpu_dist"  # torch.distributed's process-group backend on TPU chips


# --------------------------------------------------------------------------------------------
# Where TorchTPU is: this interpreter or .venv-torchtpu (no torch imported)
# --------------------------------------------------------------------------------------------
def dry_run() -> bool:
    """True when the test-only dry run is on (see :data:`DRY_RUN_ENV`)."""
    return os.environ.get(DRY_RUN_ENV) == "1"


def installed_here() -> bool:
    """True if this interpreter can import torch_tpu (checked without importing it)."""
    return importlib.util.find_spec("torch_tpu") is not None


def venv_python() -> Path:
    """The interpreter of the TorchTPU environment, ``<repo>/.venv-torchtpu/bin/python``."""
    return ROOT / VENV_NAME / "bin" / "python"


def worker_python() -> str:
    """The interpreter TorchTPU's workers run under: this one, except from an environment
    without torch_tpu (the main ``.venv``), where ``.venv-torchtpu``'s when that exists."""
    if not installed_here() and venv_python().exists():
        return str(venv_python())
    return sys.executable


def _venv_version() -> str | None:
    site = ROOT / VENV_NAME / "lib"
    for dist in sorted(site.glob("python*/site-packages/torch_tpu-*.dist-info")):
        return dist.name.removeprefix("torch_tpu-").removesuffix(".dist-info")
    return None


def version() -> str | None:
    """torch_tpu's version: of this interpreter, else of ``.venv-torchtpu`` (None: neither)."""
    if installed_here():
        from .backends import package_version

        return package_version("torch_tpu") or package_version("torch-tpu")
    return _venv_version() if venv_python().exists() else None


@dataclass
class TorchTPUStatus:
    """Whether the TorchTPU modes can run, and if not why and what runs instead."""

    installed: bool  # here or in .venv-torchtpu
    where: str  # "this environment", ".venv-torchtpu" or ""
    version: str | None
    supported: bool  # the version this adapter was written against
    chips: int
    available: bool
    reason: str
    fallback: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line for ``tpu-workbench info``."""
        if not self.installed:
            return (f"not installed ({self.reason}); TorchTPU modes are not offered, "
                    f"{self.fallback} runs instead")
        head = f"TorchTPU {self.version} installed ({self.where})"
        if self.available:
            return f"{head}; {self.chips} chip(s) found: modes tpu_eager, tpu_fused, tpu_compile"
        return f"{head}; {self.reason}; the notebooks fall back to {self.fallback}"


def status() -> TorchTPUStatus:
    """TorchTPU's state here, without importing torch: installed (here or in .venv-torchtpu),
    its version, TPU chips on the PCI bus (the very scan torch_tpu's loader does before it
    registers the device) and whether they are free."""
    from . import backends

    fall = fallback()
    here = installed_here()
    where = "this environment" if here else VENV_NAME if venv_python().exists() else ""
    ver = version() if where else None
    if not where:
        return TorchTPUStatus(False, "", None, False, 0, False,
                              f"torch_tpu is not installed in this environment ({sys.prefix}) "
                              f"and there is no {VENV_NAME} (python3 scripts/dev.py "
                              "setup-torchtpu)", fall)
    supported = ver == SUPPORTED_VERSION
    chips = len(backends.tpu_chips_on_pci())
    if not chips and dry_run():
        return TorchTPUStatus(True, where, ver, supported, 0, True,
                              f"dry run ({DRY_RUN_ENV}=1): no TPU chip; the TorchTPU modes run "
                              "their plumbing on the CPU, not on a TPU", fall)
    if not chips:
        return TorchTPUStatus(True, where, ver, supported, 0, False,
                              "no TPU chip found on the PCI bus (vendor 0x1ae0), so torch_tpu "
                              "registers no 'tpu' device", fall)
    holders = [h for h in backends.tpu_holder_details() if not h.idle]  # own idle: released
    if holders:
        return TorchTPUStatus(True, where, ver, supported, chips, False,
                              backends.holders_message(holders), fall)
    if not supported:
        return TorchTPUStatus(True, where, ver, False, chips, False,
                              f"torch_tpu {ver} is installed but this adapter supports "
                              f"{SUPPORTED_VERSION} (pip install torch_tpu=={SUPPORTED_VERSION})",
                              fall)
    return TorchTPUStatus(True, where, ver, True, chips, True, f"{chips} TPU chip(s) found", "")


def require(spec: Any) -> None:
    """Raise SpecError unless `spec` (a TorchTPU mode) can run here; say what runs instead."""
    from ..errors import SpecError

    st = status()
    if not st.available:
        raise SpecError(f"mode {spec.mode!r} needs TorchTPU on a TPU chip, which is not available "
                        f"here: {st.reason}. What runs instead: {st.fallback}.")
    if spec.device not in ("auto", "tpu"):
        raise SpecError(f"mode {spec.mode!r} runs on the TPU (device 'auto' or 'tpu'), not "
                        f"device={spec.device!r}; plain PyTorch modes torch_eager and inductor "
                        "run on cpu or cuda")
    if "hlo" in spec.capture and spec.mode != "tpu_compile":
        raise SpecError(f"capture='hlo' with TorchTPU needs mode 'tpu_compile' (the StableHLO "
                        f"comes from torch.compile's debug_callback), not {spec.mode!r}")


# --------------------------------------------------------------------------------------------
# The API check: every name the adapter calls exists in the installed wheel
# --------------------------------------------------------------------------------------------
def lookup(name: str) -> Any:
    """The object at dotted path `name`: the longest importable module prefix, then attributes
    (or dataclass fields). Raises ImportError/AttributeError naming the part that is missing."""
    parts = name.split(".")
    obj: Any = None
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            if i == 1:
                raise
    for j, attr in enumerate(parts[i:], start=i):
        fields = getattr(obj, "__dataclass_fields__", {})
        try:
            obj = getattr(obj, attr)
        except AttributeError as exc:
            if attr not in fields:  # a dataclass field without a default is no class attribute
                raise AttributeError(f"{'.'.join(parts[:j])} has no attribute {attr!r}") from exc
            obj = fields[attr]
    return obj


def missing_api(names: tuple[str, ...] = API) -> dict[str, str]:
    """Each name of `names` that the installed torch / torch_tpu lacks, with why (empty: all
    there). Imports torch (and so torch_tpu, which autoloads); also checks that the ``"tpu"``
    compile backend is registered and that ``_get_cache_stats()`` has the fields we read."""
    import warnings

    out: dict[str, str] = {}
    with warnings.catch_warnings():  # torch_tpu warns once per experimental API it hands out
        warnings.simplefilter("ignore")
        if names is API and installed_here():
            # installs torch.tpu even where TORCH_DEVICE_BACKEND_AUTOLOAD=0 kept it from autoloading
            importlib.import_module("torch_tpu")
        for name in names:
            try:
                lookup(name)
            except Exception as exc:  # ImportError, AttributeError, or a broken import
                out[name] = f"{type(exc).__name__}: {exc}"
        if names is API and not out:
            import torch._dynamo

            if DEVICE_TYPE not in torch._dynamo.list_backends():
                out["torch.compile backend 'tpu'"] = "not in torch._dynamo.list_backends()"
            try:
                stats = lookup("torch.tpu._get_cache_stats")()
                for f in CACHE_STATS_FIELDS:
                    if not hasattr(stats, f):
                        out[f"torch.tpu._get_cache_stats().{f}"] = "no such field"
            except Exception as exc:
                out["torch.tpu._get_cache_stats()"] = f"{type(exc).__name__}: {exc}"
    return out


def check_report() -> dict[str, Any]:
    """Everything the no-chip checks look at, in one dict (``python -m
    tpu_workbench.environment.torchtpu``)."""
    t0 = time.perf_counter()
    missing = missing_api()
    return {"status": status().as_dict(), "api_names": len(API), "missing": missing,
            "check_s": round(time.perf_counter() - t0, 2),
            "autoload": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")}


if __name__ == "__main__":
    import json

    report = check_report()
    print(json.dumps(report, indent=2))
    sys.exit(1 if report["missing"] else 0)
