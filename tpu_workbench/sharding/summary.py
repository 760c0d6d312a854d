"""Several sharded runs side by side: step times, losses, collectives, memory."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

from .collectives import collectives_frame
from .memory import memory_per_device
from .mesh import mesh_text, strategy_name


def summary_frame(results: Iterable[Any]) -> pd.DataFrame:
    """One row per run: ``strategy``, ``mesh``, timing (see ``tpu_workbench.timing.summarize``),
    ``final_loss``, ``collectives`` (count) and ``collective_bytes`` (where HLO was captured),
    ``params_bytes_per_device`` (largest device) and ``xla_total_bytes``."""
    import pandas as pd

    from ..records import labelled_steps
    from ..timing import summarize

    rows = []
    for result in results:
        spec = result.spec
        base = summarize(labelled_steps(spec, result.records, result.run_id))
        row = base.iloc[0].to_dict() if len(base) else {}
        row["strategy"] = strategy_name(spec.strategy) if spec.mesh else "single"
        row["mesh"] = mesh_text(spec.mesh) if spec.mesh else "1"
        row["run_id"] = result.run_id
        try:
            coll = collectives_frame(result)
            row["collectives"] = len(coll)
            row["collective_bytes"] = int(coll["bytes"].sum())
            row["collective_est_us"] = float(coll["estimated_us"].sum())
        except (ValueError, OSError, TypeError):
            row.update(collectives=float("nan"), collective_bytes=float("nan"),
                       collective_est_us=float("nan"))
        mem = memory_per_device(result)
        row["params_bytes_per_device"] = float(mem["params_bytes"].max()) if len(mem) \
            else float("nan")
        row["xla_total_bytes"] = float(mem["xla_total_bytes"].max()) if len(mem) \
            else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def loss_agreement(results: Iterable[Any], baseline: Any) -> pd.DataFrame:
    """Each sharded run's losses beside one device's (`baseline`) at the same steps: one row per
    run, ``strategy``, ``mesh``, ``steps``, ``losses`` (list), ``max_rel_diff`` (the largest
    relative difference from the baseline's loss at the same step)."""
    import pandas as pd

    base = baseline.steps.set_index("step")["loss"]
    rows = []
    for result in results:
        loss = result.steps.set_index("step")["loss"]
        common = loss.index.intersection(base.index)
        diff = ((loss[common] - base[common]).abs() / base[common].abs()).max()
        rows.append({"strategy": strategy_name(result.spec.strategy) if result.spec.mesh
                     else "single", "mesh": mesh_text(result.spec.mesh) if result.spec.mesh
                     else "1", "steps": len(common),
                     "losses": [round(float(v), 6) for v in loss[common]],
                     "max_rel_diff": float(diff)})
    return pd.DataFrame(rows)
