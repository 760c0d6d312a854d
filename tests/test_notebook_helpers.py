"""The small helpers the pallas_kernels, your_model and mingpt notebooks show things with
(`tpu_workbench.notebook`), and the fit chart's bars adding up to the fit table's total."""

from __future__ import annotations

import pandas as pd
import pytest

from tpu_workbench import notebook as nb
from tpu_workbench.environment.backends import TPUStatus
from tpu_workbench.records import FALLBACK_COLUMNS


def test_tpu_reason_says_no_chip_in_words():
    none = TPUStatus(False, 0, "no TPU chip found on the PCI bus (vendor 0x1ae0)", "XLA:CPU")
    assert nb.tpu_reason(none) == "no TPU chip attached to this machine"
    held = TPUStatus(False, 4, "4 TPU chip(s) found, held by process 123", "XLA:CPU")
    assert nb.tpu_reason(held) == held.reason  # a reason a reader can act on stays


def test_code_block_wraps_long_lines_and_keeps_every_character():
    line = "%0 = stablehlo.custom_call @tpu_custom_call(%arg0) <" + "x" * 500 + ">"
    text = nb.code_block(line).text
    assert "white-space: pre-wrap" in text and "word-break: break-all" in text
    assert "x" * 500 in text and "&lt;" in text and "…" not in text  # escaped, not clipped


def test_config_form_has_a_named_control_per_field():
    form = nb.config_form({"hidden_size": 128, "tie_word_embeddings": True, "act": "silu",
                           "rope_theta": 10000.0})
    assert form.value is None  # nothing before a submit
    html = form.text
    for name in ("hidden_size", "tie_word_embeddings", "act", "rope_theta"):
        assert name in html
    assert "dictionary" not in html  # not marimo's JSON tree of a mo.ui.dictionary
    with pytest.raises(TypeError, match="'layers' = \\[1, 2\\]"):
        nb.config_form({"layers": [1, 2]})


def _rows(*rows: dict) -> pd.DataFrame:
    base = {c: "" for c in FALLBACK_COLUMNS} | {"count": 0, "per_step": 0.0}
    return pd.DataFrame([base | r for r in rows], columns=FALLBACK_COLUMNS)


def test_outside_xla_text_tells_not_measured_from_none_found():
    assert "No run above measures this" in nb.outside_xla_text(_rows().iloc[:0])
    lazy_only = _rows({"mode": "lazy", "kind": "fallback", "op": "none"})
    text = nb.outside_xla_text(lazy_only)
    assert "**no CPU fallbacks** in `lazy`" in text
    assert "graph breaks not measured" in text and "dynamo" in text
    found = _rows({"mode": "lazy", "kind": "fallback", "op": "none"},
                  {"mode": "dynamo", "kind": "fallback", "op": "aten::nonzero", "count": 69},
                  {"mode": "dynamo", "kind": "graph_break", "op": "Data-dependent branching",
                   "count": 1})
    found.loc[2, ["where", "line", "note"]] = ["m.py:36 in forward", "if mask.any():",
                                               "Dynamo gave up on all of `forward`"]
    text = nb.outside_xla_text(found)
    assert "**1 kind(s) of CPU fallbacks** in `dynamo`" in text
    assert "**1 kind(s) of graph breaks** in `dynamo`" in text
    # each one found, in full: where, the source line and what it means
    assert "- **CPU fallback** `aten::nonzero` (mode `dynamo`): 69 call(s)" in text
    assert ("- **graph break** (Data-dependent branching, mode `dynamo`) at "
            "`m.py:36 in forward`: `if mask.any():`") in text
    assert ": Dynamo gave up on all of `forward`." in text


def test_example_model_names_the_checkouts_file():
    ref = nb.example_model("tiny_moe")
    assert ref is not None and ref.endswith("tests/models/tiny_moe.py:make")
    assert nb.example_model("no_such_model") is None


def test_fit_bars_add_up_to_the_tables_total_logits_included():
    from tpu_workbench import sharding
    from tpu_workbench.charts import fit_bars

    table = sharding.model_fit_table("hf:llama", "llama-3.2-1b", 32, 2048, recompute=True)
    spec = fit_bars(table).to_dict()
    bars = pd.DataFrame(spec["datasets"][spec["data"]["name"]])
    stacked = bars.groupby(["slice", "strategy"])["gb"].sum()
    total = table.set_index(["slice", "strategy"])["per_device_gb"]
    assert (table["logits_gb"] > 1).all()  # a 128k vocabulary: GBs the bars must not drop
    assert stacked.sort_index().to_numpy() == pytest.approx(total.sort_index().to_numpy())


def test_the_xla_against_pytorch_sentence_follows_its_numbers():
    """The quickstart's lesson said "XLA is no speed-up on a CPU" under a table where
    `compile` stepped in 70 ms and `torch_eager` in 411 ms: the sentence is now computed from
    the table, whichever way the numbers go."""
    import pandas as pd

    from tpu_workbench import notebook

    def said(**ms):
        return notebook.xla_against_pytorch(pd.DataFrame(
            {"mode": list(ms), "steady_median_ms": list(ms.values())}))

    slower = said(torch_eager=38.0, lazy=84.0, compile=96.0)
    assert "no speed-up" in slower and "`lazy`" in slower and "2.2x slower" in slower
    faster = said(torch_eager=411.0, lazy=90.0, compile=70.0)
    assert "`compile` is 5.9x faster" in faster and "no speed-up" not in faster
    assert "about as fast" in said(torch_eager=50.0, compile=53.0)
    assert said(lazy=50.0) == "" and said(torch_eager=50.0, inductor=20.0) == ""


def test_compiles_by_phase_text_counts_each_run():
    import pandas as pd

    from tpu_workbench import notebook

    by_phase = pd.DataFrame([
        {"mode": "lazy", "strategy": "static_cache", "phase": "prefill", "compiles": 3},
        {"mode": "lazy", "strategy": "static_cache", "phase": "decode", "compiles": 1},
        {"mode": "lazy", "strategy": "naive", "phase": "prefill", "compiles": 1},
        {"mode": "lazy", "strategy": "naive", "phase": "decode", "compiles": 5}])
    text = notebook.compiles_by_phase_text(by_phase)
    assert "- `lazy` `static_cache`: 3 prefill and 1 decode programs compiled" in text
    assert "- `lazy` `naive`: 1 prefill and 5 decode programs compiled" in text


def test_confusion_text_names_what_the_matrix_shows():
    """ResNet's matrix called 88 of 119 squares "disk" with no word on the page."""
    import pandas as pd

    from tpu_workbench import notebook

    rows = ([("square", "disk")] * 88 + [("square", "square")] * 31
            + [("disk", "disk")] * 100 + [("ring", "disk")] * 40 + [("ring", "ring")] * 60)
    text = notebook.confusion_text(pd.DataFrame(rows, columns=["true", "predicted"]))
    assert "**88 of the 119 squares were called disk**" in text
    assert "It answers **disk** for 228 of the 319 images (71%" in text
    balanced = pd.DataFrame([("a", "a"), ("a", "b"), ("b", "b"), ("b", "a")],
                            columns=["true", "predicted"])
    assert "answers" not in notebook.confusion_text(balanced)
    assert notebook.confusion_text(balanced.iloc[[0, 2]]) == "All 2 images were called right."
