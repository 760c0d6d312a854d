"""Workshop exercises are fair: the answer is measured once in a fresh worker (so a warm
worker's cache cannot change it), nothing is judged before a submit, out-of-range input gets a
message, and checking an answer starts no worker."""

from __future__ import annotations

import builtins
import importlib.util
import sys

import pytest
from conftest import ROOT

import tpu_workbench as wb
from tpu_workbench.environment import backends
from tpu_workbench.runs.runner import WORKER_LOG_ENV

needs_xla = pytest.mark.skipif(not backends.have_torch_xla(), reason="needs torch_xla")


def _load(stem: str):
    """Import a notebook as a module: runs its setup cell only (no cell, no worker)."""
    name = f"nb_exercises_{stem}"
    spec = importlib.util.spec_from_file_location(name, ROOT / "notebooks" / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _inputs(module, needle: str) -> set[str]:
    """What the one cell of `module`'s app whose code contains `needle` reads from other cells
    (names of the setup cell, such as `mo` or an `@app.function`, left out)."""
    found = [c for c in module.app._cell_manager.cell_data() if needle in c.code]
    assert len(found) == 1, f"{len(found)} cells contain {needle!r}"
    return set(found[0].cell._cell.refs) - set(vars(module)) - set(dir(builtins))


@pytest.fixture
def worker_log(tmp_path, monkeypatch):
    log = tmp_path / "workers.log"
    monkeypatch.setenv(WORKER_LOG_ENV, str(log))
    return lambda: len(log.read_text().splitlines()) if log.exists() else 0


def test_eager_vs_compiled_check_reads_only_the_answer_and_starts_no_worker(worker_log):
    """The judge reads the submitted form alone: answering can rerun no cell that measures."""
    evc = _load("eager_vs_compiled")
    assert _inputs(evc, "exercise.judge(answer.value)") == {"answer"}
    assert "if answer.value is None" in _code(evc.app, "exercise.judge(answer.value)")
    from tpu_workbench.exercises import eager_vs_compiled

    assert eager_vs_compiled.judge("2")[0] == "success"
    assert worker_log() == 0


def test_the_last_batch_answer_is_what_xla_compiles(results):
    """The exercise's answer, 2, against a real loop: the batches of 32, then one of 8, then
    32 again, in one `compile` worker: two programs, and the repeat is a cache hit (the
    workbench's own runs, counted by torch_xla's counters)."""
    from tpu_workbench.exercises import eager_vs_compiled

    pool = wb.WorkerPool(max_workers=1)
    try:
        spec = wb.ExperimentSpec(model="mlp", preset="tiny", mode="compile", steps=2)
        first = wb.run(spec, pool=pool)
        last = wb.run(spec.replace(batch_size=8), pool=pool)
        again = wb.run(spec, pool=pool)  # the second epoch
    finally:
        pool.shutdown()
    compiled = [int(r.steps["compiles"].sum()) for r in (first, last, again)]
    assert compiled[0] >= 1 and compiled[1] >= 1 and compiled[2] == 0
    assert (compiled[0] > 0) + (compiled[1] > 0) == eager_vs_compiled.RIGHT


def test_quickstart_check_reads_the_layout_shown_and_starts_no_worker(worker_log):
    qs = _load("quickstart")
    # the submitted answer and what the page shows of the layout: no run, no run's control
    assert _inputs(qs, "exercise.judge(") == {
        "answer", "largest", "layout_mesh", "layout_strategy", "model"}
    assert "if answer.value is None" in _code(qs.app, "exercise.judge(")
    from tpu_workbench.exercises import quickstart

    kb = quickstart.held_kb("mlp", "fc1.weight", (2, 4), "fsdp")
    assert quickstart.judge(kb, kb, 8 * kb, "fsdp", 8)[0] == "success"
    assert worker_log() == 0


def _code(app, needle: str) -> str:
    return next(c.code for c in app._cell_manager.cell_data() if needle in c.code)


def _hidden(app, needle: str) -> bool:
    """Whether the one cell whose code contains `needle` hides its code on the page."""
    return next(c.config.hide_code for c in app._cell_manager.cell_data() if needle in c.code)


def _judged_below_the_question(module, judge: str, answer: str, facts: str) -> None:
    """The exercise's shape on the page: the judge is the library's (no verdict function in
    the notebook), called in a hidden cell that reads only the submitted form and the facts,
    waits for a submit, and sits below the form; the facts come from a hidden cell too."""
    call = f"exercise.{judge}({answer}.value"
    assert _inputs(module, call) == {answer, facts}
    assert _hidden(module.app, call) and _hidden(module.app, f"{facts} = exercise.")
    assert f"mo.stop({answer}.value is None" in _code(module.app, call)
    order = [c.code for c in module.app._cell_manager.cell_data()]
    form = next(i for i, code in enumerate(order) if f"{answer} = mo.ui." in code)
    check = next(i for i, code in enumerate(order) if call in code)
    assert 'submit_button_label="check"' in order[form] and form < check


def test_your_model_exercise_one_chip_batch(worker_log):
    """The largest global batch of Llama-3.2-1B (1,235,814,400 parameters) at 2048 tokens on
    one v6e chip, by hand from the convention: state 16 B x 1,235,814,400 = 19.773 GB; per
    sequence, with recomputation, activations 16 layers x 2048 x 2048 x 2 B (each block's
    input) + one block in full, and logits 2 x 2048 x 128256 x 2 B = 1.0507 GB; usable 0.9 x
    32 GB = 28.8 GB."""
    from tpu_workbench.exercises import your_model as ex

    module = _load("your_model")
    _judged_below_the_question(module, "judge_batch", "batch_answer", "one_chip")
    assert _inputs(module, "one_chip = exercise.one_chip_facts(") == {
        "model_ref", "plan_preset", "recompute", "seq_len"}

    s, h, v, layers, inner, heads, kv, d = 2048, 2048, 2, 16, 8192, 32, 8, 64
    block = (4 * s * h + 2 * s * heads * d + 2 * s * kv * d + heads * s * s + 4 * s * inner) * v
    per_sequence = layers * s * h * v + block + 2 * s * 128256 * v
    state = 16 * 1_235_814_400
    largest = int((28.8e9 - state) // per_sequence)
    facts = ex.one_chip_facts("hf:llama", "llama-3.2-1b", 2048, recompute=True)
    assert facts["largest"] == largest == 5
    assert facts["state_gb"] == pytest.approx(state / 1e9)
    assert facts["per_sequence_gb"] == pytest.approx(per_sequence / 1e9)
    kind, text = ex.judge_batch(" 5 ", facts)
    assert kind == "success" and text.startswith("**Right: 5.**") and "19.77 GB" in text
    kind, text = ex.judge_batch("6", facts)
    assert kind == "warn" and "You said 6" in text and "Too many" in text and "5" not in text
    assert "Too few" in ex.judge_batch("4", facts)[1]
    assert "not a whole number" in ex.judge_batch("five", facts)[1]
    assert "out of range" in ex.judge_batch("-1", facts)[1]
    # Llama-3-8B's state alone, 16 x 8.03 B = 128 GB, is over one chip: the answer is 0
    big = ex.one_chip_facts("hf:llama", "llama-3-8b", 2048, recompute=True)
    assert big["largest"] == 0 and ex.judge_batch("0", big)[0] == "success"
    # a model with no transformer shape has no plan: said, never judged
    assert ex.judge_batch("1", None)[0] == "neutral"
    assert worker_log() == 0


def test_pallas_exercise_vmem_of_a_block_choice_the_page_cannot_show(worker_log):
    """head_dim 256 in bf16, block_q 64, block_k 256, by hand: Q and O 2 x 64 x 256 x 2 B =
    64 KiB each, K and V 2 x 256 x 256 x 2 B = 256 KiB each, m and l 64 x 128 x 4 B = 32 KiB
    each, acc 64 x 256 x 4 B = 64 KiB: 768 KiB."""
    from tpu_workbench.exercises import pallas_kernels as ex

    module = _load("pallas_kernels")
    _judged_below_the_question(module, "judge_vmem", "vmem_answer", "vmem_facts")
    assert ex.QUESTION["head_dim"] not in (32,)  # the page's controls fix head_dim at 32
    facts = ex.vmem_facts()
    assert facts["total"] == 768 * 1024
    kind, text = ex.judge_vmem("768", facts)
    assert kind == "success" and text.startswith("**Right: 768 KiB.**")
    assert ex.judge_vmem(" 768 KiB ", facts)[0] == "success"
    # the usual slips are named, and a wrong answer never gives the total away
    for wrong, slip in (("448", "double-buffers"), ("640", "scratch"), ("832", "128 lanes")):
        kind, text = ex.judge_vmem(wrong, facts)
        assert kind == "warn" and f"You said {wrong} KiB" in text and slip in text
        assert "768" not in text
    assert "VMEM table" in ex.judge_vmem("700", facts)[1]
    assert "not a number" in ex.judge_vmem("lots", facts)[1]
    assert "out of range" in ex.judge_vmem("0", facts)[1]
    assert worker_log() == 0


def test_mingpt_exercise_twice_the_blocks(worker_log):
    """GPT-2 small with 24 blocks, by hand: 124,439,808 + 12 x (12 d^2 + 13 d) at d = 768 =
    124,439,808 + 12 x 7,087,872 = 209,494,272 (embeddings and the final norm stay)."""
    from tpu_workbench.exercises import mingpt as ex

    module = _load("mingpt")
    _judged_below_the_question(module, "judge_deeper", "params_answer", "deeper_facts")
    facts = ex.deeper_facts()
    d = 768
    assert facts["params"] == 124_439_808 + 12 * (12 * d * d + 13 * d) == 209_494_272
    kind, text = ex.judge_deeper("209.5", facts)
    assert kind == "success" and text.startswith("**Right: 209.5 M.**")
    assert ex.judge_deeper("209.4 M", facts)[0] == "success"  # 12 d^2 per block is close
    kind, text = ex.judge_deeper("248.9", facts)  # twice 124.4 M: embeddings doubled too
    assert kind == "warn" and "not inside a block" in text and "209" not in text
    assert "Too few" in ex.judge_deeper("152.7", facts)[1]  # 4 d^2 per block: MLP left out
    assert "not a number" in ex.judge_deeper("two hundred", facts)[1]
    assert "out of range" in ex.judge_deeper("-5", facts)[1]
    assert worker_log() == 0


def test_generation_exercise_is_judged_on_submit_by_the_library_and_starts_nothing(
        worker_log):
    from tpu_workbench.exercises import generation as exercise

    module = _load("generation")
    assert _inputs(module, "exercise.judge(programs_answer.value") == {
        "comparison", "programs_answer"}
    assert "programs_answer.value is None" in _code(module.app,
                                                    "exercise.judge(programs_answer.value")
    # By hand, prompts 3, 12, 5, 12, 9 with 4 new tokens, buckets 8/16:
    # dynamic_cache: prefills for 3, 12, 5, 9 (4) + decode cache lengths p .. p+2 of each:
    #   {3,4,5} {12,13,14} {5,6,7} {9,10,11} = 11 distinct, so 15;
    # static_cache: 4 prefills + 1 decode = 5; bucketed: buckets 8 and 16 + 1 decode = 3.
    right = {"dynamic_cache": 15, "static_cache": 5, "bucketed": 3}
    kind, text = exercise.judge(right, {"static_cache": (4, 4)})
    assert kind == "success" and text.startswith("**Right**: 15, 5 and 3.")
    assert "compiled `static_cache` 4 (counted 4)" in text
    kind, text = exercise.judge({**right, "static_cache": 6.0})
    assert kind == "warn" and "not yet `static_cache`" in text
    assert not any(str(n) in text for n in right.values())  # hints, never the numbers
    for bad in ({**right, "bucketed": None}, {**right, "bucketed": 2.5},
                {**right, "bucketed": -1}, {**right, "bucketed": "three"}):
        kind, text = exercise.judge(bad)
        assert kind == "warn" and "Enter a whole number" in text and "`bucketed`" in text
    assert exercise.judge(None)[0] == "neutral"
    assert worker_log() == 0


@needs_xla
def test_generation_exercise_answer_is_what_xla_compiles(results):
    """The counting the judge uses is what torch_xla does: the question's requests, each
    strategy on a worker no other run's programs could have warmed."""
    from tpu_workbench.exercises import generation as exercise
    from tpu_workbench.generation import analysis

    specs = wb.generation_specs("mingpt", "tiny", ["lazy"], exercise.ASKED,
                                prompts=exercise.PROMPTS, new_tokens=exercise.NEW_TOKENS,
                                buckets=exercise.BUCKETS)
    got = wb.generate_many(specs)
    assert not got.errors, got.errors
    measured = {r.spec.decode: int(analysis.token_frame(r.records)["compiles"].sum())
                for r in got.results}
    assert measured == exercise.expected() == {"dynamic_cache": 15, "static_cache": 5,
                                               "bucketed": 3}


def test_unet_exercise_signal_half_way(worker_log):
    """The cosine schedule's picture scale at t = 500 of 1000, by hand: cos(0.509 / 1.008 x
    90 degrees) / cos(0.008 / 1.008 x 90 degrees) = 0.7016 (diffusers' alphas_cumprod[t] is
    f((t + 1) / T) / f(0)); the schedule's chart waits for the answer too."""
    from tpu_workbench.exercises import unet as ex

    module = _load("unet")
    _judged_below_the_question(module, "judge_signal", "signal_answer", "signal_facts")
    assert "mo.stop(signal_answer.value is None)" in _code(module.app, "alt.Chart(_schedule")
    facts = ex.signal_facts()
    assert facts["signal"] == pytest.approx(0.7016, abs=5e-4)
    assert ex.judge_signal("0.70", facts)[0] == "success"
    kind, text = ex.judge_signal("0.5", facts)
    assert kind == "warn" and "0.70" not in text
    assert worker_log() == 0
