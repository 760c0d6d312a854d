"""Generation runs: one spec (:func:`generate`) or a strategy x mode comparison
(:func:`generate_many`), streamed from workers like training runs, stored and reused the same way.

Counting honestly: a worker's compile cache serves any program it compiled before, so a
comparison gives each mode a fresh worker of its own (``fresh=True``, the default), shared by
that mode's runs only while their programs cannot coincide (:func:`programs_of`): a
static_cache run with a prompt of 8 and a bucketed run with a bucket of 8 and the same cache
length compile the same prefill and decode programs, and the second would count none, so it
gets a fresh worker. The lazy and compile modes trace the same graphs, so they never share one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import WorkbenchError
from ..runs import runner
from ..runs.spec import ExperimentSpec
from ..runs.store import RunResult
from ..runs.workers import WorkerPool
from . import analysis as generation
from .spec import GenerationSpec, with_positions

TASK = "generate"
# Training steps of the weights generation decodes with (:func:`trained_weights`): minGPT tiny
# sorted all of 200 held-out sequences after 150 (greedy, measured here); hf:llama tiny, with
# ten digits, 42% after 300 and 64% after 800, whose tokens still depend on the prompt.
TRAIN_STEPS = 200


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


def training_spec(model: str = "mingpt", preset: str = "tiny", steps: int = TRAIN_STEPS,
                  seed: int = 0) -> ExperimentSpec:
    """The training run whose weights a generation decodes with: `model`/`preset` on its own
    task (minGPT's sorting; the Hugging Face families share it) in plain PyTorch, with its
    checkpoint captured. Plain PyTorch because it runs everywhere and compiles nothing."""
    return ExperimentSpec(model=model, preset=preset, mode="torch_eager", steps=steps, seed=seed,
                          capture=("checkpoint",))


def trained_weights(model: str = "mingpt", preset: str = "tiny", steps: int = TRAIN_STEPS, *,
                    reuse: bool = True, on_record: Callable[[dict[str, Any]], None] | None = None,
                    **kwargs: Any) -> RunResult:
    """A completed training run of :func:`training_spec` (stored in this environment and
    reused, or trained now: minGPT tiny takes seconds); pass its folder as
    ``GenerationSpec(weights=str(result.out_dir))``."""
    return runner.run(training_spec(model, preset, steps), on_record, reuse=reuse, **kwargs)


def stored_weights(model: str = "mingpt", preset: str = "tiny", steps: int = TRAIN_STEPS,
                   out_dir: Path | None = None) -> RunResult | None:
    """The stored run :func:`trained_weights` would reuse, or None (it would train)."""
    return runner.stored(training_spec(model, preset, steps), out_dir=out_dir)


def stored(spec: GenerationSpec, out_dir: Path | None = None) -> RunResult | None:
    """The newest completed run of `spec` measured in this environment, or None."""
    return runner.stored(spec, task=TASK, out_dir=out_dir)


def generate(spec: GenerationSpec, on_record: Callable[[dict[str, Any]], None] | None = None,
             *, reuse: bool = False, pool: WorkerPool | None = None,
             **kwargs: Any) -> RunResult:
    """Run one generation spec (validated first) to the end; ``reuse=True`` returns a stored
    run of the same spec and environment instead (its records still reach `on_record`)."""
    return runner.run(spec, on_record, reuse=reuse, task=TASK, pool=pool, **kwargs)


OUTPUT_COLUMNS = ["model", "mode", "strategy", "weights", "request", "prompt", "output",
                  "expected", "correct", "same_as_pytorch", "reference"]


def measured_on(result: RunResult) -> str:
    """Where a run's times were measured, in words: ``plain PyTorch, CPU, 1 thread``,
    ``XLA:CPU``, a TPU's kind (``TPU v6e``), ``TorchTPU, TPU v6e``."""
    info = result.runtime or {}
    hw = str(info.get("device_hw") or info.get("device") or "?").upper()
    kind = str(info.get("device_kind") or hw)
    if info.get("runtime") == "xla":
        return "XLA:CPU" if hw == "CPU" else kind
    if info.get("runtime") == "torch_tpu":
        return f"TorchTPU, {kind}"
    threads = result.summary.get("threads")
    return f"plain PyTorch, {hw}" + (f", {threads} thread{'s' * (threads != 1)}"
                                     if threads else "")


@dataclass
class GenerationComparison:
    """Several generation runs: their tokens, per-run figures, compilations and outputs."""

    results: list[RunResult] = field(default_factory=list)
    errors: dict[str, WorkbenchError] = field(default_factory=dict)  # label -> error

    @property
    def tokens(self):
        """Every run's ``token`` rows with model, preset, mode, where it was measured
        (:func:`measured_on`) and run_id."""
        import pandas as pd

        frames = []
        for r in self.results:
            frame = generation.token_frame(r.records)
            frame.insert(0, "model", r.spec.model)
            frame.insert(1, "preset", r.spec.preset)
            frame.insert(2, "mode", r.spec.mode)
            frame.insert(3, "measured_on", measured_on(r))
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
                         "measured_on": measured_on(r), "strategy": r.spec.decode, **figures,
                         "run_id": r.run_id})
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
        """The greedy tokens of every run (first prompt of each request) as text; what the
        task says follows the prompt (``expected``, "" where it says nothing) and whether the
        output is that (``correct``, None where there is nothing to check); and whether every
        batch row's tokens equal plain PyTorch's full recompute (``same_as_pytorch``): the
        ``torch_eager`` ``naive`` run of the same model, weights, prompts and token count (the
        whole sequence each token, no cache), or where the comparison has none, the
        ``torch_eager`` run of the same strategy; ``reference`` names which (None: neither)."""
        import pandas as pd

        from .. import models

        def key(r: RunResult, i: int) -> tuple:
            s = r.spec
            return (s.model, s.preset, str(s.options), s.weights, s.seed, s.prompts,
                    s.new_tokens, s.batch, i)

        runs = [(r, i, toks) for r in self.results
                for i, toks in enumerate(r.summary.get("tokens", []))]
        eager = {(key(r, i), r.spec.decode): toks for r, i, toks in runs
                 if r.spec.mode == "torch_eager"}

        def reference(r: RunResult, i: int) -> tuple[str | None, Any]:
            for strategy in ("naive", r.spec.decode):
                if (key(r, i), strategy) in eager:
                    return f"torch_eager {strategy}", eager[(key(r, i), strategy)]
            return None, None

        rows = []
        for r, i, toks in runs:
            family = models.get_model(r.spec.model)
            prompt = r.summary["prompt_tokens"][i][0]
            task_answer = getattr(family, "task_answer", None)  # a user's model may have none
            answer = task_answer(family.config(r.spec.preset, **r.spec.options), prompt) \
                if task_answer else None
            checked = answer[: len(toks[0])] if answer else None
            name, ref = reference(r, i)
            rows.append({
                "model": r.spec.model, "mode": r.spec.mode, "strategy": r.spec.decode,
                "weights": "trained" if r.spec.weights else "random", "request": i,
                "prompt": generation.text_of(prompt), "output": generation.text_of(toks[0]),
                "expected": generation.text_of(checked or []),
                "correct": toks[0][: len(checked)] == checked if checked else None,
                "same_as_pytorch": None if ref is None else ref == toks, "reference": name})
        return pd.DataFrame(rows, columns=OUTPUT_COLUMNS)


