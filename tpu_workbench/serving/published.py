"""Published vLLM-TPU and SGLang-JAX serving runs on v6e (serving_runs.csv): each with its
source file and commit, engine version and date, flags, lengths and concurrency."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

RUNS_CSV = Path(__file__).with_name("serving_runs.csv")


def serving_runs() -> pd.DataFrame:
    """The published record, one row per run (``run`` is its id; ``itl_ms``, ``ttft_ms`` and
    ``output_tokens_per_s`` as published)."""
    import pandas as pd

    return pd.read_csv(RUNS_CSV)


RECORD_CSV = Path(__file__).with_name("bench_record.csv")


def serving_record() -> pd.DataFrame | None:
    """The published runs with their predictions as last recorded by ``scripts/bench_serve.py
    --record`` (None before any record): ``itl_pred``, ``ttft_pred``, their ratios and the rule
    of thumb's, per run."""
    import pandas as pd

    if not RECORD_CSV.exists():
        return None
    return serving_runs().merge(pd.read_csv(RECORD_CSV).drop(
        columns=["model", "engine", "slice"], errors="ignore"), on="run")
