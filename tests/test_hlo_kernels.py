"""`hlo.kernels` / `hlo.op_detail`: what a compiled step runs, on a hand-written XLA:CPU-shaped
module whose counts are known by construction (a fusion, a parallel call XLA:CPU wraps around a
fusion's clone, a dot with metadata, copies and plumbing)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tpu_workbench import hlo

MODULE = (Path(__file__).parent / "data" / "kernels.cpu_after_optimizations.txt").read_text()


@pytest.fixture(scope="module")
def ops():
    return hlo.instructions(MODULE)


def test_kernels_are_the_entry_ops_that_do_work_a_parallel_call_as_its_fusion(ops):
    k = hlo.kernels(ops).set_index("name")
    # 2 parameters and a bitcast run nothing; the gelu fusion, the dot, the copy and the call do
    assert list(k.index) == ["gelu_fusion", "dot.1", "copy.1", "call.1"]
    assert k.loc["call.1", "kernel"] == "add_fusion.clone" and k.loc["call.1", "parallel"]
    assert k.loc["call.1", "opcode"] == "fusion"
    assert k.loc["gelu_fusion", "ops_inside"] == 3  # constant, broadcast, multiply
    assert k.loc["gelu_fusion", "source"] == "aten__gelu @ net.py:7"
    assert k.loc["dot.1", "source"] == "aten__mm @ linear.py:3"
    assert k.loc["call.1", "source"] == "aten__add @ net.py:9"


def test_program_counts_separate_the_text_from_the_kernels(ops):
    counts = hlo.program_counts(ops, ops).set_index("")["after optimisation"]
    assert counts.iloc[0] == 17  # every instruction line: 4 + 3 + 3 + 7
    assert counts.iloc[1] == 7  # x, w; p0; q0, q1; r0, r1: each computation has its own
    assert counts.iloc[2] == 4  # the entry, the fusion, the parallel task and its clone's
    assert counts.iloc[3] == 4  # the kernels above


def test_op_detail_opens_a_kernel_from_any_name_inside_it(ops, tmp_path):
    # a profile names the clone a parallel call runs: it opens the call
    detail = hlo.op_detail(ops, "add_fusion.clone")
    assert detail.name == "call.1" and detail.kernel == "add_fusion.clone"
    assert "calls=%fused_add.clone" in detail.text
    assert list(detail.inside["opcode"]) == ["add"]
    assert detail.sources[["source_op", "line", "count"]].values.tolist() == [["aten__add", 9, 1]]
    gelu = hlo.op_detail(ops, "b")  # an instruction inside the gelu fusion
    assert gelu.name == "gelu_fusion" and sorted(gelu.inside["opcode"]) == [
        "broadcast", "constant", "multiply"]
    assert gelu.sources["count"].tolist() == [3]


def test_op_detail_reads_the_model_line(tmp_path):
    src = tmp_path / "net.py"
    src.write_text("a = 1\n    return F.gelu(x)\n")
    text = MODULE.replace('"/m/net.py" source_line=7', f'"{src}" source_line=2')
    detail = hlo.op_detail(hlo.instructions(text), "gelu_fusion")
    assert detail.sources["code"].tolist() == ["return F.gelu(x)"]


def test_op_detail_names_valid_instructions_for_a_wrong_one(ops):
    with pytest.raises(ValueError, match="no instruction 'nope'.*dot.1"):
        hlo.op_detail(ops, "nope")


def test_kernel_mix_counts_kernels_and_clicks_select_an_opcode(ops):
    import marimo as mo

    from tpu_workbench import charts

    chart = mo.ui.altair_chart(charts.kernel_mix(hlo.kernels(ops)))
    data = chart.dataframe.set_index("opcode")
    assert data.loc["fusion", "kernels"] == 2 and data.loc["dot", "kernels"] == 1
    picked = chart._convert_value({"pick": {"opcode": ["fusion"]}})
    assert isinstance(picked, pd.DataFrame) and picked["opcode"].tolist() == ["fusion"]
