"""Model families: ``mingpt``, ``resnet``, ``unet`` (and ``mlp``, the smallest, for checks).

Each is a :class:`ModelFamily`; :func:`get_model` returns one by name.
"""

from __future__ import annotations

import importlib
import importlib.util
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
}


def model_names() -> list[str]:
    """Names of the model families whose modules are present."""
    return [n for n, (mod, _) in _FAMILIES.items()
            if importlib.util.find_spec(f"{__name__}.{mod}") is not None]


def get_model(name: str) -> ModelFamily:
    """The model family called `name` (raises SpecError naming the valid ones)."""
    if name not in model_names():
        raise SpecError(f"unknown model {name!r}; valid models: {', '.join(model_names())}")
    module_name, cls_name = _FAMILIES[name]
    module = importlib.import_module(f"{__name__}.{module_name}")
    return getattr(module, cls_name)()


def __getattr__(name: str) -> Any:
    # Keep `import tpu_workbench.models` free of torch until a model is needed.
    if name in ("Batch", "ModelFamily"):
        from . import base

        return getattr(base, name)
    raise AttributeError(name)


__all__ = ["Batch", "ModelFamily", "get_model", "model_names"]
