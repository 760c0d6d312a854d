"""Compile vLLM-TPU's own model step (tpu-inference's JAX Llama / Qwen3) for a named TPU slice.

Run as a script by :mod:`tpu_workbench.serving.compile`, in a process of its own under
``.venv-serve``'s interpreter (Python 3.12: tpu-inference, jax, jaxlib, libtpu, flax; no torch,
no vllm, no workbench imports; :mod:`engine_stubs` stands in for what tpu-inference imports
and never runs):

    .venv-serve/bin/python engine_main.py REQUEST.json
    .venv-serve/bin/python engine_main.py --check-stubs     # the stand-ins' guard

The model is tpu-inference's own class, built as its model loader builds it (``nnx.eval_shape``
under the mesh: abstract weights, nothing allocated) on the mesh its runner makes
(``make_optimized_mesh((1, tp), ("data", "model"))``) over the compile-only client's devices
of the slice. The step is the function ``get_flax_model`` jits (``nnx.merge`` of the state
leaves and the graph, the model's ``__call__``) with the same ``out_shardings``,
``donate_argnums`` and ``compiler_options``; its inputs are shaped as the runner's
``_precompile_backbone_helper`` shapes them, at the runner's own token and request buckets.
The attention inside is the ragged paged attention v3 Pallas kernel, compiled by libtpu.

REQUEST: ``architecture``, ``hf_config`` (config fields), ``topology``, ``host_bounds``,
``tp``, ``dtype``, ``kv_cache_dtype``, ``max_model_len``, ``max_num_seqs``,
``max_num_batched_tokens``, ``num_blocks`` (KV pages), ``programs`` (``[{"name", "kind":
"step"|"logits", "num_tokens"|"num_reqs", "out"}]``), ``out``. Writes ``engine.json`` to
``out`` (versions, buckets, block size, KV cache shape and bytes, weights per chip) and, per
program, ``compiled.json`` + ``tpu_hlo.txt`` + ``dump/`` as ``libtpu_main.py`` does, or
``error.txt``. Exit 0 when every program compiled, 3 when one was refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
# What tpu-inference's runner and platform do that this script mirrors rather than calls
# (their modules import vllm's torch side): the guard checks each is unchanged.
MIRRORED = {
    "tpu_inference/models/common/model_loader.py": ("get_flax_model",),
    "tpu_inference/layers/vllm/backends/flash_attn.py": ("get_page_size", "get_min_page_size"),
    "tpu_inference/runner/compilation_manager.py": ("_precompile_backbone_helper",),
}
# Their digests (:func:`mirrored_digests`) in tpu-inference 0.32.0.
MIRRORED_DIGESTS = {
    "tpu_inference/models/common/model_loader.py:get_flax_model": "173a3d7aef5e83da",
    "tpu_inference/layers/vllm/backends/flash_attn.py:get_min_page_size": "e41f7e26bf848df8",
    "tpu_inference/layers/vllm/backends/flash_attn.py:get_page_size": "e2b5eb41e52cc643",
    "tpu_inference/runner/compilation_manager.py:_precompile_backbone_helper":
        "300b5cbd2a5f68a0",
}


def quiet_environment() -> None:
    """What the engine reads at import, set so nothing asks a metadata server or a chip."""
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-8")
    os.environ.setdefault("TPU_NAME", "offline-compile")
    os.environ.setdefault("TPU_WORKER_ID", "0")
    os.environ["JAX_PLATFORMS"] = "cpu"  # the default backend; the TPU is compile-only
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def import_engine() -> dict:
    """Import tpu-inference's models with the stand-ins installed; its modules by name."""
    quiet_environment()
    # transformers asks importlib whether torch exists: ask before a stand-in is there.
    from transformers import LlamaConfig, Qwen3Config

    sys.path.insert(0, str(HERE))
    import engine_stubs

    engine_stubs.install()
    import tpu_inference.models.jax.llama3 as llama3
    import tpu_inference.models.jax.qwen3 as qwen3
    from tpu_inference import utils
    from tpu_inference.distributed import jax_parallel_state
    from tpu_inference.layers.common.attention_metadata import AttentionMetadata
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.models.common.compiler_options import get_step_fn_compiler_options
    from tpu_inference.runner import kv_cache
    from tpu_inference.runner import utils as runner_utils

    return {"LlamaForCausalLM": (llama3.LlamaForCausalLM, LlamaConfig),
            "Qwen3ForCausalLM": (qwen3.Qwen3ForCausalLM, Qwen3Config),
            "utils": utils, "parallel_state": jax_parallel_state,
            "AttentionMetadata": AttentionMetadata,
            "ShardingAxisName": ShardingAxisName, "kv_cache": kv_cache,
            "runner_utils": runner_utils, "compiler_options": get_step_fn_compiler_options,
            "stubs": engine_stubs}


