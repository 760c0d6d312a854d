"""Stand-ins for what tpu-inference imports but its compiled JAX step never runs.

Loaded by :mod:`engine_main` in ``.venv-serve`` (Python 3.12), never by the workbench itself:
stdlib only. tpu-inference (vLLM's TPU backend) imports ``vllm``, ``torch`` and ``torchax`` at
module level in the modules its JAX Llama and Qwen3 models load, though no code of theirs runs
in the jitted model step; ``requests`` asks GCE's metadata server for the TPU's name; and
``qwen3.py`` imports a type from ``tpu_inference.layers.vllm`` (the torch side). Installing
those would bring vllm's and torch's whole stacks into a compile-only environment.

Every stand-in is listed in :data:`STUBS`, module by module. A stub module holds those names
only (any other raises AttributeError at import, naming it) and records which were read, so
:func:`unused` tells when a new tpu-inference release stops importing one: the guard test
(``tests/test_serving_stubs.py``) fails both ways. A stand-in that is called raises, unless it
is one of the few the model's construction really calls (a logger, the pipeline split, the
rope default), which are written out below with the rule they copy.
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable
from typing import Any

TPU_INFERENCE_VERSION = "0.32.0"  # the release these stand-ins were checked against


class StubError(RuntimeError):
    """A stand-in was used as if it were the real thing."""


def _absent(qualname: str) -> type:
    """A class standing in for `qualname`: fine as a base class or an annotation; an
    instance of it raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise StubError(f"{qualname} is a stand-in (tpu_workbench.serving.engine_stubs): "
                        "the offline compile does not run it")

    return type(qualname.rsplit(".", 1)[-1], (), {"__init__": __init__,
                                                   "__module__": qualname.rsplit(".", 1)[0]})


def _raises(qualname: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise StubError(f"{qualname} is a stand-in (tpu_workbench.serving.engine_stubs): "
                        "the offline compile does not run it")

    call.__qualname__ = call.__name__ = qualname.rsplit(".", 1)[-1]
    return call


# --- the few that run while the model is built -------------------------------------------

def _init_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)


def _get_pp_indices(num_hidden_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    # vllm.distributed.utils.get_pp_indices with one pipeline stage: every layer on it.
    if pp_size != 1:
        raise StubError(f"pipeline parallel size {pp_size}: the offline compile plans one stage")
    return 0, num_hidden_layers


def _set_default_rope_theta(config: Any, default_theta: float) -> None:
    # vllm.transformers_utils.config.set_default_rope_theta: a config without a rope theta
    # takes the model family's default.
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):
        params.setdefault("rope_theta", getattr(config, "rope_theta", None) or default_theta)
    elif getattr(config, "rope_theta", None) is None:
        config.rope_theta = default_theta


def _register_model_loader(name: str) -> Callable[[type], type]:
    return lambda cls: cls


class _dtype:  # torch.dtype: utils.py keys a dict on torch's dtypes and isinstance-checks it
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name} (stand-in)"


class _RequestException(OSError):
    pass


def _no_network(*args: Any, **kwargs: Any) -> Any:
    raise _RequestException("the offline compile reaches no network (requests is a stand-in)")


_nn = types.SimpleNamespace(Module=_absent("torch.nn.Module"))

