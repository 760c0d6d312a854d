"""Generation runs: one spec (:func:`generate`) or a strategy x mode comparison
(:func:`generate_many`), streamed from workers like training runs, stored and reused the same way.

Counting honestly: a worker's compile cache serves any program it compiled before, so a
comparison gives each mode a fresh worker of its own (``fresh=True``, the default), shared by
that mode's strategies, whose programs never coincide (their shapes differ: a growing sequence,
a growing cache, a cache of the prompt's length plus the new tokens, or the largest bucket's).
The lazy and compile modes trace the same graphs, so they never share a worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import WorkbenchError
from ..runs import runner
from ..runs.store import RunResult
from ..runs.workers import WorkerPool
from . import analysis as generation
from .spec import GenerationSpec, with_positions

TASK = "generate"


def specs_for(model: str, preset: str = "tiny", modes: Sequence[str] = ("torch_eager", "lazy"),
              decodes: Sequence[str] = tuple(generation.STRATEGIES), **fields: Any
              ) -> list[GenerationSpec]:
    """One spec per mode and decode strategy, with the same model options for all of them
    (the position table raised where the run needs it, :func:`with_positions`), validated."""
    base = with_positions(GenerationSpec(model=model, preset=preset, **fields))
    specs = [base.replace(mode=m, decode=d) for m in modes for d in decodes]
    for spec in specs:
        spec.validate()
    return specs


def stored(spec: GenerationSpec, out_dir: Path | None = None) -> RunResult | None:
    """The newest completed run of `spec` measured in this environment, or None."""
    return runner.stored(spec, task=TASK, out_dir=out_dir)


def generate(spec: GenerationSpec, on_record: Callable[[dict[str, Any]], None] | None = None,
             *, reuse: bool = False, pool: WorkerPool | None = None,
             **kwargs: Any) -> RunResult:
    """Run one generation spec (validated first) to the end; ``reuse=True`` returns a stored
    run of the same spec and environment instead (its records still reach `on_record`)."""
    return runner.run(spec, on_record, reuse=reuse, task=TASK, pool=pool, **kwargs)


@dataclass
class GenerationComparison:
    """Several generation runs: their tokens, per-run figures, compilations and outputs."""

    results: list[RunResult] = field(default_factory=list)
    errors: dict[str, WorkbenchError] = field(default_factory=dict)  # label -> error

    @property
    def tokens(self):
        """Every run's ``token`` rows with model, preset, mode and run_id."""
        import pandas as pd

        frames = []
        for r in self.results:
            frame = generation.token_frame(r.records)
            frame.insert(0, "model", r.spec.model)
            frame.insert(1, "preset", r.spec.preset)
            frame.insert(2, "mode", r.spec.mode)
            frame["run_id"] = r.run_id
            frames.append(frame)
        return pd.concat(frames, ignore_index=True) if frames else generation.token_frame([])

    @property
    def summary(self):
        """One row per run: :data:`tpu_workbench.generation.analysis.SUMMARY_COLUMNS`."""
        import pandas as pd

        rows = []
        for r in self.results:
            figures = generation.summarize_run(generation.token_frame(r.records), r.spec.batch)
            rows.append({"model": r.spec.model, "preset": r.spec.preset, "mode": r.spec.mode,
                         "strategy": r.spec.decode, **figures, "run_id": r.run_id})
        return pd.DataFrame(rows, columns=generation.SUMMARY_COLUMNS)

    @property
    def compiles(self):
        """One row per compilation: when (request, token, phase), torch_xla's cause, ours."""
        import pandas as pd

        cols = ["model", "mode", "strategy", "request", "token", "phase", "cause",
                "explanation", "graph_hash", "frame", "run_id"]
        rows = [{"model": r.spec.model, "mode": r.spec.mode, **rec, "run_id": r.run_id}
                for r in self.results for rec in r.records if rec.get("kind") == "compile"]
        return pd.DataFrame(rows).reindex(columns=cols)

    @property
    def outputs(self):
        """The greedy tokens of every run (first prompt of each request) as text, and whether
        they equal plain PyTorch's: a ``torch_eager`` run of the same model, prompts and
        token count (None where the comparison has none)."""
        import pandas as pd

        def key(r: RunResult, i: int) -> tuple:
            s = r.spec
            return (s.model, s.preset, str(s.options), s.prompts, s.new_tokens, s.batch, i)

        runs = [(r, i, toks) for r in self.results
                for i, toks in enumerate(r.summary.get("tokens", []))]
        ref = {key(r, i): toks for r, i, toks in runs if r.spec.mode == "torch_eager"}
        rows = [{"model": r.spec.model, "mode": r.spec.mode, "strategy": r.spec.decode,
                 "request": i, "prompt": generation.text_of(r.summary["prompt_tokens"][i][0]),
                 "output": generation.text_of(toks[0]),
                 "same_as_pytorch": ref[key(r, i)] == toks if key(r, i) in ref else None}
                for r, i, toks in runs]
        return pd.DataFrame(rows, columns=["model", "mode", "strategy", "request", "prompt",
                                           "output", "same_as_pytorch"])


