"""The TPU's own compiler on this machine (issue 33): steps traced by torch_xla on virtual XLA:CPU
devices, compiled by libtpu's compile-only client (.venv-libtpu) for named v6e slices. Small
programs only: the Llama-3.1-8B figures come from ``scripts/bench_predict.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tpu_workbench.errors import SpecError
from tpu_workbench.tpu_compile import DoesNotFit, compile_proto, tpu_compile

pytestmark = pytest.mark.skipif(
    not (Path(__file__).resolve().parents[1] / ".venv-libtpu" / "bin" / "python").exists()
    and "TPU_WORKBENCH_LIBTPU_PYTHON" not in os.environ,
    reason="no .venv-libtpu: python3 scripts/dev.py setup builds it")


def _trace(folder: Path, body: str, devices: int = 1) -> Path:
    """Run `body` under torch_xla on `devices` virtual XLA:CPU devices with SPMD (placeholders
    ``ph(shape, dtype)``, a 1-D ``mesh``, ``shard(t, spec)``); it sets ``outputs``. The HLO
    proto of ``outputs`` is written to ``folder / "step.pb"``; nothing runs."""
    script = "\n".join([
        "import numpy as np, torch, torch_xla",
        "import torch_xla.core.xla_builder as xb",
        "import torch_xla.distributed.spmd as xs",
        "import torch_xla.runtime as xr",
        "xr.use_spmd()",
        f"mesh = xs.Mesh(np.arange({devices}), ({devices},), ('data',))",
        "ph = xb.create_placeholder_tensor",
        "def shard(t, spec):",
        "    xs.annotate_custom_sharding(t, mesh, spec)",
        "    return t",
        textwrap.dedent(body),
        f"open({str(folder / 'step.pb')!r}, 'wb').write("
        "torch_xla._XLAC._get_xla_tensors_hlo_proto(outputs))"])
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return folder / "step.pb"


@pytest.fixture(autouse=True)
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"


def test_one_bf16_matmul_on_a_v6e_1_is_exact_by_hand(tmp_path):
    """256x512 @ 512x1024 in bf16 on one v6e chip: FLOPs 2*M*K*N exactly; the matmul's bytes
    are its inputs and output; the chip's arguments and output are those buffers."""
    proto = _trace(tmp_path, "outputs = [ph((256, 512), torch.bfloat16) @ "
                             "ph((512, 1024), torch.bfloat16)]")
    program = compile_proto(proto, "v6e-1")
    m, k, n = 256, 512, 1024
    assert program.compiled["cost"]["flops"] == 2 * m * k * n
    assert program.ops["flops"].sum() == 2 * m * k * n
    matmul = program.ops[program.ops["mxu_flops"] > 0]
    assert len(matmul) == 1 and matmul["bytes"].iloc[0] == 2 * (m * k + k * n + m * n)
    memory = program.memory
    assert (memory["arguments"], memory["outputs"]) == (2 * (m * k + k * n), 2 * m * n)
    assert memory["total_bytes"] == 2 * (m * k + k * n + m * n) and memory["fits"]
    # The TPU compiler's program: tiled TPU layouts, its device kind, its version everywhere
    assert "T(8,128)" in program.hlo_text
    assert program.compiled["device_kind"] == "TPU v6 lite"
    assert program.compiled["libtpu"] in program.label and "not run" in program.label
    again = compile_proto(proto, "v6e-1")
    assert again.cached and again.folder == program.folder


def test_windowed_matmul_loops_count_every_trip(tmp_path):
    """An FSDP matmul on a v6e-8: the TPU compiler splits the all-gather of the weight into a
    loop of steps that overlap the matmul. XLA's cost analysis counts the loop body once (half
    the work here); the ops frame counts every trip: the matmul's FLOPs exactly."""
    proto = _trace(tmp_path, """
        x = shard(ph((24, 2048, 1024), torch.bfloat16), ("data", None, None))
        w = shard(ph((4096, 1024), torch.bfloat16), ("data", None))
        outputs = [shard(x @ w.t(), ("data", None, None))]
        """, devices=8)
    program = compile_proto(proto, "v6e-8")
    per_chip = 2 * 3 * 2048 * 1024 * 4096
    loops = program.ops[program.ops["opcode"] == "while"]
    assert len(loops) >= 1 and (loops["trips"] > 1).all()
    assert program.ops["flops"].sum() == pytest.approx(per_chip, rel=1e-3)
    assert program.compiled["cost"]["flops"] < 0.9 * per_chip  # the body counted once


