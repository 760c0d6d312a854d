"""``port``: run a model's step on XLA:CPU as a TPU would see it, report what blocks it, and try
each fix on a patched copy of the model's file, measured on its own batches.

>>> report = wb.port("my_model.py:make", out="port-report")
>>> report.findings            # kind, where, code, evidence, fix, status, verified, instead, cost_s
>>> report.trials              # each fix tried: before and after, measured
>>> report.steps               # every step: as written, and each patched copy

The measuring happens in a workbench worker (:mod:`tpu_workbench.worker.port`); this module
validates the input first (a missing file or a factory that raises is a SpecError naming it,
before a worker starts), turns the records into findings (:mod:`.findings`), then, for a model
in a file, tries the findings' fixes one at a time (:mod:`.patch`), in :data:`.findings.ORDER`:
each on a copy of the file that holds the fixes verified before it, run like the original
(same seed, so the same batches from the model's own ``make_batch``) and judged against the
copy before it (:func:`.findings.judge`). A fix that did not help, hurt or failed stays in the
report with its numbers and is not kept for the next one. The user's file is never written;
``out/patched/`` gets the copy with every verified fix and its diff, and each tried edit's diff
under ``out/patched/tried/``.
"""

from __future__ import annotations

import json
import math
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
from .findings import ORDER, figures, findings, sort, steps_frame
from .verdict import Variant, instead_for, judge, judge_break

DEFAULT_STEPS = 6
MIN_STEPS = 3  # the first compiles and two are watched; the third is timed unwatched
TRIAL_COLUMNS = ["variant", "kind", "where", "status", "fix", "compiles_before",
                 "compiles_after", "executions_before", "executions_after",
                 "from_device_before", "from_device_after", "to_device_before",
                 "to_device_after", "step_s_before", "step_s_after", "loss_before",
                 "loss_after", "on_top_of"]


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
    patch: str = ""  # the diff of the copy with every verified fix ("" where none was)
    trials: Any = None  # one row per fix tried (TRIAL_COLUMNS)
    records: list[dict[str, Any]] = field(default_factory=list)  # every run's, as streamed

    @property
    def clean(self) -> bool:
        return len(self.findings) == 0

    def variants_of(self, kind: str, where: str) -> list[str]:
        """The passes that show the fix of the finding `kind` at `where`: the copy it was tried
        on and the one it was measured against; only "as written" where none was tried."""
        if self.trials is None or not len(self.trials):
            return ["as written"]
        tried = self.trials[(self.trials["kind"] == kind) & (self.trials["where"] == where)]
        if not len(tried):
            return ["as written"]
        return list(dict.fromkeys([tried["on_top_of"].iloc[0], tried["variant"].iloc[0]]))

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
            lines += [f"{i}. [{r.kind}] {r.where}  ({r.status})", f"   {r.code}",
                      f"   evidence: {r.evidence}",
                      "   fix: " + str(r.fix).replace("\n", "\n        ")]
            if r.verified:
                lines.append(f"   measured: {r.verified}")
            if r.instead:
                lines.append(f"   instead: {r.instead}")
        if self.patch and self.out is not None:
            lines.append(f"the verified fixes, together: {self.out / 'patched'} (its .diff "
                         "beside it; each tried edit under patched/tried/); your file is "
                         "unchanged")
        return "\n".join(lines)


