"""Peak figures of TPU chips, in one table with its source.

Source: Cloud TPU documentation (system architecture pages for v5e, v5p and v6e), as collected in
the project's field notes (shared/notes/README.md, November 2026). The host CPU's peak is never
taken from a table: it is measured (see :func:`tpu_workbench.backends.host_peak_flops`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

SOURCE = "Cloud TPU documentation, system architecture pages (v5e, v5p, v6e), checked 2026-11"


@dataclass(frozen=True)
class Chip:
    """Published per-chip figures of one TPU generation."""

    name: str
    bf16_tflops: float  # peak dense bf16 TFLOP/s per chip
    hbm_gb: float  # HBM capacity per chip, GB
    hbm_gbps: float  # HBM bandwidth per chip, GB/s
    ici_gbps: float  # inter-chip interconnect bandwidth per chip (bidirectional), GB/s
    chips_per_host: int
    max_pod_chips: int
    topology: str

    @property
    def peak_flops(self) -> float:
        """Peak bf16 FLOP/s of one chip."""
        return self.bf16_tflops * 1e12

    def as_dict(self) -> dict:
        return {**asdict(self), "source": SOURCE}


CHIPS: dict[str, Chip] = {
    "v5e": Chip("v5e", 197.0, 16.0, 819.0, 400.0, 8, 256, "2D torus"),
    "v6e": Chip("v6e", 918.0, 32.0, 1638.0, 800.0, 8, 256, "2D torus"),
    # v5p ICI is published as 4800 Gbps per chip = 600 GB/s.
    "v5p": Chip("v5p", 459.0, 95.0, 2765.0, 600.0, 4, 8960, "3D torus"),
}


def get_chip(name: str) -> Chip:
    """Look up a chip by name (``"v6e"``, ``"v5e"``, ``"v5p"``), case-insensitively."""
    key = name.lower().replace("tpu", "").strip(" _-")
    # Accept device-kind strings such as "TPU v6 lite" / "v5litepod".
    aliases = {"v6 lite": "v6e", "v6lite": "v6e", "v5 lite": "v5e", "v5lite": "v5e",
               "v5litepod": "v5e"}
    key = aliases.get(key, key)
    if key not in CHIPS:
        raise ValueError(f"unknown TPU chip {name!r}; known chips: {', '.join(CHIPS)}")
    return CHIPS[key]


def chip_table():
    """The chip table as a pandas DataFrame (one row per chip, with the source)."""
    import pandas as pd

    return pd.DataFrame([c.as_dict() for c in CHIPS.values()])
