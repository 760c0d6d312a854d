"""Models with planted TPU blockers, and how a ``port`` report scores against what was planted.

A folder holds model files (``name.py``, a factory with ``make``), each with
``name.expected.csv`` beside it: one row per finding ``port`` must report, ``kind,file,line``
(the file relative to the folder; a ``why`` column says what was planted, for the reader). A
model whose file has no rows is clean: any finding is an extra. :func:`score` counts every
expected finding the report missed and every finding it reported that was not planted, at its
own file and line. The suite's folder is ``tests/models/port``; ``scripts/bench_port.py``
scores any folder.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Finding = tuple[str, str, int]  # kind, file (resolved), line


def models(folder: str | Path) -> list[Path]:
    """The model files of `folder` that have an expected-findings file, sorted by name."""
    return sorted(p for p in Path(folder).glob("*.py")
                  if p.with_name(f"{p.stem}.expected.csv").is_file())


def expected(model: str | Path) -> set[Finding]:
    """The findings planted in `model` (its ``.expected.csv``)."""
    model = Path(model)
    path = model.with_name(f"{model.stem}.expected.csv")
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    missing = {"kind", "file", "line"} - set(rows[0] if rows else {"kind", "file", "line"})
    if missing:
        raise ValueError(f"{path}: no column {', '.join(sorted(missing))} (expected kind, "
                         "file, line)")
    return {(r["kind"], str((model.parent / r["file"]).resolve()), int(r["line"]))
            for r in rows}


def found(frame: Any) -> set[Finding]:
    """A findings frame's (kind, file, line), files resolved (a finding with no file keeps
    "")."""
    return {(kind, str(Path(file).resolve()) if file else "", int(line))
            for kind, file, line in zip(frame["kind"], frame["file"], frame["line"],
                                        strict=True)}


@dataclass
class Score:
    """One model's findings against what was planted in it."""

    model: str
    expected: set[Finding]
    found: set[Finding]

    @property
    def hits(self) -> set[Finding]:
        return self.expected & self.found

    @property
    def missing(self) -> set[Finding]:
        return self.expected - self.found

    @property
    def extra(self) -> set[Finding]:
        return self.found - self.expected

    def describe(self) -> str:
        """The misses and extras, one per line, ``kind file:line`` (file by name)."""
        def show(items: set[Finding]) -> list[str]:
            return [f"{kind} {Path(file).name or '?'}:{line}" for kind, file, line in
                    sorted(items)]

        return "\n".join([f"missing: {m}" for m in show(self.missing)]
                         + [f"extra: {e}" for e in show(self.extra)])


def score(model: str | Path, frame: Any) -> Score:
    """`frame` (a report's findings) against what `model` has planted."""
    return Score(str(model), expected(model), found(frame))


def precision_recall(scores: list[Score]) -> tuple[float, float]:
    """Over all `scores`: found and planted / found, found and planted / planted (1.0 where
    nothing was found, or nothing was planted)."""
    hits = sum(len(s.hits) for s in scores)
    reported = sum(len(s.found) for s in scores)
    planted = sum(len(s.expected) for s in scores)
    return (hits / reported if reported else 1.0, hits / planted if planted else 1.0)
