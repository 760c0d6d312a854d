"""Plan a TPU run from a laptop: compile a model's step on the slice's mesh of virtual devices
(never running it), and predict its step time, MFU range and bottleneck per slice and strategy
with :mod:`tpu_workbench.planning.steptime`.

A model too large to compile whole here is compiled with one and with two blocks at its real
width (:func:`tpu_workbench.planning.steptime.extrapolate` scales the difference to all its blocks).
A plan that does not fit the slice's HBM (:func:`tpu_workbench.sharding.fit_table`) is not
compiled: its row says why and predicts nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from .. import models, sharding
from ..environment.chips import get_slice
from ..errors import SpecError
from ..runs.runner import run
from ..runs.spec import ExperimentSpec
from ..runs.workers import WorkerPool
from . import steptime

DTYPES = tuple(sharding.STATE_BYTES)  # the dtypes the one memory convention knows
RECOMPUTE_FACTOR = 4 / 3  # forward + backward = 3 forward passes; recomputation adds one more
# The HLO is what is wanted, not a fast CPU binary: skip LLVM's optimisations of the kernels
# XLA:CPU emits (they do not change the optimised HLO the cost analysis reads).
COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")


def _plan_options(family: Any, preset: str, seq_len: int, dtype: str,
                  options: dict[str, Any]) -> dict[str, Any]:
    """Options of the compiled specs: the task's length for `seq_len` tokens (the cost task
    compiles sequences of ``2 * length``), the dtype, room in the position table."""
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


def compiled_totals(result: Any, chip: str, mesh: Sequence[int], topology: Sequence[int],
                    dtype: str | None = None) -> dict[str, float]:
    """:func:`steptime.totals` of a cost run's partitioned step (its after-optimisations HLO)."""
    from .. import hlo
    from ..sharding.memory import step_file

    step = step_file(Path(result.out_dir) / "hlo", "after_optimizations.txt")
    if step is None:
        raise SpecError(f"the cost run {result.run_id} dumped no after-optimisations HLO")
    mods = hlo.parse_modules(step.read_text())  # parsed once: a block's step is ~1 MB of text
    precision = result.summary.get("mat_mul_precision", "default")
    ops = steptime.op_times(hlo.per_op_cost(mods), chip, precision=precision, dtype=dtype)
    # collectives_frame reads its HLO through hlo.collectives, which takes an instructions frame
    coll = sharding.collectives_frame(None, chip, hlo_text=hlo.instructions(mods),
                                      mesh_shape=tuple(mesh), topology=tuple(topology))
    return steptime.totals(ops, coll)


