"""Turn step records into honest timing summaries.

Step 0 includes compilation, so it is reported apart ("first step") and never mixed into the
steady-state figures; steady state is every step after the warm-up, summarised by its median and
spread (p10/p90) because these machines are noisy.
"""

from __future__ import annotations

import pandas as pd

WARMUP_STEPS = 1  # steps excluded from steady state (step 0 compiles)


def summarize(steps: pd.DataFrame, by: tuple[str, ...] = ("model", "preset", "mode"),
              warmup: int = WARMUP_STEPS) -> pd.DataFrame:
    """One row per group of `by` with first-step and steady-state timing and compile counts.

    Input columns: ``step``, ``wall_ms``, ``compiles`` (+ ``cached``, ``compile_ms``,
    ``executions``, ``loss`` where present). Output columns: ``steps``, ``first_step_ms``,
    ``steady_median_ms``, ``steady_p10_ms``, ``steady_p90_ms``, ``steady_steps``,
    ``compiles_total``, ``compiles_steady``, ``compile_ms_total``, ``executions_per_step``,
    ``final_loss``.
    """
    if steps.empty:
        return pd.DataFrame()
    keys = [k for k in by if k in steps.columns]
    rows = []
    for group, frame in steps.groupby(keys, sort=False) if keys else [((), steps)]:
        frame = frame.sort_values("step")
        steady = frame[frame["step"] >= warmup]
        row = dict(zip(keys, group if isinstance(group, tuple) else (group,), strict=True))
        row.update(
            steps=len(frame),
            first_step_ms=float(frame["wall_ms"].iloc[0]),
            steady_median_ms=float(steady["wall_ms"].median()) if len(steady) else float("nan"),
            steady_p10_ms=float(steady["wall_ms"].quantile(0.1)) if len(steady) else float("nan"),
            steady_p90_ms=float(steady["wall_ms"].quantile(0.9)) if len(steady) else float("nan"),
            steady_steps=len(steady),
            compiles_total=int(frame["compiles"].sum()) if "compiles" in frame else 0,
            compiles_steady=int(steady["compiles"].sum()) if "compiles" in frame else 0,
            compile_ms_total=float(frame["compile_ms"].sum()) if "compile_ms" in frame else 0.0,
            executions_per_step=float(steady["executions"].median())
            if "executions" in frame and len(steady) else float("nan"),
            final_loss=float(frame["loss"].iloc[-1]) if "loss" in frame else float("nan"),
        )
        rows.append(row)
    return pd.DataFrame(rows)
