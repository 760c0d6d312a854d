"""How long one collective takes on a TPU slice: the ICI model every view asks (the sharding
table of an XLA run, a gang's collectives, a slice plan and ``predict``).

Placement: the devices ``0 .. n-1`` of a mesh (XLA's, or a gang's ranks) sit on the chips of
the slice in row-major order of its physical topology (a v6e-8 is 2x4: device ``d`` on chip
``(d // 4, d % 4)``), so a 1-D mesh spans every physical axis and the model axis of a slice's
(data, model) mesh (:attr:`~tpu_workbench.environment.chips.Slice.mesh_2d`) lies along its last
one. A group of devices that forms a sub-grid of the torus runs along the axes it spans; any
other group is timed as one line through all of its chips.

The ring model (jax-ml/scaling-book, sharding.md), V the bytes the collective moves (the
gathered result; a reduce-scatter's input), n the chips in the group, k the physical axes it
spans, W per axis one link's bandwidth: both directions if the axis wraps around into a ring
(:meth:`~tpu_workbench.environment.chips.Chip.wraps`), else one (a line); k rings run at once.
Latency: :data:`ICI_HOP_US` per hop, floor(a/2) hops along a ring of a chips, a-1 along a line.

- all-gather, reduce-scatter: (n-1)/n x V / (k W) + hops
- all-reduce (a reduce-scatter then an all-gather): 2 (n-1)/n x V / (k W) + 2 hops
- all-to-all: V / (4 k W) + hops
- collective-permute: V over one link, one direction, + 1 hop

Bandwidth and latency only: no overlap with compute, no contention with other traffic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..environment.chips import Chip

ICI_HOP_US = 1.0  # latency of one ICI hop, µs (jax-ml/scaling-book: ~1 µs)


def slice_topology(devices: int, chip: str | Chip = "v6e") -> tuple[int, ...]:
    """The physical topology of `devices` chips: their slice's (8 v6e chips: 2x4), or one line
    of them where `chip` has no slice of that size (6 chips: 6)."""
    from ..environment.chips import SLICES, get_chip

    name = get_chip(chip).name if isinstance(chip, str) else chip.name
    for s in SLICES.values():
        if s.chip == name and s.chips == devices:
            return s.topology
    return (devices,)


def physical_span(group: Sequence[int] | None,
                  topology: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(sizes, axes) of the torus axes a group of chips spans (None: every chip of the slice),
    or None where the group is no sub-grid of the torus (it is timed as one line)."""
    topology = tuple(topology)
    if group is None:
        axes = tuple(i for i, a in enumerate(topology) if a > 1)
        return tuple(topology[i] for i in axes), axes
    coords = [_coords(int(c), topology) for c in group]
    axes = tuple(i for i in range(len(topology)) if len({c[i] for c in coords}) > 1)
    sizes = tuple(topology[i] for i in axes)
    if math.prod(sizes) != len(set(map(int, group))):
        return None
    return sizes, axes


def _coords(chip: int, topology: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(topology):
        out.append(chip % size)
        chip //= size
    return tuple(reversed(out))


def collective_time_us(kind: str, nbytes: float, group: Sequence[int] | None,
                       topology: Sequence[int], chip: str | Chip = "v6e") -> float:
    """Estimated µs of one collective of `kind` moving `nbytes` among the chips `group` (their
    indices in row-major order of `topology`; None: all of them) of a `chip` slice (the module
    doc gives the model)."""
    from ..environment.chips import get_chip

    c = get_chip(chip) if isinstance(chip, str) else chip
    topology = tuple(int(a) for a in topology)
    n = len(set(group)) if group is not None else math.prod(topology)
    if n <= 1:
        return 0.0
    link = c.ici_link_gbps * 1e9  # bytes/s, one link, one direction
    if kind == "collective-permute":
        return (nbytes / link) * 1e6 + ICI_HOP_US
    span = physical_span(group, topology)
    if span is None:  # not along the torus' axes: one line through the group
        sizes, rings = (n,), [False]
    else:
        sizes, axes = span
        rings = [c.wraps(topology, a) for a in axes]
    bandwidth = sum(2 * link if ring else link for ring in rings)
    hops = sum(a // 2 if ring else a - 1 for a, ring in zip(sizes, rings, strict=True))
    if kind == "all-reduce":
        return 2 * (n - 1) / n * nbytes / bandwidth * 1e6 + 2 * hops * ICI_HOP_US
    if kind == "all-to-all":
        return nbytes / (4 * bandwidth) * 1e6 + hops * ICI_HOP_US
    return (n - 1) / n * nbytes / bandwidth * 1e6 + hops * ICI_HOP_US


def span_text(group: Sequence[int] | None, topology: Sequence[int]) -> str:
    """The physical axes a group runs along, as text: ``"2x4"``, ``"4"``, ``"irregular"``."""
    span = physical_span(group, topology)
    return "irregular" if span is None else "x".join(map(str, span[0])) or "-"


def ici_assumptions(chip: str = "v6e") -> str:
    """The assumptions under every ICI estimate, in one sentence for a notebook or the CLI."""
    from ..environment.chips import get_chip

    c = get_chip(chip)
    wrap = ("axes of 16 chips wrap around into rings, shorter ones are lines (one direction, "
            "a-1 hops)" if c.topology == "2D torus" else
            "slices made of whole 4x4x4 cubes wrap around on every axis, smaller ones are lines "
            "(one direction, a-1 hops)")
    return (f"Estimated, not measured: ring model on {c.name} ICI ({c.ici_link_gbps:g} GB/s per "
            f"link and direction, {c.ici_links} links per chip); mesh devices on the slice's "
            f"chips in row-major order; {wrap}; {ICI_HOP_US:g} µs per hop; bandwidth and "
            "latency only, no overlap with compute (jax-ml/scaling-book).")