def page_size(max_model_len: int, max_num_seqs: int) -> int:
    """The KV page (block) size vLLM-TPU picks when none is given: PallasAttentionBackend's
    ``get_page_size`` (max-model-len in 16 pages, 16..256; 16 above 8192 tokens), raised to
    ``get_min_page_size`` (the SMEM bound on pages per request) as TPUPlatform does."""
    size = 16 if max_model_len > 8192 else min(
        max(next_power_of_2(max_model_len) // 16, 16), 256)
    pages_per_req = 1024 * 1024 // 2 // max_num_seqs // 4
    least = -(-max_model_len // pages_per_req)
    least = 1 << (least - 1).bit_length()
    return max(size, least)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def mirrored_digests(root: Path) -> dict[str, str]:
    """sha256 of each mirrored function's source in the installed tpu-inference."""
    import ast

    out = {}
    for rel, names in MIRRORED.items():
        tree = ast.parse((root / rel).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in names:
                out[f"{rel}:{node.name}"] = hashlib.sha256(
                    ast.dump(node).encode()).hexdigest()[:16]
    return out


def check_stubs() -> int:
    """Import the engine, build and trace a two-layer model's step, then print what the guard
    needs: the stand-ins nobody read, the installed version, the mirrored sources' digests."""
    engine = import_engine()
    import tpu_inference

    root = Path(tpu_inference.__file__).resolve().parents[1]
    report = {"tpu_inference": metadata.version("tpu-inference"),
              "pinned": engine["stubs"].TPU_INFERENCE_VERSION,
              "mirrored": mirrored_digests(root)}
    # Trace (never compile) a small step of each model: what construction and tracing read.
    for arch in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
        request = {"architecture": arch, "hf_config": SMALL_CONFIG, "topology": "v6e:1x1",
                   "host_bounds": [1, 1, 1], "tp": 1, "dtype": "bfloat16",
                   "kv_cache_dtype": "auto", "max_model_len": 256, "max_num_seqs": 8,
                   "max_num_batched_tokens": 64, "num_blocks": 32}
        built = build(engine, request)
        step_program(engine, built, 16).trace(*built["args"](16))
    report["unused"] = engine["stubs"].unused()
    print(json.dumps(report))
    return 0


SMALL_CONFIG = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
                "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
                "vocab_size": 1024, "max_position_embeddings": 1024, "tie_word_embeddings": False}


class _Namespace:
    def __init__(self, **kwargs) -> None:
        self.__dict__.update(kwargs)


def build(engine: dict, request: dict) -> dict:
    """The abstract model on the slice's mesh, and the shapes of everything the step takes."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.experimental import topologies
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    model_class, config_class = engine[request["architecture"]]
    axis = engine["ShardingAxisName"]
    utils = engine["utils"]
    kwargs = {"chips_per_host_bounds": request["host_bounds"]} if request.get("host_bounds") \
        else {}
    devices = topologies.get_topology_desc(topology_name=request["topology"], platform="tpu",
                                           **kwargs).devices
    # tpu-inference and Pallas read the chip from jax.devices() and the default device: here
    # those are the CPU's (the TPU is compile-only), so point both at the slice's.
    jax.devices = lambda backend=None: list(devices)
    jax.config.update("jax_default_device", devices[0])
    tp = int(request["tp"])
    mesh = utils.make_optimized_mesh((1, tp), ("data", "model"), devices=devices[:tp])
    hf_config = config_class(**request["hf_config"])
    hf_config.architectures = [request["architecture"]]
    dtype = jnp.dtype(request["dtype"])
    kv_dtype_name = request["kv_cache_dtype"]
    model_config = _Namespace(hf_config=hf_config, dtype=dtype, model=request["architecture"],
                              max_model_len=request["max_model_len"],
                              get_vocab_size=lambda: hf_config.vocab_size,
                              get_hidden_size=lambda: hf_config.hidden_size,
                              use_mla=False, runner_type="generate")
    vllm_config = _Namespace(model_config=model_config, quant_config=None,
                             cache_config=_Namespace(cache_dtype=kv_dtype_name),
                             speculative_config=None, lora_config=None,
                             parallel_config=_Namespace(tensor_parallel_size=tp,
                                                        pipeline_parallel_size=1,
                                                        data_parallel_size=1),
                             load_config=_Namespace(load_format="dummy"))
    # One pipeline stage, as TPUWorker sets it up without pipeline parallelism (no server).
    engine["parallel_state"].init_pp_distributed_environment(
        "127.0.0.1", rank=0, world_size=1, device=None, need_pp=False)
    with jax.set_mesh(mesh):
        model = nnx.eval_shape(lambda: model_class(vllm_config, jax.random.key(0), mesh),
                               graph_updates=False)
    graphdef, state = nnx.split(model)
    specs = nnx.get_partition_spec(state)
    leaves = jax.tree_util.tree_leaves(state)
    spec_leaves = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, P))
    state_args = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s))
                       for x, s in zip(leaves, spec_leaves, strict=True))
    state_treedef = jax.tree_util.tree_structure(state)
    weight_bytes = sum(_shard_bytes(a) for a in state_args)

    # The KV cache, as the runner allocates it (runner/kv_cache.create_kv_caches).
    head_dim = utils.get_padded_head_dim(getattr(hf_config, "head_dim", None)
                                         or hf_config.hidden_size
                                         // hf_config.num_attention_heads)
    kv_heads = utils.get_padded_num_heads(hf_config.num_key_value_heads, tp)
    block = page_size(request["max_model_len"], request["max_num_seqs"])
    kv_jax_dtype = dtype if kv_dtype_name == "auto" else utils.to_jax_dtype(kv_dtype_name)
    kv_shape = engine["kv_cache"].get_kv_cache_shape_with_mesh(
        mesh, int(request["num_blocks"]), block, kv_heads, head_dim, kv_jax_dtype)
    kv_sharding = NamedSharding(mesh, P(axis.BATCH, axis.KV_CONTEXT, axis.KV_HEAD))
    layers = hf_config.num_hidden_layers
    kv_caches = [jax.ShapeDtypeStruct(kv_shape, kv_jax_dtype, sharding=kv_sharding)
                 for _ in range(layers)]
    page_bytes = engine["kv_cache"].get_attention_page_size_bytes(
        mesh, block, kv_heads, head_dim, kv_jax_dtype, False)
    max_reqs = int(request["max_num_seqs"])
    blocks_per_req = -(-int(request["max_model_len"]) // block)

    batch = NamedSharding(mesh, P(axis.BATCH))
    data = NamedSharding(mesh, P(axis.ATTN_DATA))

    def i32(shape, sharding):
        return jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding)

    def args(num_tokens: int) -> tuple:
        positions = i32((num_tokens,), data)
        metadata = engine["AttentionMetadata"](
            input_positions=positions, block_tables=i32((max_reqs * blocks_per_req,), batch),
            seq_lens=i32((max_reqs,), batch), query_start_loc=i32((max_reqs + 1,), batch),
            request_distribution=i32((3,), batch), mamba_state_indices=None,
            padded_num_reqs=max_reqs, pcp=None)
        layer_index = tuple((f"model.layers.{i}.self_attn", i) for i in range(layers))
        return (state_args, kv_caches, i32((num_tokens,), batch), metadata, None, positions,
                layer_index, None, None, True, True)

    runner_utils = engine["runner_utils"]
    token_buckets = runner_utils.build_token_paddings(
        min_token_size=max(16, next_power_of_2(1)), max_token_size=int(
            request["max_num_batched_tokens"]), padding_gap=0)
    attn_reqs = runner_utils.get_attn_req_paddings(min_req_size=8, max_req_size=max_reqs)
    return {"mesh": mesh, "devices": devices, "graphdef": graphdef, "treedef": state_treedef,
            "state_args": state_args, "args": args, "model_config": model_config,
            "engine_info": {
                "weight_bytes_per_chip": weight_bytes, "block_size": block,
                "kv_cache_shape": list(kv_shape), "kv_cache_dtype": str(kv_jax_dtype),
                "kv_page_bytes_per_layer": page_bytes // tp,  # one chip's share of a page
                "kv_bytes_per_chip": layers * _shard_bytes(kv_caches[0]),
                "layers": layers, "head_dim": head_dim, "kv_heads": kv_heads,
                "num_blocks": int(request["num_blocks"]), "blocks_per_req": blocks_per_req,
                "token_buckets": token_buckets, "attn_reqs_buckets": attn_reqs,
                "mesh": {k: int(v) for k, v in mesh.shape.items()},
                "device_kind": devices[0].device_kind}}


def _shard_bytes(a) -> int:
    import numpy as np

    shard = a.sharding.shard_shape(a.shape)
    return int(np.prod(shard)) * a.dtype.itemsize


def step_program(engine: dict, built: dict, num_tokens: int):
    """tpu-inference's jitted model step (models/common/model_loader.get_flax_model)."""
    import jax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    graphdef, treedef = built["graphdef"], built["treedef"]
    hidden = NamedSharding(built["mesh"], P(engine["ShardingAxisName"].ATTN_DATA, None))

    def run_model_impl(state_leaves, *args):
        model = nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, state_leaves))
        return model(*args)

    kv_shardings = [c.sharding for c in built["args"](num_tokens)[1]]
    return jax.jit(run_model_impl, out_shardings=(kv_shardings, hidden, hidden, None),
                   donate_argnums=1, static_argnums=(6, 9, 10),
                   compiler_options=engine["compiler_options"]())


def logits_program(engine: dict, built: dict):
    """tpu-inference's jitted ``compute_logits`` (the LM head over the vocabulary)."""
    import jax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    graphdef, treedef = built["graphdef"], built["treedef"]
    axis = engine["ShardingAxisName"]
    out = NamedSharding(built["mesh"], P(axis.MLP_DATA, axis.MLP_TENSOR))

    @jax.jit(out_shardings=out)
    def run_compute_logits(state_leaves, hidden_state):
        model = nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, state_leaves))
        return model.compute_logits(hidden_state)

    return run_compute_logits