# module -> {name: stand-in}. Parents of a listed module are made as empty packages.
STUBS: dict[str, dict[str, Any]] = {
    "requests": {"get": _no_network, "RequestException": _RequestException},
    "torch": {"Tensor": _absent("torch.Tensor"), "dtype": _dtype, "nn": _nn,
              **{n: _dtype(n) for n in ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz",
                                        "float8_e5m2", "float8_e5m2fnuz", "uint8", "uint16",
                                        "uint32")}},
    "torchax.interop": {n: _raises(f"torchax.interop.{n}") for n in ("jax_view",
                                                                     "torch_view")},
    "torchax.ops.mappings": {n: _raises(f"torchax.ops.mappings.{n}")
                             for n in ("j2t_dtype", "t2j", "t2j_dtype")},
    "vllm": {},
    "vllm.envs": {},  # imported as a module; what it is asked for runs off the compiled path
    "vllm.config": {n: _absent(f"vllm.config.{n}") for n in ("ModelConfig", "VllmConfig")}
    | {"get_current_vllm_config": _raises("vllm.config.get_current_vllm_config")},
    "vllm.distributed.utils": {"get_pp_indices": _get_pp_indices},
    "vllm.logger": {"_VllmLogger": logging.Logger, "init_logger": _init_logger},
    "vllm.model_executor.model_loader": {"register_model_loader": _register_model_loader},
    "vllm.model_executor.model_loader.dummy_loader": {
        "DummyModelLoader": _absent("vllm.model_executor.model_loader.DummyModelLoader")},
    "vllm.model_executor.models.utils": {
        n: _absent(f"vllm.model_executor.models.utils.{n}")
        for n in ("AutoWeightsLoader", "WeightsMapper")},
    "vllm.lora.request": {"LoRARequest": _absent("vllm.lora.request.LoRARequest")},
    "vllm.pooling_params": {"PoolingParams": _absent("vllm.pooling_params.PoolingParams")},
    "vllm.ray.lazy_utils": {"is_in_ray_actor": lambda: False},
    "vllm.sampling_params": {n: _absent(f"vllm.sampling_params.{n}")
                             for n in ("SamplingParams", "SamplingType")},
    "vllm.sequence": {"IntermediateTensors": _absent("vllm.sequence.IntermediateTensors")},
    "vllm.transformers_utils.config": {"set_default_rope_theta": _set_default_rope_theta},
    "vllm.utils.collection_utils": {
        "swap_dict_values": _raises("vllm.utils.collection_utils.swap_dict_values")},
    "vllm.utils.math_utils": {"cdiv": lambda a, b: -(-a // b)},
    "vllm.utils.network_utils": {"get_ip": lambda: "127.0.0.1"},
    "vllm.v1.attention.backends.registry": {
        "AttentionBackendEnum": _absent("vllm.v1.attention.backends.registry."
                                        "AttentionBackendEnum")},
    "vllm.v1.core.sched.output": {n: _absent(f"vllm.v1.core.sched.output.{n}")
                                  for n in ("NewRequestData", "SchedulerOutput")},
    "vllm.v1.pool.metadata": {n: _absent(f"vllm.v1.pool.metadata.{n}")
                              for n in ("PoolingMetadata", "PoolingStates")},
    # qwen3.py imports this type from tpu-inference's torch side (its package imports vllm's
    # layers); the JAX model only passes the config object through.
    "tpu_inference.layers.vllm.quantization.configs": {
        "VllmQuantConfig": _absent("tpu_inference.layers.vllm.quantization.configs."
                                   "VllmQuantConfig")},
}


class StubModule(types.ModuleType):
    """A module of stand-ins that records which of its names were read."""

    def __init__(self, name: str, names: dict[str, Any]) -> None:
        super().__init__(name, "stand-in (tpu_workbench.serving.engine_stubs)")
        self.__path__: list[str] = []  # a package: submodules import beneath it
        self.__dict__.update(names)
        self.__dict__["_stub_names"] = frozenset(names)
        self.__dict__["_stub_read"] = set()

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith(("__", "_stub_")):
            stub_names = types.ModuleType.__getattribute__(self, "_stub_names")
            if name in stub_names:
                types.ModuleType.__getattribute__(self, "_stub_read").add(name)
        return types.ModuleType.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:  # only for names it does not hold
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"{self.__name__}.{name} is imported by tpu-inference but has no stand-in in "
            "tpu_workbench.serving.engine_stubs.STUBS (a new tpu-inference release?)")


def install() -> None:
    """Put every stub module (and its parents) into ``sys.modules``; idempotent."""
    for name, names in STUBS.items():
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            sub = ".".join(parts[:i])
            if i == len(parts):
                module = sys.modules.get(sub)
                if not isinstance(module, StubModule):
                    sys.modules[sub] = StubModule(sub, names)
            elif sub.startswith("tpu_inference.layers.vllm") or not sub.startswith(
                    "tpu_inference"):
                sys.modules.setdefault(sub, StubModule(sub, STUBS.get(sub, {})))
        for i in range(len(parts) - 1, 0, -1):  # parent.child attributes, for `import a.b`
            parent, child = sys.modules.get(".".join(parts[:i])), parts[i]
            if isinstance(parent, StubModule):
                parent.__dict__[child] = sys.modules[".".join(parts[:i + 1])]


# Safety nets, not stand-ins for an import: the engine sets TPU_ACCELERATOR_TYPE, TPU_NAME and
# TPU_WORKER_ID so tpu_info never asks the metadata server; were it to, it gets an error.
SAFETY_NETS = ("requests",)


def unused() -> dict[str, list[str]]:
    """Stand-ins nobody read since :func:`install`: per module, the names (empty: all read)."""
    out = {}
    for name in STUBS:
        if name in SAFETY_NETS:
            continue
        module = sys.modules.get(name)
        if isinstance(module, StubModule):
            left = sorted(module.__dict__["_stub_names"] - module.__dict__["_stub_read"])
            if left:
                out[name] = left
    return out
