"""Model families: ``mingpt``, ``resnet``, ``unet``, ``dlrm`` (and ``mlp``, the smallest, for
checks), the Hugging Face causal LMs ``hf:gpt2``, ``hf:llama``, ``hf:mixtral``, ``hf:qwen2``,
``hf:gemma2`` (where ``transformers`` is installed), and a user's own module
(``"path/to/file.py:make"``).

Each is a :class:`ModelFamily`; :func:`get_model` returns one by name.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
from typing import TYPE_CHECKING, Any

from ..errors import SpecError

if TYPE_CHECKING:
    from .base import ModelFamily

# name -> (module, class); modules are imported on first use.
_FAMILIES = {
    "mlp": ("mlp", "MLPFamily"),
    "mingpt": ("mingpt", "MinGPTFamily"),
    "resnet": ("resnet", "ResNetFamily"),
    "unet": ("unet", "UNetFamily"),
    "dlrm": ("dlrm", "DLRMFamily"),
}
# Transformers model_type families (models/hf.py), listed only where transformers is installed.
_HF_FAMILIES = {
    "hf:gpt2": ("hf", "GPT2Family"),
    "hf:llama": ("hf", "LlamaFamily"),
    "hf:mixtral": ("mixtral", "MixtralFamily"),
    "hf:qwen2": ("hf", "Qwen2Family"),
    "hf:gemma2": ("hf", "Gemma2Family"),
}


def _families() -> dict[str, tuple[str, str]]:
    """name -> (module, class) of every family whose module (and library) is present."""
    out = {n: v for n, v in _FAMILIES.items()
           if importlib.util.find_spec(f"{__name__}.{v[0]}") is not None}
    if importlib.util.find_spec("transformers") is not None:  # finds it, imports nothing
        out.update(_HF_FAMILIES)
    return out


def model_names() -> list[str]:
    """Names of the model families whose modules are present."""
    return list(_families())


def get_model(name: str) -> ModelFamily:
    """The model family called `name` (raises SpecError naming the valid ones).

    A name with a ``:`` that is not ``hf:...`` is a user's own module, ``"path/to/file.py:make"``
    or ``"package.module:make"`` (:mod:`.user`)."""
    if isinstance(name, str) and ":" in name and not name.startswith("hf:"):
        from .user import load_family

        return load_family(name)
    families = _families()
    if name not in families:
        raise SpecError(f"unknown model {name!r}; valid models: {', '.join(families)}")
    module_name, cls_name = families[name]
    module = importlib.import_module(f"{__name__}.{module_name}")
    return getattr(module, cls_name)()


def batch_items(name: str, preset: str) -> tuple[int, int]:
    """(sequences or examples, items) of one default batch of a family's preset: minGPT tiny's
    32 sequences hold 352 tokens."""
    family = get_model(name)
    cfg = family.config(preset)
    batch = family.default_batch_size(cfg)
    return batch, family.items_per_batch(cfg, batch)


def count_params(name: str, preset: str, options: dict[str, Any] | None = None) -> int:
    """Parameters of a family's preset (with `options`), each tied weight once: the model is
    built on PyTorch's 'meta' device (shapes only: Llama-3-8B in a second) and remembered."""
    return _count_params(name, preset, json.dumps(options or {}, sort_keys=True))


@functools.lru_cache(maxsize=64)
def _count_params(name: str, preset: str, options: str) -> int:
    import torch

    from .base import n_params

    family = get_model(name)
    with torch.device("meta"):
        return n_params(family.build(family.config(preset, **json.loads(options))))


def preset_table(name: str):
    """Every preset of a model family: parameters, default batch, analytic FLOPs per step.

    Models are built on PyTorch's 'meta' device (shapes only), so even GPT-2 size is instant.
    """
    import pandas as pd

    family = get_model(name)
    rows = []
    for preset in family.presets:
        cfg = family.config(preset)
        batch = family.default_batch_size(cfg)
        rows.append({"preset": preset, "params": count_params(name, preset), "batch_size": batch,
                     "items_per_step": family.items_per_batch(cfg, batch),
                     "item_unit": family.item_unit,
                     "gflops_per_step": family.flops_per_step(cfg, batch) / 1e9,
                     **_config_columns(family, cfg)})
    return pd.DataFrame(rows)


def _config_columns(family: ModelFamily, cfg: Any) -> dict[str, Any]:
    """A config as table columns: the family's own `describe` (the HF families: task and
    Transformers fields, flat), else the dataclass fields but the batch size."""
    describe = getattr(family, "describe", None)
    if describe is not None:
        return describe(cfg)
    return {k: v for k, v in vars(cfg).items() if k != "batch_size"}


def load_trained(result: Any) -> tuple[ModelFamily, Any, Any]:
    """(family, config, model) of a finished run that captured a ``checkpoint``, on the CPU."""
    import torch

    path = result.out_dir / "model.pt"
    if not path.exists():
        raise SpecError(f"run {result.run_id} has no checkpoint; run it with "
                        "capture=('checkpoint',)")
    family = get_model(result.spec.model)
    cfg = family.config(result.spec.preset, **result.spec.options)
    model = family.build(cfg)
    model.load_state_dict(torch.load(path, map_location="cpu"))
    return family, cfg, model.eval()


def __getattr__(name: str) -> Any:
    # Keep `import tpu_workbench.models` free of torch until a model is needed.
    if name in ("Batch", "EmbeddingTables", "ModelFamily", "TransformerShape", "n_params"):
        from . import base

        return getattr(base, name)
    raise AttributeError(name)


__all__ = ["Batch", "EmbeddingTables", "ModelFamily", "TransformerShape", "count_params",
           "get_model", "load_trained", "model_names", "n_params", "preset_table"]
