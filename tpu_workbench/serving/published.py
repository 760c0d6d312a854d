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
