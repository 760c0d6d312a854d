"""``port``: run a model's step on XLA:CPU as a TPU would see it and report what blocks it.

>>> report = wb.port("my_model.py:make", out="port-report")
>>> report.findings            # kind, where, code, evidence, fix, verified, cost_s
>>> report.steps               # every timed step: as written, and with each fix tried

The measuring happens in a workbench worker (:mod:`tpu_workbench.worker.port`); this module
validates the input first (a missing file or a factory that raises is a SpecError naming it,
before a worker starts), turns the records into findings (:mod:`.findings`), runs a patched copy
of your file where a fix needs an edit that is mechanical (:mod:`.patch`; written to
``out/patched/``, your file untouched) and writes ``findings.csv``, ``steps.csv`` and
``report.json`` (what was checked) atomically into `out`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..runs.runner import run
from ..runs.spec import ExperimentSpec
from . import patch
from .findings import findings, steps_frame, verify_edits

DEFAULT_STEPS = 6
MIN_STEPS = 3  # the first step compiles; a change needs two more to show


@dataclass
class PortReport:
    """What ``port`` found for one model (frames described in :mod:`.findings`)."""

    model: str
    preset: str
    findings: Any
    steps: Any
    checked: list[str]
    summary: dict[str, Any] = field(default_factory=dict)
    out: Path | None = None
    patch: str = ""  # the diff of the patched copy that was run ("" where none was)

    @property
    def clean(self) -> bool:
        return len(self.findings) == 0

    @property
    def label(self) -> str:
        """The model as a reader wrote it: a file under the current directory relative to it."""
        where, sep, attr = self.model.rpartition(":")
        if sep and where.endswith(".py") and Path(where).is_absolute():
            try:
                return f"{Path(where).relative_to(Path.cwd())}:{attr}"
            except ValueError:
                pass
        return self.model

    def text(self) -> str:
        """The report as a terminal would show it."""
        head = f"port {self.label} ({self.preset}): "
        if self.clean:
            return head + "no TPU blockers found. Checked:\n" + "\n".join(
                f"  - {c}" for c in self.checked)
        lines = [head + f"{len(self.findings)} finding(s), costliest first"]
        for i, r in enumerate(self.findings.itertuples(), 1):
            lines += [f"{i}. [{r.kind}] {r.where}", f"   {r.code}", f"   evidence: {r.evidence}",
                      "   fix: " + str(r.fix).replace("\n", "\n        ")]
            if r.verified:
                lines.append(f"   verified: {r.verified}")
        if self.patch and self.out is not None:
            lines.append(f"the edits above were run on a copy: {self.out / 'patched'} "
                         "(its .diff beside it); your file is unchanged")
        return "\n".join(lines)


def port(model: str, preset: str = "default", *, steps: int = DEFAULT_STEPS,
         batch_size: int | None = None, options: dict[str, Any] | None = None,
         out: str | Path | None = None, pool: Any = None,
         on_record: Callable[[dict[str, Any]], None] | None = None,
         on_progress: Callable[[str], None] | None = None) -> PortReport:
    """Find what blocks `model` on a TPU: a few steps in torch_xla's lazy mode and under Dynamo
    on XLA:CPU, every blocker at its line with the fix, tried where no edit is needed.

    `model` is any the workbench takes (a family, ``hf:...``, ``path.py:factory``); `preset`
    defaults to ``"default"`` (a factory's only one) and falls back to ``"tiny"`` for families
    that have no ``default``. With `out`, the report's files are written there.
    `on_progress(message)` hears which pass runs (as the worker's records arrive).
    """
    if not (isinstance(steps, int) and steps >= MIN_STEPS):
        raise SpecError(f"port needs steps >= {MIN_STEPS} (the first compiles), got {steps!r}")
    from .. import models

    family = models.get_model(model)  # a missing file or a raising factory: SpecError here
    if preset not in family.presets and preset == "default" and "tiny" in family.presets:
        preset = "tiny"
    spec = ExperimentSpec(model=model, preset=preset, mode="lazy", steps=steps,
                          batch_size=batch_size, options=dict(options or {}))
    spec.validate()
    passes: set[str] = set()

    def heard(record: dict[str, Any]) -> None:
        name = "Dynamo" if record.get("kind") == "port_dynamo" else record.get("variant", "")
        if on_progress is not None and name and name not in passes:
            passes.add(name)
            on_progress(f"{model}: {name}")
        if on_record is not None:
            on_record(record)

    if on_progress is not None:
        on_progress(f"{model}: starting a worker on XLA:CPU (lazy: watched, then timed; each "
                    "fix that needs no edit; then torch.compile)")
    result = run(spec, heard, task="port", pool=pool)
    frame = findings(result.records, result.summary)
    records, diff = list(result.records), ""
    where, sep, factory = model.rpartition(":")
    patched = patch.patch(where, frame) if sep and where.endswith(".py") else None
    if patched is not None:  # edits a line needs, run on a copy beside the report
        folder = Path(out) / "patched" if out is not None else Path(tempfile.mkdtemp(
            prefix="tpu-workbench-port-"))
        copy = folder / Path(where).name
        _write(folder, copy.name, patched.text)
        _write(folder, f"{copy.name}.diff", patched.diff)
        try:
            edited = run(dataclasses.replace(spec, model=f"{copy.resolve()}:{factory}"), heard,
                         task="port_edited", pool=pool).records
        except Exception as exc:  # the copy does not load or its worker dies: said on its rows
            edited = [{"kind": "port_event", "variant": "edited", "event": "crash", "line": 0,
                       "op": type(exc).__name__, "reason": str(exc).strip().splitlines()[0]
                       if str(exc).strip() else type(exc).__name__}]
        finally:
            if out is None:
                shutil.rmtree(folder, ignore_errors=True)
        label = f"patched/{copy.name}" if out is not None else "a patched copy"
        frame = verify_edits(frame, records, edited, patched, label)
        records += [r for r in edited if r.get("kind") == "port_step"]
        diff = patched.diff
    report = PortReport(model, preset, frame, steps_frame(records),
                        list(result.summary.get("checked", [])), result.summary, patch=diff)
    if out is not None:
        report.out = write(report, Path(out))
    return report


def write(report: PortReport, out: Path) -> Path:
    """``findings.csv``, ``steps.csv`` and ``report.json`` in `out`, each replaced whole."""
    out.mkdir(parents=True, exist_ok=True)
    meta = {"model": report.model, "preset": report.preset, "checked": report.checked,
            "findings": len(report.findings),
            "summary": {k: v for k, v in report.summary.items() if k != "op_lines"}}
    for name, text in (("findings.csv", report.findings.to_csv(index=False)),
                       ("steps.csv", report.steps.to_csv(index=False)),
                       ("report.json", json.dumps(meta, indent=1, default=str))):
        _write(out, name, text)
    return out


def _write(folder: Path, name: str, text: str) -> None:
    """`folder/name` replaced whole (a reader never sees half a file)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, folder / name)