def port(model: str, preset: str = "default", *, steps: int = DEFAULT_STEPS,
         batch_size: int | None = None, options: dict[str, Any] | None = None,
         out: str | Path | None = None, pool: Any = None, fixes: bool = True,
         on_record: Callable[[dict[str, Any]], None] | None = None,
         on_progress: Callable[[str], None] | None = None) -> PortReport:
    """Find what blocks `model` on a TPU: `steps` steps in torch_xla's lazy mode (the first two
    watched) and Dynamo on XLA:CPU, every blocker at its line with the fix; then, for a model in
    a file and with `fixes`, each fix tried on a patched copy and measured (see the module).

    `model` is any the workbench takes (a family, ``hf:...``, ``path.py:factory``); `preset`
    defaults to ``"default"`` (a factory's only one) and falls back to ``"tiny"`` for families
    that have no ``default``. With `out`, the report's files are written there.
    `on_progress(message)` hears which pass runs.
    """
    if not (isinstance(steps, int) and steps >= MIN_STEPS):
        raise SpecError(f"port needs steps >= {MIN_STEPS} (the first compiles, two are "
                        f"watched), got {steps!r}")
    from .. import models

    family = models.get_model(model)  # a missing file or a raising factory: SpecError here
    if preset not in family.presets and preset == "default" and "tiny" in family.presets:
        preset = "tiny"
    spec = ExperimentSpec(model=model, preset=preset, mode="lazy", steps=steps,
                          batch_size=batch_size, options=dict(options or {}))
    spec.validate()

    def say(message: str) -> None:
        if on_progress is not None:
            on_progress(message)

    def heard(record: dict[str, Any]) -> None:
        if on_record is not None:
            on_record(record)

    say(f"{model}: as written, on XLA:CPU ({steps} steps, the first two watched by torch_xla's "
        "execution analysis), then torch.compile")
    result = run(spec, heard, task="port", pool=pool)
    frame = findings(result.records, result.summary)
    records, diff, trials = list(result.records), "", []
    where, sep, factory = model.rpartition(":")
    if fixes and sep and where.endswith(".py") and len(frame):
        frame, tried, diff, trials = _try_fixes(frame, spec, Path(where), factory, result,
                                                out, pool, heard, say)
        records += tried
    import pandas as pd

    report = PortReport(model, preset, sort(frame), steps_frame(records),
                        list(result.summary.get("checked", [])), result.summary, patch=diff,
                        trials=pd.DataFrame(trials, columns=TRIAL_COLUMNS), records=records)
    if out is not None:
        report.out = write(report, Path(out))
    return report


def _try_fixes(frame: Any, spec: ExperimentSpec, path: Path, factory: str, result: Any,
               out: str | Path | None, pool: Any, heard: Callable[[dict[str, Any]], None],
               say: Callable[[str], None]) -> tuple[Any, list[dict[str, Any]], str, list[dict]]:
    """Each finding's fix on a copy holding the fixes verified before it (see the module):
    the frame with each row's outcome, the copies' step records, the diff of the copy with
    every verified fix, one row per fix tried."""
    frame = frame.copy()
    original = path.read_text()
    mine = str(path.resolve())
    base = Variant("as written", list(result.records), mine, {})
    text, kept, tried, trials = original, [], [], []
    folder = Path(tempfile.mkdtemp(prefix="tpu-workbench-port-"))
    tried_diffs: dict[str, str] = {}
    try:
        order = sorted((i for i in frame.index if frame.at[i, "kind"] in ORDER),
                       key=lambda i: (ORDER.index(frame.at[i, "kind"]), frame.at[i, "line"]))
        for i in order:
            row = frame.loc[i]
            if not row["file"] or str(Path(row["file"]).resolve()) != mine:
                frame.at[i, "instead"] = (f"the line is in {row['file'] or 'no file'}, not in "
                                          f"{path.name}: the workbench edits only the model's "
                                          "own file")
                continue
            dim = _dim(row, result.summary, result.records)
            edit, why = patch.edit_for(row["kind"], text, base.at(int(row["line"]))[0],
                                       row["code"], dim=dim)
            if edit is None:
                frame.at[i, "instead"] = why
                continue
            n = len(trials) + 1
            label = f"fix {n}: {row['kind']} at line {row['line']}"
            copy = folder / f"fix{n}" / path.name
            new_text = edit.apply(text)
            copy.parent.mkdir(parents=True)
            copy.write_text(new_text)
            tried_diffs[f"{n}-{row['kind']}-line{row['line']}.diff"] = patch.diff(
                text, new_text, path.name)
            breaks = [j for j in frame.index
                      if frame.at[j, "kind"] in ("graph_break", "dynamo_crash")
                      and frame.at[j, "file"] == row["file"]
                      and int(frame.at[j, "line"]) == int(row["line"])]
            say(f"{path.name}: {label} ({edit.what}), on a patched copy")
            records = _run_copy(spec.replace(model=f"{copy.resolve()}:{factory}"), label,
                                "port_edited_dynamo" if breaks else "port_edited", pool, heard)
            lines = _compose(base.lines, patch.line_map(text, new_text))
            trial = Variant(label, records, str(copy.resolve()), lines)
            fix = f"tried ({edit.what}) on a patched copy"
            verdict = judge(row, base, trial, fix)
            for key, value in verdict.items():
                frame.at[i, key] = value
            for j in breaks:
                for key, value in judge_break(frame.loc[j], trial,
                                              f"{fix} for the {row['kind']} here").items():
                    frame.at[j, key] = value
            trials.append(_trial_row(row, label, verdict["status"], edit.what, base, trial))
            tried += records
            if verdict["status"] == "verified":
                base, text = trial, new_text
                kept.append(label)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for i in frame.index:  # the rest: no edit was made for them
        if frame.at[i, "status"] == "not tried" and not frame.at[i, "instead"]:
            frame.at[i, "instead"] = instead_for(frame.loc[i])
    diff = patch.diff(original, text, path.name) if kept else ""
    if out is not None and (kept or tried_diffs):
        folder_out = Path(out) / "patched"
        if kept:
            _write(folder_out, path.name, text)
            _write(folder_out, f"{path.name}.diff", diff)
        for name, body in tried_diffs.items():
            _write(folder_out / "tried", name, body)
    return frame, tried, diff, trials