def compile_one(engine: dict, built: dict, program: dict, versions: dict) -> int:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    out = Path(program["out"])
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if program["kind"] == "step":
        fn, args = step_program(engine, built, program["num_tokens"]), built["args"](
            program["num_tokens"])
    else:
        hidden = jax.ShapeDtypeStruct(
            (program["num_reqs"], built["model_config"].hf_config.hidden_size), jnp.bfloat16,
            sharding=NamedSharding(built["mesh"], P(engine["ShardingAxisName"].ATTN_DATA,
                                                    None)))
        fn, args = logits_program(engine, built), (built["state_args"], hidden)
    with jax.set_mesh(built["mesh"]):
        lowered = fn.trace(*args).lower()
    lowered_s = time.perf_counter() - started
    try:
        exe = lowered.compile({"xla_dump_to": str(out / "dump"), "xla_dump_hlo_as_text": True})
    except Exception as exc:  # noqa: BLE001 - libtpu raises XlaRuntimeError and others
        (out / "error.txt").write_text(f"{type(exc).__name__}: {exc}")
        shutil.rmtree(out / "dump", ignore_errors=True)
        return 3
    compile_s = time.perf_counter() - started - lowered_s
    stats = exe.memory_analysis()
    memory = {k: int(getattr(stats, k)) for k in dir(stats)
              if k.endswith("_in_bytes") and not k.startswith("_")}
    cost = exe.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    dumped = max((out / "dump").glob("*after_optimizations.txt"), key=lambda p: p.stat().st_size)
    prefix = dumped.name.removesuffix("after_optimizations.txt")
    dumped.replace(out / "tpu_hlo.txt")
    for path in (out / "dump").iterdir():  # keep the program's memory report only
        if path.is_dir() or not path.name.startswith(prefix) or not path.name.endswith(
                "memory-usage-report.txt"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    devices = built["devices"]
    compiled = {
        "topology": versions["topology"], "chips": int(built["engine_info"]["mesh"]["model"]),
        "device_kind": devices[0].device_kind, **{k: v for k, v in versions.items()
                                                  if k != "topology"},
        "program": program["kind"], "num_tokens": program.get("num_tokens"),
        "num_reqs": program.get("num_reqs"), "compile_s": compile_s, "setup_s": lowered_s,
        "memory": memory, "cost": {k: float(v) for k, v in dict(cost).items()
                                   if k in ("flops", "transcendentals", "bytes accessed")}}
    tmp = out / "compiled.json.tmp"
    tmp.write_text(json.dumps(compiled, indent=1))
    tmp.replace(out / "compiled.json")
    return 0


def main(request_path: str) -> int:
    request = json.loads(Path(request_path).read_text())
    out = Path(request["out"])
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    engine = import_engine()
    imported_s = time.perf_counter() - started
    built = build(engine, request)
    versions = {"topology": request["topology"], "libtpu": metadata.version("libtpu"),
                "jax": metadata.version("jax"), "jaxlib": metadata.version("jaxlib"),
                "flax": metadata.version("flax"),
                "tpu_inference": metadata.version("tpu-inference")}
    info = {**built["engine_info"], **versions, "import_s": imported_s,
            "build_s": time.perf_counter() - started - imported_s,
            "compiler_options": engine["compiler_options"](),
            "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS", "")}
    (out / "engine.json").write_text(json.dumps(info, indent=1, default=str))
    code = 0
    for program in request["programs"]:
        code = max(code, compile_one(engine, built, program, versions))
    return code


if __name__ == "__main__":
    if sys.argv[1:] == ["--check-stubs"]:
        sys.exit(check_stubs())
    sys.exit(main(sys.argv[1]))