def test_tiny_llama_fsdp_on_a_v6e_8_holds_its_state_sharded_and_updated_in_place():
    """hf:llama tiny, fsdp over a v6e-8: weights and both Adam moments enter as arguments (fp32,
    12 bytes per parameter, split 8 ways, plus tile padding), the updated ones leave aliased to
    them, and the partitioner's collectives run over all 8 chips."""
    c = tpu_compile("hf:llama", "tiny", "v6e-8", "fsdp", seq_len=128, batch_size=8,
                    options={"max_position_embeddings": 128})
    assert c.trace["executions"] == 0 and c.trace["mixed_precision"]
    state = c.trace["n_params"] * 12 / 8
    memory = c.memory
    # at least the state (weights computed inside the program would leave ~0 here), at most
    # 4x it (TPU tiles pad 2-row shards to 8 rows; replicated weights would be 8x)
    assert state <= memory["arguments"] <= 4 * state, (memory, state)
    assert memory["aliased"] >= 0.95 * memory["outputs"] > 0  # updated in place
    kinds = set(c.collectives["kind"])
    assert kinds & {"all-gather", "reduce-scatter", "all-reduce"}, kinds
    assert (c.collectives["group_size"] == 8).any()
    assert c.ops["flops"].sum() == pytest.approx(c.compiled["cost"]["flops"], rel=0.01)
    assert {"size_bytes", "shapes"} <= set(c.buffers.columns) and len(c.buffers)
    assert c.provenance()["libtpu"] == c.compiled["libtpu"]


def test_adafactor_holds_a_row_and_a_column_per_matrix_in_place_of_adams_two_moments():
    """The same step with Adafactor: its factored moments enter as arguments and leave aliased,
    and Adam's 8 bytes per parameter are gone from the arguments (the factored ones are a
    row and a column per matrix)."""
    kwargs = dict(seq_len=128, batch_size=8, options={"max_position_embeddings": 128})
    adam = tpu_compile("hf:llama", "tiny", "v6e-8", "fsdp", **kwargs)
    fact = tpu_compile("hf:llama", "tiny", "v6e-8", "fsdp", optimizer="adafactor", **kwargs)
    assert fact.trace["executions"] == 0
    moments = adam.trace["n_params"] * 8 / 8  # Adam's two fp32 moments, split 8 ways
    saved = adam.memory["arguments"] - fact.memory["arguments"]
    assert 0.9 * moments <= saved <= adam.memory["arguments"] - moments / 2, (saved, moments)
    assert fact.memory["aliased"] >= 0.95 * fact.memory["outputs"] > 0  # updated in place
    # Updated in place: Adam 3 per weight (itself, two moments), Adafactor 3 per matrix (a
    # row, a column) and 2 per vector.
    assert adam.trace["aliased_outputs"] / 3 < fact.trace["aliased_outputs"] \
        < adam.trace["aliased_outputs"]
    with pytest.raises(SpecError, match="unknown optimizer 'sgd'; valid: adamw, adafactor"):
        tpu_compile("hf:llama", "tiny", "v6e-8", "fsdp", optimizer="sgd", **kwargs)


