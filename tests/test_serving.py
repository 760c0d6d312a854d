"""Serving plans (tpu_workbench.serving): bad flags and impossible plans fail before any compile;
a small model's decode program, compiled by libtpu for v6e-1 (cached: seconds after the first
run), holds the ragged paged attention kernel; the KV capacity read from the compiler's memory
is where the compiler starts refusing."""

from __future__ import annotations

import pytest

from tpu_workbench.errors import SpecError
from tpu_workbench.serving import compile as serve_compile
from tpu_workbench.serving import plan as P
from tpu_workbench.serving.presets import PRESETS
from tpu_workbench.tpu_compile.compile import DoesNotFit


@pytest.fixture
def no_compile(monkeypatch):
    """Any compile is a failure: these plans must be refused before one."""

    def refuse(*args, **kwargs):
        raise AssertionError("compiled, but the plan should have been refused before")

    monkeypatch.setattr(serve_compile, "compile_programs", refuse)
    monkeypatch.setattr("tpu_workbench.serving.serve.compile_programs", refuse)


@pytest.mark.parametrize(("kwargs", "names"), [
    ({"model": "hf:gpt2"}, ["hf:gpt2", "hf:llama", "hf:qwen3"]),
    ({"preset": "qwen3-8b"}, ["qwen3-8b", "llama-3.1-8b", "llama-3.3-70b", "tiny-llama"]),
    ({"slice": "v5e-8"}, ["v5e-8", "v6e"]),
    ({"slice": "v6e-3"}, ["v6e-3"]),
    ({"input_len": 0}, ["--input-len", "0"]),
    ({"concurrency": (8, -1)}, ["--concurrency", "-1"]),
    ({"concurrency": ()}, ["--concurrency"]),
    ({"kv_cache_dtype": "int4"}, ["int4", "bf16", "fp8"]),
    ({"engine": "tgi"}, ["tgi", "vllm", "sglang"]),
    ({"tensor_parallel": 3}, ["tensor parallel 3", "[1, 4, 8]"]),
    ({"max_model_len": 1500}, ["--max-model-len 1500", "2000"]),
    ({"max_model_len": 200000}, ["131072"]),
    ({"max_num_seqs": 4, "concurrency": (8,)}, ["--max-num-seqs 4", "8"]),
    ({"max_num_batched_tokens": 8, "max_num_seqs": 64}, ["--max-num-batched-tokens 8", "64"]),
])
def test_bad_flag_is_named_before_any_compile(no_compile, kwargs, names):
    from tpu_workbench.serving.serve import serve_plan

    args = {"model": "hf:llama", "preset": "llama-3.1-8b", "slice": "v6e-8", **kwargs}
    with pytest.raises(SpecError) as err:
        serve_plan(**args)
    for name in names:
        assert name in str(err.value)


def test_70b_weights_on_one_chip_name_the_tensor_parallel_that_holds_them(no_compile):
    from tpu_workbench.serving.serve import serve_plan

    # By hand: Llama-3.3-70B is 70.55e9 parameters, 141 GB in bf16; 90% of a v6e chip's
    # 31.24 GiB is 30.2 GB: 141/4 = 35 GB does not fit, 141/8 = 17.6 GB does.
    with pytest.raises(DoesNotFit) as err:
        serve_plan("hf:llama", "llama-3.3-70b", "v6e-4", tensor_parallel=4)
    assert "35.3 GB per chip" in str(err.value) and "tensor parallel 8" in str(err.value)


def test_kv_cache_that_does_not_fit_names_the_largest_concurrency_and_length(no_compile):
    from tpu_workbench.serving.serve import serve_plan

    # By hand: Llama-3.1-8B on one chip: 8.03e9 parameters = 16.06 GB; 30.19 GB budget leaves
    # 14.13 GB; a token keeps 2 x 8 heads x 128 x 2 B x 32 layers = 131072 B; 2000 tokens in
    # pages of 128 (16 pages: 2048 tokens) = 268.4 MB: 52 sequences fit, not 64.
    with pytest.raises(DoesNotFit) as err:
        serve_plan("hf:llama", "llama-3.1-8b", "v6e-1", input_len=1000, output_len=1000,
                   concurrency=(64,))
    text = str(err.value)
    assert "64 sequences of 2000 tokens" in text and "concurrency 52" in text


