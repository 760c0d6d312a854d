"""Run TorchTitan's trainer through the workbench (:func:`titan`) and read its runs back as
DataFrames: losses (training and held-out) per strategy, memory per rank."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..runs import runner
from ..runs.store import RunResult
from .spec import TitanSpec, titan_spec

if TYPE_CHECKING:
    import pandas as pd


def titan(config: str | Path | None = None, ranks: int = 4, *, dp_shard: int | None = None,
          tp: int | None = None, pp: int | None = None, steps: int = 30, seed: int = 0,
          global_batch: int | None = None, seq_len: int | None = None,
          on_record: Callable[[dict[str, Any]], None] | None = None, reuse: bool = False,
          out_dir: Path | None = None, timeout: float = 1800.0) -> RunResult:
    """Train with TorchTitan's own trainer: `config` (a TorchTitan TOML path, a shipped name
    such as ``debug_model``, or TOML text; default the debug model sized for a CPU) over
    `ranks` torchrun processes, its degrees replaced by `dp_shard`, `tp`, `pp` where given.

    Every rank's metrics stream as the workbench's records (`on_record` sees each): ``step``
    (``loss``, ``wall_ms`` of rank 0 and ``rank_wall_ms`` of every rank, ``tokens_per_s``,
    ``grad_norm``, ``lr``, ``rank_param_bytes`` / ``rank_grad_bytes`` /
    ``rank_optimizer_bytes`` / ``rank_rss_bytes`` per rank) and ``heldout`` (the loss on
    held-out text after the first and the last step). The result's folder is a run folder
    like any other (``steps.csv``, ``records.jsonl``, ``summary.json``: TorchTitan's command
    line, the notes of what a local run replaces). Bad input (an unknown TOML key, degrees
    that do not multiply to `ranks`, no ``.venv-torchtpu``) raises SpecError before any rank
    starts. ``reuse=True`` returns a stored run of the same spec and environment instead."""
    spec = titan_spec(config, ranks, dp_shard=dp_shard, tp=tp, pp=pp, steps=steps, seed=seed,
                      global_batch=global_batch, seq_len=seq_len)
    return runner.run(spec, on_record, reuse=reuse, out_dir=out_dir, timeout=timeout)


def losses_frame(results: list[RunResult]) -> pd.DataFrame:
    """One row per step and kind of loss of each run: ``strategy``, ``step``, ``kind``
    (``train``: the whole batch's, ``held-out``: the held-out text's), ``loss``, ``run_id``."""
    import pandas as pd

    rows = []
    for result in results:
        label = result.summary.get("strategy") or result.spec.strategy
        for rec in result.records:
            kind = {"step": "train", "heldout": "held-out"}.get(rec.get("kind", ""))
            if kind is not None:
                rows.append({"strategy": label, "step": rec["step"], "kind": kind,
                             "loss": rec["loss"], "run_id": result.run_id})
    return pd.DataFrame(rows, columns=["strategy", "step", "kind", "loss", "run_id"])


MEMORY_PARTS = ("param_bytes", "grad_bytes", "optimizer_bytes")


def memory_frame(results: list[RunResult]) -> pd.DataFrame:
    """Training state per rank at the last step of each run, measured beside the workbench's
    estimate: ``strategy``, ``rank``, ``part`` (param, grad, optimizer), ``bytes``, ``source``
    (``measured``: the rank's local shards of TorchTitan's tensors; ``estimate``: the
    workbench's one memory convention, :func:`tpu_workbench.sharding.parameter_shards` of
    :data:`tpu_workbench.sharding.STATE_BYTES` fp32 per parameter, for the same layout), and
    ``rss_bytes`` (measured rows: the rank process's whole resident memory)."""
    import pandas as pd

    from .. import sharding

    rows = []
    for result in results:
        label = result.summary.get("strategy") or result.spec.strategy
        steps = [r for r in result.records if r.get("kind") == "step"]
        if not steps:
            continue
        last = steps[-1]
        rss = last.get("rank_rss_bytes") or []
        for part in MEMORY_PARTS:
            for rank, value in enumerate(last.get(f"rank_{part}") or []):
                rows.append({"strategy": label, "rank": rank,
                             "part": part.removesuffix("_bytes"), "bytes": value,
                             "source": "measured",
                             "rss_bytes": rss[rank] if rank < len(rss) else None,
                             "run_id": result.run_id})
        shards = sharding.parameter_shards(result.spec.strategy, _workbench_mesh(result))
        n_params = result.summary.get("n_params") or 0
        for part, per_param in zip(MEMORY_PARTS, sharding.STATE_BYTES["float32"], strict=True):
            rows.append({"strategy": label, "rank": 0, "part": part.removesuffix("_bytes"),
                         "bytes": n_params * per_param / shards, "source": "estimate",
                         "rss_bytes": None, "run_id": result.run_id})
    return pd.DataFrame(rows, columns=["strategy", "rank", "part", "bytes", "source",
                                       "rss_bytes", "run_id"])


def _workbench_mesh(result: RunResult) -> tuple[int, ...]:
    """The workbench's mesh of a run's layout: (data,) for fsdp, (data, model) otherwise."""
    degrees = result.summary.get("degrees") or {}
    if result.spec.strategy in ("fsdp", "dp"):
        return (max(1, result.spec.ranks),)
    return (degrees.get("dp_shard", 1), degrees.get("tp", 1))


def first_losses(results: list[RunResult]) -> pd.DataFrame:
    """The first step's loss of each run and its relative difference from the first run's
    (``rel_diff``): runs with the same seed and global batch start from the same loss."""
    import pandas as pd

    rows = [{"strategy": r.summary.get("strategy"), "global_batch": r.summary.get("batch_size"),
             "seed": r.spec.seed, "first_loss": r.summary.get("first_loss"),
             "heldout_first": r.summary.get("heldout_first"),
             "heldout_last": r.summary.get("heldout_last")} for r in results]
    frame = pd.DataFrame(rows)
    if len(frame):
        base = frame["first_loss"].iloc[0]
        frame["rel_diff"] = (frame["first_loss"] - base).abs() / abs(base)
    return frame


__all__ = ["TitanSpec", "first_losses", "losses_frame", "memory_frame", "titan", "titan_spec"]