def test_retargeted_annotations_compile_like_a_direct_trace(tmp_path):
    """A slice above 64 chips is traced on 64 devices and its 1-D annotations rewritten: the
    same matmul traced on 8 devices and retargeted to a v6e-16 compiles to what a trace on 16
    devices gives (FLOPs and arguments per chip)."""
    body = """
        x = shard(ph((32, 512, 1024), torch.bfloat16), ("data", None, None))
        w = shard(ph((2048, 1024), torch.bfloat16), ("data", None))
        outputs = [shard(x @ w.t(), ("data", None, None))]
        """
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    direct = compile_proto(_trace(tmp_path / "a", body, devices=16), "v6e-16")
    moved = compile_proto(_trace(tmp_path / "b", body, devices=8), "v6e-16", retarget_from=8)
    assert moved.compiled["retargeted_annotations"] > 0 and moved.compiled["chips"] == 16
    assert moved.ops["flops"].sum() == pytest.approx(direct.ops["flops"].sum(), rel=1e-6)
    assert moved.memory["arguments"] == direct.memory["arguments"]


def test_the_compiler_refuses_a_step_that_does_not_fit():
    c_kwargs = dict(seq_len=8192, batch_size=64, options={"max_position_embeddings": 8192})
    with pytest.raises(DoesNotFit, match=r"does not fit v6e-1: libtpu .*RESOURCE_EXHAUSTED"):
        tpu_compile("hf:llama", "tiny", "v6e-1", "fsdp", **c_kwargs)


def test_bad_input_is_named_before_anything_is_traced(tmp_path, monkeypatch):
    with pytest.raises(SpecError, match="unknown TPU slice 'v6e-12'"):
        tpu_compile("hf:llama", "tiny", "v6e-12")
    with pytest.raises(SpecError, match="batch_size=12 does not split over 8"):
        tpu_compile("hf:llama", "tiny", "v6e-8", batch_size=12, seq_len=64)
    with pytest.raises(SpecError, match="flash attention on v6e-256: above 64 chips"):
        tpu_compile("hf:llama", "tiny", "v6e-256", seq_len=64, batch_size=256,
                    options={"attn_implementation": "flash"})
    with pytest.raises(SpecError, match="'resnet' is not a decoder-only transformer"):
        tpu_compile("resnet", "tiny", "v6e-1", "dp", seq_len=2, batch_size=8)
    with pytest.raises(SpecError, match="unknown preset|preset"):
        tpu_compile("hf:llama", "llama-9", "v6e-8")
    garbage = tmp_path / "step.pb"
    garbage.write_bytes(b"not an HLO module")
    with pytest.raises(SpecError, match="could not compile the program for v6e-8"):
        compile_proto(garbage, "v6e-8")
    from tpu_workbench.tpu_compile import compile as compile_module

    compile_module.libtpu_version.cache_clear()
    monkeypatch.setenv("TPU_WORKBENCH_LIBTPU_PYTHON", str(tmp_path / "no-python"))
    try:
        with pytest.raises(SpecError, match=r"not installed.*scripts/dev.py setup"):
            tpu_compile("hf:llama", "tiny", "v6e-8", seq_len=64, batch_size=8)
    finally:
        compile_module.libtpu_version.cache_clear()


def test_the_compile_command_writes_every_file_whole(tmp_path, capsys):
    from tpu_workbench.cli import main

    out = tmp_path / "out"
    assert main(["compile", "--preset", "tiny", "--seq-len", "64", "--batch", "8",
                 "--slice", "v6e-8", "--out", str(out)]) == 0
    import json

    import pandas as pd

    memory = json.loads((out / "memory.json").read_text())
    assert memory["fits"] and memory["provenance"]["device_kind"] == "TPU v6 lite"
    assert memory["provenance"]["executions"] == 0 and memory["provenance"]["libtpu"]
    ops = pd.read_csv(out / "ops.csv")
    assert {"opcode", "flops", "bytes", "trips", "estimated_cycles"} <= set(ops.columns)
    assert set(pd.read_csv(out / "collectives.csv")["kind"]) & {"all-gather", "all-reduce"}
    assert "T(8,128)" in (out / "tpu_hlo.txt").read_text()
    assert not list(out.glob("*.tmp"))
    assert "compiled for v6e-8" in capsys.readouterr().out
    assert main(["compile", "--preset", "tiny", "--seq-len", "64", "--libtpu-flags",
                 "xla_bad", "--out", str(out)]) == 2
    assert "libtpu_flags must each look like --name=value" in capsys.readouterr().err