# --- one small model, compiled for v6e-1 (cached under results/serve_compiles) ------------

SMALL = PRESETS["tiny-llama"]


def _request(**kwargs) -> P.ServeRequest:
    fields = {"preset": SMALL, "slice": "v6e-1", "chips": 1, "tp": 1, "replicas": 1,
              "input_len": 128, "output_len": 128, "concurrency": (8,), "max_num_seqs": 8,
              "max_num_batched_tokens": 64, "max_model_len": 256, "kv_cache_dtype": "bf16",
              "engine": "vllm", "gpu_memory_utilization": 0.9, **kwargs}
    return P.ServeRequest(**fields)


def _decode(blocks: int):
    if not serve_compile.serve_python().exists():
        pytest.skip("no .venv-serve (no Python 3.12 here?): scripts/dev.py setup")
    r = _request()
    programs = [{"name": "decode-16", "kind": "step", "num_tokens": 16}]
    return r, serve_compile.compile_programs(P.engine_request(r, blocks), programs,
                                             "v6e-1")["decode-16"]


def test_decode_program_holds_the_ragged_paged_attention_kernel():
    from tpu_workbench.serving.serve import attention_kernels

    r, step = _decode(64)
    # Two Mosaic kernels per layer (ragged paged attention v3's decode and mixed cases) and
    # nothing else custom: the small model has 2 layers.
    assert attention_kernels(step) == 2 * SMALL.layers
    assert "RPA" in step.hlo_text
    # The cache is donated: the compiler aliases it to the output (as on a chip).
    assert step.memory["aliased"] >= step.engine["kv_bytes_per_chip"] > 0


def test_kv_capacity_is_where_the_compiler_starts_refusing():
    r, step = _decode(64)
    fit = P.kv_capacity(r, step)["kv_pages_fit"]
    page = step.engine["kv_bytes_per_chip"] / step.engine["num_blocks"]
    assert fit * page > 25e9  # a small model: most of a chip's HBM is left for KV
    _, at = _decode(fit)
    assert not isinstance(at, DoesNotFit), at
    assert at.memory["fits"]
    # 4 MiB of pages past it (0.01% of the chip), the compiler refuses, in its own words.
    # (Probed with libtpu 0.0.48: this program fits at 31.2405 GiB and is refused from
    # 31.2425 GiB; the workbench's usable HBM is 31.24 GiB.)
    _, over = _decode(fit + int(4 * 2**20 // page))
    assert isinstance(over, DoesNotFit)
    assert "RESOURCE_EXHAUSTED" in over.message or "HBM" in over.message


def test_cli_names_a_bad_flag_before_any_compile(no_compile, capsys):
    from tpu_workbench.cli import main

    assert main(["serve-plan", "--concurrency", "8,lots"]) == 2
    assert "--concurrency must be an int, got 'lots'" in capsys.readouterr().err
    assert main(["serve-plan", "--preset", "llama-3.3-70b", "--slice", "v6e-4"]) == 2
    assert "tensor parallel 8" in capsys.readouterr().err


def test_launch_serve_prints_the_server_and_its_benchmarks(no_compile, capsys, monkeypatch):
    from tpu_workbench.cli import main
    from tpu_workbench.scale import serve_launch

    args = ["launch", "--serve", "--slice", "v6e-8", "--model", "hf:llama", "--preset",
            "llama-3.3-70b", "--concurrency", "1,64"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "vllm serve meta-llama/Llama-3.3-70B-Instruct --tensor-parallel-size 8 " \
           "--max-num-seqs 64" in out
    assert out.count("vllm bench serve") == 2 and "--max-concurrency 64" in out
    monkeypatch.setattr(serve_launch.shutil, "which", lambda name: None)  # no vllm here
    assert main([*args, "--execute"]) == 1
    assert "vllm is not installed here" in capsys.readouterr().err
