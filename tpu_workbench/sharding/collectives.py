"""The collectives XLA inserted into a partitioned step, with an ICI time estimate (a ring
model; :func:`ici_assumptions` says what it assumes)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

from .memory import step_file
from .mesh import axis_names, mesh_place

ICI_HOP_US = 1.0  # latency of one ICI hop, µs (jax-ml/scaling-book: ~1 µs)


def collective_time_us(kind: str, nbytes: float, axis_sizes: Sequence[int],
                       chip: str | Any = "v6e") -> float:
    """Estimated time in µs of one collective over the mesh axes of sizes `axis_sizes`.

    Ring model (jax-ml/scaling-book, sharding.md), each logical mesh axis laid along one
    physical axis of the slice, neighbours one link apart. V = `nbytes`, the whole buffer the
    collective moves (the gathered result; a reduce-scatter's input), n = the devices in the
    group, k = the axes it spans. Along one axis the bandwidth W is one link's: both
    directions (2 x ``ici_link_gbps``) if the axis wraps around into a ring (v5e/v6e: axes of
    16 chips or more; v5p: 4 or more), else one direction (a line has no wrap-around link).
    Over k axes, k rings run at once: k x W. Latency: ``ICI_HOP_US`` per hop, floor(a/2) hops
    along a ring of a chips, a-1 along a line.

    - all-gather, reduce-scatter: (n-1)/n x V / (k W) + hops
    - all-reduce (a reduce-scatter then an all-gather): 2 (n-1)/n x V / (k W) + 2 hops
    - all-to-all: V / (4 k W) + hops
    - collective-permute: V over one link, one direction, + 1 hop

    Bandwidth and latency only: no overlap with compute, no contention with other traffic.
    """
    from ..environment.chips import get_chip

    c = get_chip(chip) if isinstance(chip, str) else chip
    sizes = [int(a) for a in axis_sizes if int(a) > 1]
    if not sizes:
        return 0.0
    link = c.ici_link_gbps * 1e9  # bytes/s, one link, one direction
    if kind == "collective-permute":
        return (nbytes / link) * 1e6 + ICI_HOP_US
    n = math.prod(sizes)
    ring = all(a >= c.wraparound_from for a in sizes)
    bandwidth = (2 * link if ring else link) * len(sizes)
    hops = sum(a // 2 if ring else a - 1 for a in sizes)
    if kind == "all-reduce":
        return 2 * (n - 1) / n * nbytes / bandwidth * 1e6 + 2 * hops * ICI_HOP_US
    if kind == "all-to-all":
        return nbytes / (4 * bandwidth) * 1e6 + hops * ICI_HOP_US
    return (n - 1) / n * nbytes / bandwidth * 1e6 + hops * ICI_HOP_US


def ici_assumptions(chip: str = "v6e") -> str:
    """The assumptions under every ICI estimate, in one sentence for a notebook or the CLI."""
    from ..environment.chips import get_chip

    c = get_chip(chip)
    return (f"Estimated, not measured: ring model on {c.name} ICI ({c.ici_link_gbps:g} GB/s per "
            f"link and direction, {c.ici_links} links per chip), each mesh axis laid along one "
            f"physical axis; axes shorter than {c.wraparound_from} chips have no wrap-around "
            f"link (one direction, a-1 hops), {ICI_HOP_US:g} µs per hop; bandwidth and "
            "latency only, no overlap with compute (jax-ml/scaling-book).")


COLLECTIVE_COLUMNS = ["kind", "name", "shape", "bytes", "buffer_bytes", "replica_groups",
                      "groups_text", "group_size", "num_groups", "axis", "estimated_us",
                      "computation", "source_op"]


def _axis_of(groups: list[list[int]], mesh_shape: Sequence[int] | None) -> str:
    """Which mesh axis a collective's groups run along (``data``, ``model``, ``all``...)."""
    if not mesh_shape or not groups:
        return ""
    n = math.prod(mesh_shape)
    norm = sorted(tuple(sorted(g)) for g in groups)
    if norm == [tuple(range(n))]:
        return "all"
    names = axis_names(mesh_shape)
    for i, a in enumerate(names):
        want = sorted(tuple(sorted(d for d in range(n) if all(
            mesh_place(d, mesh_shape)[0][j] == mesh_place(base, mesh_shape)[0][j]
            for j in range(len(mesh_shape)) if j != i))) for base in range(n))
        if norm == sorted(set(want)):
            return a
    return "other"


def _group_axes(groups: list[list[int]] | None, group_size: int,
                mesh_shape: Sequence[int] | None) -> tuple[int, ...]:
    """Sizes of the mesh axes one collective's groups span: (4,) along the model axis of a 2x4
    mesh, (2, 4) over all of it; (group_size,) where the groups follow no mesh axes."""
    if not mesh_shape:
        return (group_size,)
    if not groups:  # no replica groups: every device
        return tuple(mesh_shape)
    places = [mesh_place(d, mesh_shape)[0] for d in groups[0]]
    spanned = tuple(size for i, size in enumerate(mesh_shape)
                    if len({p[i] for p in places}) > 1)
    return spanned if math.prod(spanned) == group_size else (group_size,)


@functools.lru_cache(maxsize=16)
def _parsed_collectives(hlo_text: str) -> pd.DataFrame:
    """:func:`tpu_workbench.hlo.collectives` of `hlo_text`, parsed once per process: a notebook
    asks for the same run's collectives in several cells (about 0.5 s a parse here)."""
    from .. import hlo

    return hlo.collectives(hlo_text)


def collectives_frame(result: Any, chip: str = "v6e", hlo_text: str | None = None,
                      mesh_shape: Sequence[int] | None = None) -> pd.DataFrame:
    """Collectives XLA inserted into the partitioned train step, with an ICI time estimate.

    Reads the after-optimisations HLO of the train step in ``result.out_dir / "hlo"`` (needs
    ``capture=("hlo",)``), or `hlo_text` if given, with :func:`tpu_workbench.hlo.collectives`.
    Columns (:data:`COLLECTIVE_COLUMNS`): ``kind`` (all-reduce, all-gather, reduce-scatter,
    all-to-all, collective-permute...), ``name``, ``shape``, ``bytes`` (the op's result, per
    device), ``buffer_bytes`` (the full buffer the ring moves: the result, except for a
    reduce-scatter: result x group size), ``replica_groups`` (list of lists of device ids),
    ``groups_text`` (as XLA wrote them), ``group_size`` (n), ``num_groups``, ``axis`` (the mesh
    axis the groups run along: ``data``, ``model``, ``all`` (every device), ``other`` (e.g.
    the pairs of a collective-permute)), ``estimated_us``, ``computation``, ``source_op``.

    ``estimated_us`` is :func:`collective_time_us` of ``buffer_bytes`` over the mesh axes the
    groups span (the ring model; its assumptions in :func:`ici_assumptions`).
    """
    import pandas as pd

    from .. import hlo
    from ..environment.chips import get_chip

    target = get_chip(chip)
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
    n = frame["group_size"].astype("float")
    frame["buffer_bytes"] = frame["bytes"].where(frame["kind"] != "reduce-scatter",
                                                 frame["bytes"] * n)
    frame["axis"] = [_axis_of(g, mesh_shape) if g else "all" for g in frame["replica_groups"]]
    frame["estimated_us"] = [
        collective_time_us(k, b, _group_axes(g, int(s), mesh_shape), target)
        if s == s and s is not None else float("nan")
        for k, b, s, g in zip(frame["kind"], frame["buffer_bytes"], n, frame["replica_groups"],
                              strict=True)]
    return frame[COLLECTIVE_COLUMNS].reset_index(drop=True)
