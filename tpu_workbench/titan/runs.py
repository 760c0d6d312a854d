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
    """Memory per rank at the last step of each run: ``strategy``, ``rank``, ``part``
    (parameters, gradients, optimizer state: the rank's local shards, measured from its
    tensors), ``bytes``; plus ``rss_bytes`` (the rank's resident memory, the process's whole
    footprint: Python, torch, the data loader)."""
    import pandas as pd

    rows = []
    for result in results:
        label = result.summary.get("strategy") or result.spec.strategy
        steps = [r for r in result.records if r.get("kind") == "step"]
        if not steps:
            continue
        last = steps[-1]
        for part in MEMORY_PARTS:
            for rank, value in enumerate(last.get(f"rank_{part}") or []):
                rows.append({"strategy": label, "rank": rank,
                             "part": part.removesuffix("_bytes"), "bytes": value,
                             "rss_bytes": (last.get("rank_rss_bytes") or [None] * (rank + 1))[
                                 rank], "run_id": result.run_id})
    return pd.DataFrame(rows, columns=["strategy", "rank", "part", "bytes", "rss_bytes",
                                       "run_id"])


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
