"""What to generate: :class:`GenerationSpec`, an :class:`~tpu_workbench.runs.spec.ExperimentSpec`
with a decode strategy, prompt lengths, new tokens and buckets, validated before any work.

It is an ExperimentSpec (model, preset, mode, batch_size, seed, device, capture...) so the runner
gives it the same worker, fingerprint and results folder; ``steps`` and the training fields are
not used by generation. It travels to the worker as a dict and runs as task ``"generate"``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from ..runs.spec import MODES, ExperimentSpec, _is_int
from . import analysis as generation

# Modes a decode loop runs in, and why the others do not.
GENERATION_MODES = ("torch_eager", "eager", "lazy", "compile", "tpu_compile")
NOT_OFFERED = {
    "inductor": "inductor's cold compile takes 6-32 s on two cores, and naive and dynamic_cache "
                "change shape every token: minutes per run",
    "dynamo": "torch.compile(backend='openxla') guards on every cache tensor's shape and on the "
              "Python position ints, so it re-traces per token before XLA compiles at all; the "
              "lazy and compile modes show XLA's own compilations",
    "tpu_eager": "TorchTPU's eager modes compile op by op; generation is measured under "
                 "tpu_compile",
    "tpu_fused": "TorchTPU's eager modes compile op by op; generation is measured under "
                 "tpu_compile",
}
MAX_BATCH = 64
MAX_NEW_TOKENS = 512


@dataclass(frozen=True)
class GenerationSpec(ExperimentSpec):
    """Greedy generation of `new_tokens` tokens for each prompt length in `prompts`.

    Fields (besides the ExperimentSpec's):
        decode: the decode strategy, one of :data:`tpu_workbench.generation.analysis.STRATEGIES`
            (``naive``, ``dynamic_cache``, ``static_cache``, ``bucketed``); ``strategy`` stays
            the sharding strategy of an ExperimentSpec (unused here).
        prompts: prompt lengths, one request each, served one after another in the run.
        new_tokens: tokens generated per request (the first comes from the prefill).
        buckets: the lengths ``bucketed`` pads prompts to.
        cache_len: positions of the static cache (None: the longest prompt, or the largest
            bucket, plus `new_tokens`).
        batch_size: prompts per request (None: 1).
        weights: the folder of a completed training run that captured ``checkpoint`` (its
            ``model.pt``; :func:`tpu_workbench.generation.runs.trained_weights` makes or
            reuses one): the model decodes with the weights it learned, so equal greedy
            tokens across strategies and modes check the caches. None: random weights from
            `seed`, whose tokens check only that every strategy computes the same function.
        explain_compiles: on by default here: torch_xla's cause for every compilation.
    """

    mode: str = "lazy"
    decode: str = "static_cache"
    prompts: tuple[int, ...] = (5,)
    new_tokens: int = 16
    buckets: tuple[int, ...] = generation.DEFAULT_BUCKETS
    cache_len: int | None = None
    weights: str | None = None
    explain_compiles: bool | None = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("prompts", "buckets"):  # JSON gives lists back; one int means one prompt
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
            elif _is_int(value):
                object.__setattr__(self, name, (value,))

    @property
    def batch(self) -> int:
        return self.batch_size or 1

    @property
    def cache_positions(self) -> int | None:
        """Positions the strategy's cache holds (None: no cache, or one that grows)."""
        return generation.cache_length(self.decode, self.prompts, self.new_tokens,
                                       self.buckets, self.cache_len)

    def replace(self, **changes: Any) -> GenerationSpec:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["prompts"], d["buckets"] = list(self.prompts), list(self.buckets)
        return d

    def validate(self) -> GenerationSpec:
        """Check the generation fields first (cheap, no torch), then the ExperimentSpec's."""
        _check_generation(self)
        super().validate()
        from .. import models

        family = models.get_model(self.model)
        if family.sequence_dim is None or not hasattr(family, "positions"):
            raise SpecError(f"strategy {self.decode!r} needs a sequence model (mingpt, hf:*); "
                            f"model {self.model!r} has fixed-size inputs, nothing to generate")
        cfg = family.config(self.preset, **self.options)
        if self.weights is not None:
            _check_weights(self)
        limit = family.positions(cfg)
        used = positions_used(self)
        if used > limit:
            field = getattr(family, "positions_field", "positions")
            fix = (f" (the weights of {self.weights} were trained with {field}={limit})"
                   if self.weights is not None else
                   f", or set options={{'{field}': {used}}} (generation_spec.with_positions "
                   "does)")
            raise SpecError(
                f"a prompt of {max(self.prompts)} tokens and {self.new_tokens} new tokens feed "
                f"the model {used} positions (the last new token is not fed back) but "
                f"{self.model}/{self.preset} covers {field}={limit}; generate at most "
                f"{limit - max(self.prompts) + 1} tokens{fix}")
        return self


def positions_used(spec: GenerationSpec) -> int:
    """Positions the model is fed: the longest prompt and every new token but the last (which
    is never fed back), or the largest bucket a prompt is padded to."""
    used = max(spec.prompts) + spec.new_tokens - 1
    if spec.decode == "bucketed":
        used = max(used, max(generation.bucket_for(p, spec.buckets) for p in spec.prompts))
    return used


def _check_weights(spec: GenerationSpec) -> None:
    """`spec.weights` is a completed training run of this very model: its folder has
    ``model.pt`` and a spec of the same model, preset and options."""
    import json
    from pathlib import Path

    folder = Path(spec.weights) if isinstance(spec.weights, str) else None
    if folder is None or not (folder / "model.pt").is_file() \
            or not (folder / "spec.json").is_file():
        raise SpecError(f"weights={spec.weights!r} is not the folder of a training run with a "
                        "checkpoint (model.pt and spec.json); train one with "
                        "capture=('checkpoint',) (generation.runs.trained_weights does) or "
                        "pass weights=None for random weights")
    trained = json.loads((folder / "spec.json").read_text())
    ours = {"model": spec.model, "preset": spec.preset, "options": dict(spec.options)}
    theirs = {k: trained.get(k) for k in ours}
    if theirs != ours:
        raise SpecError(f"weights {folder.name} were trained for {theirs} but this generation "
                        f"asks for {ours}; generate with the run's model, preset and options")


def _check_generation(spec: GenerationSpec) -> None:
    from .analysis import STRATEGIES, bucket_for

    if not isinstance(spec.decode, str) or spec.decode not in STRATEGIES:
        raise SpecError(f"unknown decode strategy {spec.decode!r}; valid: {', '.join(STRATEGIES)}")
    if isinstance(spec.mode, str) and spec.mode in MODES and spec.mode not in GENERATION_MODES:
        raise SpecError(f"mode {spec.mode!r} is not offered for generation "
                        f"({NOT_OFFERED.get(spec.mode, '')}); valid: "
                        f"{', '.join(GENERATION_MODES)}")
    for name in ("prompts", "buckets"):
        value = getattr(spec, name)
        if (not isinstance(value, tuple) or not value
                or any(not _is_int(n) or n <= 0 for n in value)):
            raise SpecError(f"{name} must be a non-empty tuple of positive ints like (5, 9), "
                            f"got {value!r}")
    if not _is_int(spec.new_tokens) or not 0 < spec.new_tokens <= MAX_NEW_TOKENS:
        raise SpecError(f"new_tokens must be an int from 1 to {MAX_NEW_TOKENS}, got "
                        f"{spec.new_tokens!r}")
    if spec.batch_size is not None and (not _is_int(spec.batch_size)
                                        or not 0 < spec.batch_size <= MAX_BATCH):
        raise SpecError(f"batch_size must be None or an int from 1 to {MAX_BATCH}, got "
                        f"{spec.batch_size!r}")
    if spec.decode == "bucketed":
        for p in spec.prompts:
            try:
                bucket_for(p, spec.buckets)
            except ValueError as exc:
                raise SpecError(f"strategy 'bucketed': {exc}; add a bucket of at least {p}") \
                    from None
    if spec.cache_len is not None:
        if not _is_int(spec.cache_len) or spec.cache_len <= 0:
            raise SpecError(f"cache_len must be None or a positive int, got {spec.cache_len!r}")
        if spec.decode not in generation.STATIC_STRATEGIES:
            raise SpecError(f"cache_len={spec.cache_len} sets a static cache's length; strategy "
                            f"{spec.decode!r} has none (use static_cache or bucketed)")
        longest = max(spec.prompts)
        if spec.decode == "bucketed":
            longest = max(bucket_for(p, spec.buckets) for p in spec.prompts)
        need = max(max(spec.prompts) + spec.new_tokens, longest)
        if need > spec.cache_len:
            raise SpecError(f"new_tokens={spec.new_tokens} after a prompt of "
                            f"{max(spec.prompts)} needs {need} cache positions but "
                            f"cache_len={spec.cache_len}; raise cache_len to {need} or generate "
                            f"at most {spec.cache_len - max(spec.prompts)} tokens")


def with_positions(spec: GenerationSpec) -> GenerationSpec:
    """`spec` with the model's position option raised to what the run needs, if it is short
    (minGPT tiny's block_size is 11, the sorting task's length): one option, named in the spec
    and its results. A spec with trained `weights` is returned as it is (their position table
    is what it is)."""
    from .. import models

    family = models.get_model(spec.model)
    field = getattr(family, "positions_field", None)
    if field is None or not hasattr(family, "positions") or spec.weights is not None:
        return spec  # trained weights fix the position table: validate() says if it is short
    cfg = family.config(spec.preset, **spec.options)
    # The same for every strategy (the largest bucket counts even where unused): a different
    # position table would be another random model, and the strategies' tokens must agree.
    need = max(max(spec.prompts) + spec.new_tokens - 1, max(spec.buckets))
    if family.positions(cfg) >= need:
        return spec
    return spec.replace(options={**spec.options, field: need})


def generation_models() -> list[str]:
    """The workbench's model families that can generate (sequence models with a position
    limit): minGPT and the Hugging Face causal LMs."""
    from .. import models

    return [m for m in models.model_names()
            if hasattr(models.get_model(m), "positions")]


def generation_modes() -> list[str]:
    """The modes that run here and are offered for generation (:data:`GENERATION_MODES`)."""
    from ..runs.spec import available_modes

    return [m for m in available_modes() if m in GENERATION_MODES]
