"""The collectives XLA inserted into a partitioned step, with the ICI time each would take on a
TPU slice (:mod:`tpu_workbench.sharding.ici`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

from .ici import collective_time_us, slice_topology, span_text
from .memory import step_file
from .mesh import group_axis

COLLECTIVE_COLUMNS = ["kind", "name", "shape", "bytes", "buffer_bytes", "replica_groups",
                      "groups_text", "group_size", "num_groups", "axis", "physical_axes",
                      "estimated_us", "computation", "source_op", "source"]


@functools.lru_cache(maxsize=16)
def _parsed_collectives(hlo_text: str) -> pd.DataFrame:
    """:func:`tpu_workbench.hlo.collectives` of `hlo_text`, parsed once per process: a notebook
    asks for the same run's collectives in several cells (about 0.5 s a parse here)."""
    from .. import hlo

    return hlo.collectives(hlo_text)


def collectives_frame(result: Any, chip: str = "v6e", hlo_text: str | None = None,
                      mesh_shape: Sequence[int] | None = None,
                      topology: Sequence[int] | None = None) -> pd.DataFrame:
    """Collectives XLA inserted into the partitioned train step, with an ICI time estimate.

    Reads the after-optimisations HLO of the train step in ``result.out_dir / "hlo"`` (needs
    ``capture=("hlo",)``), or `hlo_text` if given, with :func:`tpu_workbench.hlo.collectives`.
    Columns (:data:`COLLECTIVE_COLUMNS`): ``kind`` (all-reduce, all-gather, reduce-scatter,
    all-to-all, collective-permute...), ``name``, ``shape``, ``bytes`` (the op's result, per
    device), ``buffer_bytes`` (the full buffer the ring moves: the result, except for a
    reduce-scatter: result x group size), ``replica_groups`` (list of lists of device ids),
    ``groups_text`` (as XLA wrote them), ``group_size`` (n), ``num_groups``, ``axis`` (the mesh
    axis the groups run along: ``data``, ``model``, ``all`` (every device), ``other`` (e.g.
    the pairs of a collective-permute)), ``physical_axes`` (the torus axes of the slice they
    run along, ``"2x4"``; ``irregular``: no sub-grid), ``estimated_us``, ``computation``,
    ``source_op`` and ``source`` (``aten__native_batch_norm @ functional.py:2901``: the op and
    the line of Python that made the collective's operand, from the HLO metadata).

    ``estimated_us`` is :func:`~tpu_workbench.sharding.ici.collective_time_us` of
    ``buffer_bytes`` on a slice of `chip` with `topology` (default: the slice with the mesh's
    device count, a v6e-8's 2x4 for 8 devices).
    """
    import pandas as pd

    from .. import hlo

    if hlo_text is None:
        hlo_dir = Path(result.out_dir) / "hlo" if getattr(result, "out_dir", None) else None
        step = step_file(hlo_dir, "after_optimizations.txt") if hlo_dir else None
        if step is None:
            raise ValueError("no after-optimisations HLO of the train step found; run with "
                             "capture=('hlo',)")
        hlo_text = step.read_text()
    if mesh_shape is None and getattr(result, "spec", None) is not None:
        mesh_shape = result.spec.mesh
    frame = _parsed_collectives(hlo_text).copy() if isinstance(hlo_text, str) else \
        hlo.collectives(hlo_text)  # already parsed: a frame of instructions
    if frame.empty:
        return pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    if topology is None:
        devices = math.prod(mesh_shape) if mesh_shape else max(
            (max(map(max, g)) + 1 for g in frame["replica_groups"] if g), default=1)
        topology = slice_topology(devices, chip)
    n = frame["group_size"].astype("float")
    frame["buffer_bytes"] = frame["bytes"].where(frame["kind"] != "reduce-scatter",
                                                 frame["bytes"] * n)
    frame["axis"] = [group_axis(g, mesh_shape) if g else "all" for g in frame["replica_groups"]]
    first = [g[0] if g else None for g in frame["replica_groups"]]
    frame["physical_axes"] = [span_text(g, topology) for g in first]
    frame["estimated_us"] = [
        collective_time_us(k, b, g, topology, chip) if s == s and s is not None
        else float("nan")
        for k, b, s, g in zip(frame["kind"], frame["buffer_bytes"], n, first, strict=True)]
    frame["source"] = [
        " @ ".join(p for p in (op, f"{Path(f).name}:{line}" if f else "") if p)
        for op, f, line in zip(frame["source_op"], frame["source_file"], frame["source_line"],
                               strict=True)]
    return frame[COLLECTIVE_COLUMNS].reset_index(drop=True)


def collectives_by_source(frame: pd.DataFrame) -> pd.DataFrame:
    """:func:`collectives_frame` summed per kind, mesh axis and the op that made them
    (``source``): count and MB per device, largest first. Which line of the model a strategy's
    collectives come from, so that an all-gather nobody asked for is traced to its cause."""
    if frame.empty:
        return frame.assign(count=[], mb=[])[["kind", "axis", "source", "count", "mb"]]
    out = (frame.assign(source=frame["source"].replace("", "(no metadata)"))
           .groupby(["kind", "axis", "source"], as_index=False)
           .agg(count=("name", "size"), mb=("bytes", "sum")))
    out["mb"] = out["mb"] / 1e6
    return out.sort_values("mb", ascending=False, ignore_index=True)
