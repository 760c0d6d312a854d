"""Peak figures of TPU chips, in one table with its source, and the device-kind strings that
name them.

Source: Cloud TPU documentation (system architecture pages for v5e, v5p and v6e), as collected in
the project's field notes (shared/notes/README.md, November 2026); per-link ICI bandwidths from
jax-ml/scaling-book (sharding.md). The host CPU's peak is never taken from a table: it is
measured (see :func:`tpu_workbench.environment.backends.host_peak_flops`).

ICI has one convention here: ``ici_link_gbps`` is the bandwidth of one link in one direction.
A chip has ``ici_links`` links, each carrying that much both ways, so its total is
``2 x ici_links x ici_link_gbps`` (:attr:`Chip.ici_total_gbps`). The published per-chip figures
use mixed conventions: v5e 400 GB/s and v6e 800 GB/s count both directions of 4 links
(4 x 2 x 50, 4 x 2 x 100), v5p's "4800 Gbps" = 600 GB/s counts one direction of 6 links
(6 x 100).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ..errors import SpecError

SOURCE = ("Cloud TPU documentation, system architecture pages (v5e, v5p, v6e), checked 2026-11; "
          "ICI per link: jax-ml/scaling-book")


@dataclass(frozen=True)
class Chip:
    """Published per-chip figures of one TPU generation."""

    name: str
    bf16_tflops: float  # peak dense bf16 TFLOP/s per chip
    hbm_gb: float  # HBM capacity per chip, GB
    hbm_gbps: float  # HBM bandwidth per chip, GB/s
    ici_link_gbps: float  # one ICI link, one direction, GB/s
    ici_links: int  # ICI links per chip (4: 2D torus, 6: 3D torus)
    wraparound_from: int  # the axis length (2D) or cube edge (3D) that wraps around: wraps()
    chips_per_host: int  # on the largest single-host VM (multi-host slices: Slice.chips_per_host)
    max_pod_chips: int
    topology: str

    @property
    def peak_flops(self) -> float:
        """Peak bf16 FLOP/s of one chip."""
        return self.bf16_tflops * 1e12

    @property
    def ici_total_gbps(self) -> float:
        """All of a chip's ICI links, both directions, GB/s."""
        return 2 * self.ici_links * self.ici_link_gbps

    def wraps(self, topology: Sequence[int], axis: int) -> bool:
        """Whether `axis` of a slice of this chip with physical `topology` closes into a ring.

        2D tori (v5e, v6e): an axis as long as a pod's edge (16 chips) wraps, shorter ones do
        not (a v5e 8x16 wraps along its 16 chips only). 3D tori (v5p): the wrap-around links
        come from the optical switches between 4x4x4 cubes, so a slice made of whole cubes
        wraps on every axis and a smaller one (2x2x4) on none (jax-ml/scaling-book tpus.md;
        Cloud TPU v4 docs: a torus where each dimension is a multiple of 4)."""
        if self.topology == "3D torus":
            return all(a % self.wraparound_from == 0 for a in topology)
        return topology[axis] >= self.wraparound_from

    def as_dict(self) -> dict:
        return {**asdict(self), "ici_total_gbps": self.ici_total_gbps, "source": SOURCE}


CHIPS: dict[str, Chip] = {
    # v5e / v6e: slices shorter than 16 chips along an axis have no wrap-around link.
    "v5e": Chip("v5e", 197.0, 16.0, 819.0, 50.0, 4, 16, 8, 256, "2D torus"),
    "v6e": Chip("v6e", 918.0, 32.0, 1638.0, 100.0, 4, 16, 8, 256, "2D torus"),
    # v5p: 3D torus; slices of whole 4x4x4 cubes wrap around (Chip.wraps).
    "v5p": Chip("v5p", 459.0, 95.0, 2765.0, 100.0, 6, 4, 4, 8960, "3D torus"),
}

# Device-kind strings as the runtimes report them, and the chip each names:
# - torch_xla 2.9 ``xm.xla_device_kind()`` returns PJRT's device kind, the same string as JAX's
#   ``jax.Device.device_kind`` (jax 0.7.1's jax/_src/mesh_utils.py keys its device meshes on
#   "TPU v5 lite" (v5e), "TPU v5p" and "TPU v6 lite" (v6e) and also names "TPU v5e"; earlier
#   PJRT releases report v5p as "TPU v5");
# - torch_tpu 0.2.0 ``torch.tpu.get_device_name()`` returns the name of its PCI table
#   (torch_tpu/_internal/utils/hardware.py: "TPU v5e", "TPU v5p", "TPU v6e", "TPU v4", "TPU v7").
DEVICE_KINDS: dict[str, str] = {
    "TPU v5 lite": "v5e", "TPU v5e": "v5e",
    "TPU v5": "v5p", "TPU v5p": "v5p",
    "TPU v6 lite": "v6e", "TPU v6e": "v6e",
}


def get_chip(name: str) -> Chip:
    """Look up a chip by table name (``"v6e"``) or by a device-kind string a runtime reports
    (``"TPU v6 lite"``, ``"TPU v5"``, ``"TPU v6e"``: see :data:`DEVICE_KINDS`)."""
    text = " ".join(str(name).split())
    by_kind = {k.lower(): v for k, v in DEVICE_KINDS.items()}
    key = by_kind.get(text.lower(), text.lower())
    if key not in CHIPS:
        raise ValueError(f"unknown TPU chip {name!r}; known chips: {', '.join(CHIPS)}; "
                         f"known device kinds: {', '.join(DEVICE_KINDS)}")
    return CHIPS[key]


