"""The HLO files a run dumped: which is which, the main module, XLA's memory report, search,
and a run's HLO written out (what ``tpu-workbench hlo`` saves)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import SpecError
from .frames import instructions
from .parse import HloLike, HloParseError, as_modules, parse_hlo
from .summary import summary

FILE_COLUMNS = ["module_id", "module", "stage", "backend", "pass_index", "file", "path", "bytes"]


_FILE = re.compile(r"^module_(\d+)\.(.+)\.txt$")


_STAGES = [  # (suffix regex on what follows the module name, stage)
    (re.compile(r"^(?:(\w+?)_)?after_optimizations-memory-usage-report$"), "memory-usage-report"),
    (re.compile(r"^(?:(\w+?)_)?after_optimizations-buffer-assignment$"), "buffer-assignment"),
    (re.compile(r"^(?:(\w+?)_)?after_optimizations$"), "after_optimizations"),
    (re.compile(r"^()before_optimizations$"), "before_optimizations"),
]


_PASS = re.compile(r"^(.+)\.(\d{4})\.([\w\-]+)\.after_([\w\-]+)\.before_([\w\-]+)$")


def classify_file(filename: str) -> dict[str, Any] | None:
    """module_id, module, stage, backend and pass_index of an XLA dump file name, or None.

    ``module_0001.step.1935.cpu_after_optimizations.txt`` -> stage ``after_optimizations``,
    backend ``cpu``; ``module_0000.m.61.0001.spmd-partitioner.after_spmd-partitioning.before_...``
    -> stage ``spmd-partitioning``; ``...after_sharding-propagation.before_spmd-partitioning``
    -> ``sharding-propagation``.
    """
    m = _FILE.match(filename)
    if not m:
        return None
    module_id, rest = int(m.group(1)), m.group(2)
    pm = _PASS.match(rest)
    if pm:
        return {"module_id": module_id, "module": pm.group(1), "stage": pm.group(4),
                "backend": "", "pass_index": int(pm.group(2))}
    for pattern, stage in _STAGES:
        name, _, suffix = rest.rpartition(".")
        sm = pattern.match(suffix)
        if sm and name:
            return {"module_id": module_id, "module": name, "stage": stage,
                    "backend": sm.group(1) or "", "pass_index": None}
    return None


def load_run_hlo(result_or_dir: Any) -> pd.DataFrame:
    """The HLO files of a run: a :class:`~tpu_workbench.runs.store.RunResult` (or its ``out_dir``,
    or a folder of XLA dump files). One row per file, ordered by module and stage.

    Columns: module_id (XLA's compile order), module (the HloModule name), stage
    (``before_optimizations``, ``after_optimizations``, ``memory-usage-report``,
    ``buffer-assignment``, ``sharding-propagation``, ``spmd-partitioning``), backend (``cpu``,
    ``tpu``... for after-optimisation files), pass_index, file, path, bytes.
    """
    folder = getattr(result_or_dir, "out_dir", result_or_dir)
    if folder is None:
        raise SpecError("this run has no output folder (it saved no results)")
    folder = Path(folder)
    if (folder / "hlo").is_dir():
        folder = folder / "hlo"
    if not folder.is_dir():
        raise SpecError(f"no HLO folder at {str(folder)!r}; run with capture=('hlo',)")
    rows = []
    for path in sorted(folder.iterdir()):
        info = classify_file(path.name)
        if info is None or not path.is_file():
            continue
        rows.append({**info, "file": path.name, "path": str(path),
                     "bytes": path.stat().st_size})
    order = {s: i for i, s in enumerate(["before_optimizations", "sharding-propagation",
                                         "spmd-partitioning", "after_optimizations",
                                         "memory-usage-report", "buffer-assignment"])}
    df = pd.DataFrame(rows, columns=FILE_COLUMNS)
    if len(df):
        df = df.assign(_o=df["stage"].map(order)).sort_values(
            ["module_id", "_o", "pass_index"]).drop(columns="_o").reset_index(drop=True)
    df["pass_index"] = df["pass_index"].astype("Int64")
    return df


def read_hlo(files: pd.DataFrame, stage: str = "after_optimizations") -> list[str]:
    """Texts of every module at `stage`, in compile order (`files` from :func:`load_run_hlo`)."""
    sub = files[files["stage"] == stage]
    return [Path(p).read_text() for p in sub["path"]]


def main_module(files: pd.DataFrame, stage: str = "after_optimizations") -> str:
    """Text of the biggest module at `stage`: the training step (the other modules of a run are
    small: moving data to the device, the optimizer's first state...)."""
    sub = files[files["stage"] == stage]
    if not len(sub):
        stages = sorted(set(files["stage"]))
        raise SpecError(f"no {stage!r} HLO among the run's files (stages: {stages})")
    return Path(sub.loc[sub["bytes"].idxmax(), "path"]).read_text()


_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}


_ALLOC = re.compile(r"allocation (\d+): size ([\d.]+)(B|KiB|MiB|GiB|TiB)?,?\s*(.*?):?\s*$")


def memory_report(text: str) -> dict[str, Any]:
    """Parse an ``*after_optimizations-memory-usage-report.txt``.

    Returns ``total_bytes`` (``Total bytes used: N``) and ``allocations``: a DataFrame with
    allocation, size_bytes, kind (``parameter``, ``preallocated-temp``, ``constant``,
    ``output``, ``thread-local``, ``temp``), parameter (its number), shape, maybe_live_out,
    description.
    """
    m = re.search(r"Total bytes used:\s*(\d+)", text or "")
    if not m:
        raise HloParseError("not an XLA memory-usage report: no 'Total bytes used: N' line")
    rows = []
    for line in text.splitlines():
        am = _ALLOC.search(line)
        if not am:
            continue
        desc = am.group(4).strip()
        pm = re.search(r"parameter (\d+)", desc)
        sm = re.search(r"shape \|([^|]*)\|", desc)
        kind = ("parameter" if pm else "preallocated-temp" if "preallocated-temp" in desc
                else "constant" if "constant" in desc else "thread-local"
                if "thread-local" in desc else "output" if "output" in desc else "temp")
        rows.append({"allocation": int(am.group(1)),
                     "size_bytes": int(round(float(am.group(2)) * _UNITS[am.group(3) or "B"])),
                     "kind": kind, "parameter": int(pm.group(1)) if pm else None,
                     "shape": sm.group(1) if sm else "",
                     "maybe_live_out": "maybe-live-out" in desc, "description": desc})
    cols = ["allocation", "size_bytes", "kind", "parameter", "shape", "maybe_live_out",
            "description"]
    allocs = pd.DataFrame(rows, columns=cols)
    allocs["parameter"] = allocs["parameter"].astype("Int64")
    return {"total_bytes": int(m.group(1)), "allocations": allocs}


def search(source: HloLike | Sequence[HloLike], pattern: str, regex: bool = True,
           case: bool = False) -> pd.DataFrame:
    """Instruction lines matching `pattern` (a regex, or plain text if it is not a valid one):
    columns module, computation, line, name, opcode, text. An empty pattern matches all."""
    flags = 0 if case else re.IGNORECASE
    try:
        rx = re.compile(pattern if regex else re.escape(pattern), flags)
    except re.error:
        rx = re.compile(re.escape(pattern), flags)
    rows = []
    for mod in as_modules(source):
        for comp in mod.computations:
            for inst in comp.instructions:
                if rx.search(inst.text):
                    rows.append({"module": mod.name, "computation": comp.name,
                                 "line": inst.line, "name": inst.name, "opcode": inst.opcode,
                                 "text": inst.text.strip()})
    return pd.DataFrame(rows, columns=["module", "computation", "line", "name", "opcode", "text"])


def write_run_hlo(files: pd.DataFrame, out: Path) -> dict[str, Any]:
    """Copy a run's HLO texts into ``out/hlo/``, write ``out/ops.csv`` (every instruction of the
    main module after optimisation) and ``out/summary.json``; return the summary."""
    (out / "hlo").mkdir(exist_ok=True)
    for path in files["path"]:
        shutil.copy2(path, out / "hlo" / Path(path).name)
    modules = []
    for module_id, group in files.groupby("module_id", sort=True):
        entry: dict[str, Any] = {"module_id": int(module_id), "module": group["module"].iloc[0],
                                 "files": list(group["file"])}
        for stage in ("before_optimizations", "after_optimizations"):
            sub = group[group["stage"] == stage]
            if len(sub):
                s = summary(Path(sub["path"].iloc[0]).read_text())
                entry[stage] = s
        mem = group[group["stage"] == "memory-usage-report"]
        if len(mem):
            entry["memory_total_bytes"] = memory_report(
                Path(mem["path"].iloc[0]).read_text())["total_bytes"]
        modules.append(entry)
    stage = "after_optimizations" if (files["stage"] == "after_optimizations").any() \
        else "before_optimizations"
    main_text = main_module(files, stage)
    main = parse_hlo(main_text)
    ops = instructions(main).drop(columns=["attributes"])
    tmp = out / "ops.csv.tmp"
    ops.to_csv(tmp, index=False)
    tmp.replace(out / "ops.csv")
    result = {"main_module": main.name, "main_stage": stage, "num_modules": len(modules),
              "modules": modules}
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(result, indent=2, default=str))
    tmp.replace(out / "summary.json")
    return result
