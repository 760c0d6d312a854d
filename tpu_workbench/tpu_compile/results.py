"""What libtpu's compile returns, as frames: the TPU program's ops, its collectives, its memory
per chip and its largest HBM buffers. Pure: text and dicts in, frames out."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from .. import hlo, sharding
from ..environment.chips import get_chip

UNKNOWN_CYCLES = 2**63 - 1  # what the TPU cost model writes when it has no estimate

OP_COLUMNS = ["name", "opcode", "fusion_kind", "shape", "flops", "mxu_flops", "bytes", "trips",
              "estimated_cycles", "vmem_bytes", "is_async", "source_op"]
"""Columns of :func:`ops_frame`, one row per top-level op of chip 0's program: ``flops`` and
``bytes`` (XLA's cost analysis of the op as the TPU fused it: operands + result, an async
copy counted once, at its start; a loop ``trips`` times its body), ``mxu_flops`` (``flops``
of the ops that hold a matmul or convolution: the matrix unit's work), ``estimated_cycles``
(the TPU cost model's, NaN where it gave none), ``vmem_bytes`` (scoped VMEM the op uses),
``is_async`` (a ``-start`` whose ``-done`` comes later: it may overlap)."""

# The HBM libtpu 0.0.51 lets one program use, as its refusals print it (GiB): a v6e chip's
# "available HBM (31.24G)" of its 32 GiB ("CompileTimeHbmOom", notes/tpu_compiler.md). Other
# chips: their table HBM, until a refusal says otherwise.
COMPILER_HBM_GIB = {"v6e": 31.24}


def usable_hbm_bytes(chip: str) -> float:
    """The HBM one program may use on `chip`, by the compiler where known."""
    c = get_chip(chip)
    return COMPILER_HBM_GIB[c.name] * 2**30 if c.name in COMPILER_HBM_GIB else c.hbm_gb * 1e9


MEMORY_KEYS = {"arguments": "argument_size_in_bytes", "outputs": "output_size_in_bytes",
               "aliased": "alias_size_in_bytes", "temp": "temp_size_in_bytes",
               "code": "generated_code_size_in_bytes", "peak": "peak_memory_in_bytes"}


def memory_summary(compiled: dict[str, Any], chip: str) -> dict[str, Any]:
    """Per-chip memory from the compiler's buffer assignment: ``arguments`` (weights, optimizer
    state, batch), ``outputs``, ``aliased`` (outputs that reuse an argument's buffer),
    ``temp`` (the block of temporaries the chip allocates: activations and the like),
    ``code``, ``peak`` (the heap simulator's peak, which packs buffers tighter than the
    allocation), ``total_bytes`` (arguments + outputs - aliased + temp: what the chip holds),
    ``hbm_bytes`` (what the compiler lets a program use: :func:`usable_hbm_bytes`),
    ``fraction`` and ``fits``."""
    stats = compiled["memory"]
    out: dict[str, Any] = {k: int(stats.get(v, 0)) for k, v in MEMORY_KEYS.items()}
    total = out["arguments"] + out["outputs"] - out["aliased"] + out["temp"]
    hbm = usable_hbm_bytes(chip)
    out.update(total_bytes=total, hbm_bytes=hbm, fraction=total / hbm, fits=total <= hbm)
    return out


def _owners(mods: Sequence[Any]) -> dict[tuple[str, str], str]:
    """(module, computation) -> the entry instruction whose work it is (fusions, calls)."""
    owner: dict[tuple[str, str], str] = {}
    for mod in mods:
        comps = {c.name: c for c in mod.computations}
        for inst in mod.entry.instructions:
            todo = list(inst.called)
            while todo:
                name = todo.pop()
                if (mod.name, name) in owner or name not in comps:
                    continue
                owner[(mod.name, name)] = inst.name
                todo += [c for i in comps[name].instructions for c in i.called]
    return owner


def _backend(inst_attributes: dict[str, str]) -> tuple[float, float]:
    """(estimated cycles, scoped VMEM bytes) from an op's TPU backend_config."""
    raw = inst_attributes.get("backend_config", "")
    try:
        config = json.loads(raw) if raw.startswith("{") else {}
    except json.JSONDecodeError:
        config = {}
    cycles = float((config.get("window_config") or {}).get("estimated_cycles", "nan"))
    if cycles >= UNKNOWN_CYCLES:
        cycles = math.nan
    vmem = sum(int(m.get("size", 0)) for m in config.get("used_scoped_memory_configs", []))
    return cycles, float(vmem)


def ops_frame(text: str) -> pd.DataFrame:
    """Every top-level op of the TPU program `text`, columns :data:`OP_COLUMNS`. FLOPs and bytes
    are XLA's own cost analysis of each op (:func:`tpu_workbench.hlo.per_op_cost`): it counts
    the real taps of the convolutions the TPU writes batched matmuls as (an analytic count of
    their padded windows is several times too high)."""
    mods = hlo.parse_modules(text)
    ops = hlo.per_op_cost(mods)
    owner = _owners(mods)
    dots = hlo.dot_flops(mods)
    matmul = {owner.get((m, c), n) for m, c, n in
              zip(dots["module"], dots["computation"], dots["name"], strict=True)}
    backend = {i.name: _backend(i.attributes) for m in mods for i in m.entry.instructions}
    # XLA's cost analysis counts a loop's body once: the TPU's windowed matmuls (an FSDP
    # all-gather split into steps that overlap the matmul) run it trip-count times.
    trips = {i.name: m.trip_count(i) for m in mods for i in m.entry.instructions
             if i.opcode == "while"}
    times = ops["name"].map(trips).fillna(1.0)
    ops["trips"] = times
    ops["flops"] *= times
    ops["bytes"] *= times
    ops["mxu_flops"] = ops["flops"].where(ops["name"].isin(matmul), 0.0)
    ops["estimated_cycles"] = ops["name"].map(lambda n: backend.get(n, (math.nan, 0))[0])
    ops["vmem_bytes"] = ops["name"].map(lambda n: backend.get(n, (0, 0.0))[1])
    ops["is_async"] = ops["opcode"].str.endswith("-start")
    ops.loc[ops["opcode"].str.endswith("-done"), "bytes"] = 0.0
    return ops[OP_COLUMNS].reset_index(drop=True)


def collectives_frame(text: str, chip: str, mesh: Sequence[int],
                      topology: Sequence[int]) -> pd.DataFrame:
    """The collectives of the TPU program `text` as compiled
    (:func:`tpu_workbench.sharding.collectives_frame`'s columns, ICI times on the slice's
    torus), plus ``is_async`` (started and finished apart, so compute may hide it)."""
    frame = hlo.instructions(hlo.parse_modules(text))
    out = sharding.collectives_frame(None, chip, hlo_text=frame, mesh_shape=tuple(mesh),
                                     topology=tuple(topology))
    starts = set(frame.loc[frame["opcode"].str.endswith("-start"), "name"])
    out["is_async"] = out["name"].isin(starts)
    return out


_SIZE = re.compile(r"([\d.]+)(B|KiB|MiB|GiB|TiB)$")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def buffers_frame(dump: Path, top: int = 20) -> pd.DataFrame:
    """The largest HBM allocations of the compiler's memory-usage report (``size_bytes``,
    ``shapes``), biggest first: what fills a chip's HBM, in the compiler's words."""
    rows = []
    for report in sorted(Path(dump).glob("*memory-usage-report.txt")):
        space = "default"
        for line in report.read_text().splitlines():
            found = re.match(r"Memory Space: (\S+)", line)
            if found:
                space = found.group(1)
                continue
            parts = [p.strip() for p in line.split(";")]
            if space != "default" or len(parts) < 5:
                continue
            size = _SIZE.match(parts[1])
            if size:
                rows.append({"size_bytes": int(float(size.group(1)) * _UNITS[size.group(2)]),
                             "shapes": parts[4]})
    frame = pd.DataFrame(rows, columns=["size_bytes", "shapes"])
    return frame.sort_values("size_bytes", ascending=False).head(top).reset_index(drop=True)