SLICE_SOURCE = ("Cloud TPU documentation: v6e and v5e slice shapes (v6e-1 ... v6e-256; "
                "multi-host slices have 4 chips per host), v5p slice topologies (v5p-N names N "
                "TensorCores: 2 per chip), checked 2026-11")


@dataclass(frozen=True)
class Slice:
    """One slice of a chip generation: how many chips, on how many hosts, in which physical
    topology (chips along each torus axis)."""

    name: str
    chip: str
    topology: tuple[int, ...]
    hosts: int

    @property
    def chips(self) -> int:
        return math.prod(self.topology)

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts

    @property
    def mesh_2d(self) -> tuple[int, int]:
        """The (data, model) mesh tp and dp_tp use: the model axis along the last physical
        axis, the data axis over the others (v6e-16: (4, 4); v5p-32 2x2x4: (4, 4))."""
        return (self.chips // self.topology[-1], self.topology[-1])

    @property
    def topology_text(self) -> str:
        """``"4x4"``, ``"2x2x4"``: how gcloud, xpk and Ray write a slice's topology."""
        return "x".join(map(str, self.topology))

    @property
    def accelerator_type(self) -> str:
        """The name ``gcloud --accelerator-type`` and ``xpk --tpu-type`` take: the slice's own
        name, except v5e's, which Cloud TPU calls ``v5litepod-N`` (xpk 1.16's table too)."""
        return f"v5litepod-{self.chips}" if self.chip == "v5e" else self.name

    def as_dict(self) -> dict:
        return {"slice": self.name, "chip": self.chip, "chips": self.chips,
                "hosts": self.hosts, "chips_per_host": self.chips_per_host,
                "topology": "x".join(map(str, self.topology)), "source": SLICE_SOURCE}


def _slices() -> dict[str, Slice]:
    out = {}
    for chip in ("v6e", "v5e"):  # same 2D shapes; single-host up to 8 chips, then 4 per host
        for shape in ((1, 1), (2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16)):
            n = math.prod(shape)
            out[f"{chip}-{n}"] = Slice(f"{chip}-{n}", chip, shape, 1 if n <= 8 else n // 4)
    for cores, shape in ((8, (2, 2, 1)), (16, (2, 2, 2)), (32, (2, 2, 4)), (64, (2, 4, 4)),
                         (128, (4, 4, 4))):  # v5p: 4 chips per host
        out[f"v5p-{cores}"] = Slice(f"v5p-{cores}", "v5p", shape, math.prod(shape) // 4)
    return out


SLICES: dict[str, Slice] = _slices()
SLICE_ALIASES = {f"v5litepod-{s.chips}": n for n, s in SLICES.items() if s.chip == "v5e"}


def get_slice(name: str, chip: str | None = None) -> Slice:
    """Look up a slice by name (``"v6e-16"``; ``"v5litepod-16"`` is ``"v5e-16"``) or by
    topology (``"4x4"``: of `chip`, v6e by default). With `chip`, the slice must be of that
    chip."""
    key = SLICE_ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    if re.fullmatch(r"\d+(x\d+)+", key):  # a topology ("4x4"): the slice of that shape
        return _slice_of_topology(key, chip or "v6e")
    if key not in SLICES and "-" in key and key.split("-")[0] not in CHIPS:
        raise SpecError(f"unknown TPU chip {key.split('-')[0]!r} in slice {name!r}; known "
                        f"chips: {', '.join(CHIPS)}; known slices: {', '.join(SLICES)}")
    if key not in SLICES:
        prefix = f"{get_chip(chip).name}-" if chip else ""
        known = [n for n in SLICES if n.startswith(prefix)]
        raise SpecError(f"unknown TPU slice {name!r}; known slices: {', '.join(known)}")
    found = SLICES[key]
    if chip is not None and found.chip != get_chip(chip).name:
        raise SpecError(f"slice {name!r} is a {found.chip} slice, not {get_chip(chip).name}; "
                         f"{get_chip(chip).name} slices: "
                         + ", ".join(n for n, s in SLICES.items() if s.chip == get_chip(chip).name))
    return found


def _slice_of_topology(topology: str, chip: str) -> Slice:
    """The slice of `chip` whose physical topology is `topology` (``"4x4"`` -> v6e-16)."""
    c = get_chip(chip).name
    mine = {s.topology_text: s for s in SLICES.values() if s.chip == c}
    if topology not in mine:
        raise SpecError(f"no {c} slice has topology {topology!r}; {c} topologies: "
                        + ", ".join(f"{t} ({s.name})" for t, s in mine.items()))
    return mine[topology]


def slice_table():
    """The slice table as a pandas DataFrame (one row per slice, with the source)."""
    import pandas as pd

    return pd.DataFrame([s.as_dict() for s in SLICES.values()])


def chip_table():
    """The chip table as a pandas DataFrame (one row per chip, with the source)."""
    import pandas as pd

    return pd.DataFrame([c.as_dict() for c in CHIPS.values()])