def _run_copy(spec: ExperimentSpec, label: str, task: str, pool: Any,
              heard: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """The records of a patched copy's run, named `label` (a copy that does not load, or whose
    worker dies, is a crash record: the fix failed)."""
    def named(record: dict[str, Any]) -> dict[str, Any]:
        return {**record, "variant": label} if record.get("variant") == "edited" else record

    try:
        records = run(spec, lambda r: heard(named(r)), task=task, pool=pool).records
    except Exception as exc:
        message = str(exc).strip()
        return [{"kind": "port_event", "variant": label, "event": "crash", "line": 0,
                 "file": "", "op": type(exc).__name__, "calls_per_step": 1.0,
                 "reason": message.splitlines()[0] if message else type(exc).__name__}]
    return [named(r) for r in records]


def _dim(row: Any, summary: dict[str, Any], records: list[dict[str, Any]]) -> int | None:
    """The dimension a ``shapes`` finding's input changes along, counted from the end."""
    if row["kind"] != "shapes":
        return None
    shapes = next((r["shapes"] for r in records if r.get("kind") == "port_step"), {})
    for key, made in (summary.get("made_at") or {}).items():
        if made.get("file") == row["file"] and int(made.get("line") or 0) == int(row["line"]):
            dims = (summary.get("varying") or {}).get(key) or {}
            if dims and key in shapes:
                return int(next(iter(dims))) - len(shapes[key])
    return None


def _compose(first: dict[int, list[int]], then: dict[int, list[int]]) -> dict[int, list[int]]:
    """Original line -> lines, through `first` (empty: the identity) and then `then`."""
    if not first:
        return dict(then)
    return {o: [n for m in mids for n in then.get(m, [m])] for o, mids in first.items()}


def _trial_row(row: Any, label: str, status: str, what: str, before: Variant,
               after: Variant) -> dict[str, Any]:
    b, a = figures(before.records, before.name), figures(after.records, after.name)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    return {"variant": label, "kind": row["kind"], "where": row["where"], "status": status,
            "fix": what, "on_top_of": before.name,
            **{f"{name}_{side}": fig[name] for name in ("compiles", "executions",
                                                         "from_device", "to_device", "step_s")
               for side, fig in (("before", b), ("after", a))},
            "loss_before": mean(b["losses"]), "loss_after": mean(a["losses"])}


def write(report: PortReport, out: Path) -> Path:
    """``findings.csv``, ``trials.csv``, ``steps.csv`` and ``report.json`` in `out`, each
    replaced whole."""
    out.mkdir(parents=True, exist_ok=True)
    meta = {"model": report.model, "preset": report.preset, "checked": report.checked,
            "findings": len(report.findings),
            "summary": {k: v for k, v in report.summary.items() if k != "op_lines"}}
    trials = report.trials if report.trials is not None else None
    for name, text in (("findings.csv", report.findings.to_csv(index=False)),
                       ("trials.csv", trials.to_csv(index=False) if trials is not None
                        else ""),
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