def generate_many(specs: Sequence[GenerationSpec],
                  on_update: Callable[[GenerationComparison, GenerationSpec], None] | None = None,
                  *, reuse: bool = False, fresh: bool = True, pool: WorkerPool | None = None,
                  **kwargs: Any) -> GenerationComparison:
    """Run `specs` in order (all validated first); a failed run goes to ``errors`` and the next
    still runs. ``fresh=True``: a fresh worker per mode, and another where a run's programs
    could come from the worker's cache (see the module's note), stopped at the end; otherwise
    `pool` (or the default pool) serves them warm."""
    found = [stored(s, kwargs.get("out_dir")) if reuse else None for s in specs]
    for spec, result in zip(specs, found, strict=True):
        if result is None:
            spec.validate()
    pools: dict[str, WorkerPool] = {}
    compiled: dict[str, set[tuple]] = {}  # mode -> the programs its fresh worker has compiled
    out = GenerationComparison()
    try:
        for spec, result in zip(specs, found, strict=True):
            if result is None:
                own = pool
                if fresh:
                    mine = programs_of(spec) if spec.mode != "torch_eager" else set()
                    if mine & compiled.get(spec.mode, set()):  # its cache would serve them
                        pools.pop(spec.mode).shutdown()
                        compiled.pop(spec.mode)
                    own = pools.setdefault(spec.mode, WorkerPool(max_workers=1))
                    compiled.setdefault(spec.mode, set()).update(mine)
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


def programs_of(spec: GenerationSpec) -> set[tuple]:
    """The programs `spec`'s run compiles on a fresh worker, each keyed by the model, its
    options and the batch size as well as its shapes
    (:func:`~tpu_workbench.generation.analysis.program_shapes`)."""
    model = (spec.model, spec.preset, str(sorted(spec.options.items())), spec.batch)
    return {(*model, *shape) for shape in generation.program_shapes(
        spec.decode, spec.prompts, spec.new_tokens, spec.buckets, spec.cache_len)}


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