def predict(model: str, preset: str, slices: Sequence[str] = ("v6e-16",),
            strategies: Sequence[str] = ("fsdp",), seq_len: int = 2048, batch_size: int = 32,
            dtype: str | None = None, recompute: bool = False, whole: bool | None = None,
            options: dict[str, Any] | None = None, pool: WorkerPool | None = None,
            timeout: float = 1800.0,
            on_progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Predicted step time of `model`/`preset` training on each slice with each strategy, at
    global `batch_size` and `seq_len` tokens: one row per (slice, strategy), columns
    :data:`steptime.PREDICTION_COLUMNS` plus ``fits``, ``reason``, ``layers``, ``method``
    (``whole`` or ``blocks``: one and two blocks compiled and extrapolated), ``predict_s``
    (wall time of the row) and ``executions`` (0: nothing ran). Every number is a prediction;
    ``frame.attrs["assumptions"]`` lists what they assume.

    `dtype`: ``bfloat16`` (default for hf:* families) or ``float32``. `recompute`: activation
    recomputation, in the fit check and as 4/3 of the compute. `whole`: compile the whole model
    (default: only when it has at most 2 blocks). Raises :class:`SpecError` before compiling
    anything for an unknown slice or strategy, a batch the data axis does not divide, or when
    no plan fits (a plan that does not fit alone gets NaN and its reason).
    """
    family = models.get_model(model)
    options = dict(options or {})
    dtype = dtype or family.planning_dtype
    base = _plan_options(family, preset, seq_len, dtype, options)
    cfg = family.config(preset, **base)
    shape = family.block_shape(cfg)
    layers = shape.layers
    whole = layers <= 2 if whole is None else bool(whole)
    plans = []
    for name in slices:
        sl = get_slice(name)
        for strategy in strategies:
            strategy = sharding.strategy_name(strategy)
            mesh = sharding.slice_mesh(sl, strategy)
            ways = sharding.batch_ways(strategy, mesh)
            if not isinstance(batch_size, int) or batch_size <= 0 or batch_size % ways:
                raise SpecError(f"batch_size={batch_size!r} does not split over {ways} data "
                                f"shards ({strategy} on {sl.name}, mesh "
                                f"{'x'.join(map(str, mesh))}): use a multiple of {ways}")
            counts = [layers] if whole else [1, 2]
            # device="cpu": XLA:CPU's virtual devices even on a TPU VM (never the chip itself)
            specs = [ExperimentSpec(model=model, preset=preset, mode="lazy", mesh=mesh,
                                    device="cpu",
                                    strategy=strategy, batch_size=batch_size, steps=1,
                                    capture=("hlo",), xla_flags=COMPILE_FLAGS,
                                    options={**base, shape.layers_option: n})
                     for n in counts]
            for spec in specs:
                spec.validate()  # widths the model axis must divide, before anything compiles
            plans.append((sl, strategy, mesh, specs))
    fit = _fit(family, preset, base, [s.name for s, *_ in plans], strategies, batch_size,
               seq_len, dtype, recompute).set_index(["slice", "strategy"])
    if not fit["fits"].any():
        hint = "" if recompute else " (recompute=True keeps only each block's input)"
        raise SpecError("no plan fits, nothing to predict: " + "; ".join(
            f"{s} {t}: {r}" for (s, t), r in fit["reason"].items()) + hint)
    own = pool is None  # a pool of one: a slice's worker (and its GBs) ends when the next starts
    pool = WorkerPool(max_workers=1) if own else pool
    try:
        rows = [_predict_plan(plan, fit, whole, layers, recompute, pool, timeout, on_progress,
                              {"model": model, "preset": preset, "batch_size": batch_size,
                               "seq_len": seq_len, "dtype": dtype, "recompute": recompute,
                               "layers": layers, "method": "whole" if whole else "blocks",
                               "model_flops": family.flops_per_step(cfg, batch_size)})
                for plan in plans]
    finally:
        if own:
            pool.shutdown()
    frame = pd.DataFrame(rows)
    for col in steptime.PREDICTION_COLUMNS:
        if col not in frame:
            frame[col] = math.nan
    frame.attrs["assumptions"] = steptime.assumptions(plans[0][0].chip)
    return frame


def _predict_plan(plan: tuple, fit: pd.DataFrame, whole: bool, layers: int, recompute: bool,
                  pool: WorkerPool, timeout: float, on_progress: Callable[[str], None] | None,
                  common: dict[str, Any]) -> dict[str, Any]:
    """One row of :func:`predict`: the fit check's verdict, and the prediction if it fits."""
    sl, strategy, mesh, specs = plan
    row = {"slice": sl.name, "chip": sl.chip, "chips": sl.chips, "strategy": strategy,
           "mesh": "x".join(map(str, mesh)), "topology": "x".join(map(str, sl.topology)),
           **common, "fits": bool(fit.loc[(sl.name, strategy), "fits"]),
           "reason": fit.loc[(sl.name, strategy), "reason"]}
    if not row["fits"]:
        return row
    started = time.perf_counter()
    if on_progress:
        on_progress(f"compiling {common['model']} {common['preset']} {strategy} on {sl.name} "
                    f"({row['method']})")
    results = [run(spec, task="cost", pool=pool, timeout=timeout) for spec in specs]
    found = [compiled_totals(r, sl.chip, mesh, sl.topology, common["dtype"]) for r in results]
    total = found[0] if whole else steptime.extrapolate(found[0], found[1], layers)
    row.update(steptime.predict_step(total, sl.chip, sl.chips, common["model_flops"],
                                     RECOMPUTE_FACTOR if recompute else 1.0))
    row["executions"] = sum(int(r.summary.get("executions", 0)) for r in results)
    row["compile_s"] = sum(float(r.summary.get("compile_s", 0.0)) for r in results)
    row["predict_s"] = time.perf_counter() - started
    return row


def _fit(family: Any, preset: str, options: dict[str, Any], slices: Sequence[str],
         strategies: Sequence[str], batch_size: int, seq_len: int, dtype: str,
         recompute: bool) -> pd.DataFrame:
    """The fit check in the one memory convention (:data:`tpu_workbench.sharding.CONVENTION`),
    for the model as configured for the plan (`options`: its sequence length, dtype)."""
    n_params = models.count_params(family.name, preset, options)
    return sharding.fit_table(family.block_shape(family.config(preset, **options)), n_params,
                              batch_size, seq_len, slices=list(dict.fromkeys(slices)),
                              strategies=[sharding.strategy_name(s) for s in strategies],
                              dtype=dtype, recompute=recompute).assign(params=n_params)


def fit_check(model: str, preset: str, slices: Sequence[str] = ("v6e-16",),
              strategies: Sequence[str] = ("fsdp",), seq_len: int = 2048, batch_size: int = 32,
              dtype: str | None = None, recompute: bool = False,
              options: dict[str, Any] | None = None) -> pd.DataFrame:
    """The fit check :func:`predict` makes first (:func:`tpu_workbench.sharding.fit_table` in
    the plan's dtype), on its own: cheap, nothing compiles."""
    family = models.get_model(model)
    dtype = dtype or family.planning_dtype
    base = _plan_options(family, preset, seq_len, dtype, options or {})
    for name in slices:
        get_slice(name)
    return _fit(family, preset, base, slices, strategies, batch_size, seq_len, dtype, recompute)