def generate_many(specs: Sequence[GenerationSpec],
                  on_update: Callable[[GenerationComparison, GenerationSpec], None] | None = None,
                  *, reuse: bool = False, fresh: bool = True, pool: WorkerPool | None = None,
                  **kwargs: Any) -> GenerationComparison:
    """Run `specs` in order (all validated first); a failed run goes to ``errors`` and the next
    still runs. ``fresh=True``: a fresh worker per mode (see the module's note), stopped at the
    end; otherwise `pool` (or the default pool) serves them warm."""
    found = [stored(s, kwargs.get("out_dir")) if reuse else None for s in specs]
    for spec, result in zip(specs, found, strict=True):
        if result is None:
            spec.validate()
    pools: dict[str, WorkerPool] = {}
    out = GenerationComparison()
    try:
        for spec, result in zip(specs, found, strict=True):
            if result is None:
                own = pools.setdefault(spec.mode, WorkerPool(max_workers=1)) if fresh else pool
                try:
                    result = generate(spec, pool=own, **kwargs)
                except WorkbenchError as exc:
                    out.errors[f"{spec.model}/{spec.mode}/{spec.decode}"] = exc
            if result is not None:
                out.results.append(result)
            if on_update is not None:
                on_update(out, spec)
    finally:
        for own in pools.values():
            own.shutdown()
    return out


def phase_hlo(result: RunResult, stage: str = "before_optimizations") -> dict[str, str]:
    """The HLO text of a run's first prefill and first decode program (``capture=("hlo",)``
    copies each token's new modules to ``hlo/r<request>_t<token>_<phase>/``): phase -> text
    of the largest module of that folder at `stage`; a phase that compiled nothing is absent."""
    out: dict[str, str] = {}
    for rel, path in sorted(result.artifacts.items(), key=lambda kv: _token_order(kv[0])):
        parts = rel.split("/")
        if len(parts) != 3 or parts[0] != "hlo" or not parts[2].endswith(f"{stage}.txt"):
            continue
        phase = parts[1].rsplit("_", 1)[-1]
        text = Path(path).read_text()
        folder = parts[1]
        if phase not in out or (out[phase + ":folder"] == folder
                                and len(text) > len(out[phase])):
            out[phase], out[phase + ":folder"] = text, folder
    return {k: v for k, v in out.items() if ":" not in k}


def _token_order(rel: str) -> tuple[int, int, str]:
    """Sort key of ``hlo/r<request>_t<token>_<phase>/file``: request, token, then the name."""
    parts = rel.split("/")
    if len(parts) < 3 or not parts[1].startswith("r"):
        return (1 << 30, 0, rel)
    request, token = parts[1][1:].split("_")[:2]
    return (int(request), int(token.lstrip("t") or 0), rel)
