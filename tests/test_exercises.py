"""Workshop exercises are fair: the answer is measured once in a fresh worker (so a warm
worker's cache cannot change it), nothing is judged before a submit, out-of-range input gets a
message, and checking an answer starts no worker."""

from __future__ import annotations

import builtins
import importlib.util
import json
import shutil
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


def test_eager_vs_compiled_answer_is_right_on_a_cold_and_a_warm_worker(results, worker_log):
    """The trap the old check fell into is real: in a warm worker the first `.item()` step
    compiles nothing (a cache hit). The exercise's answer is measured in a fresh worker, so it
    stays the count a fresh process compiles, whatever ran before, and a stored run from a warm
    worker is never taken as the answer."""
    evc = _load("eager_vs_compiled")
    spec = evc.EXERCISE
    # One new program at the first `.item()`: the forward pass up to the loss (read from a
    # fresh worker's own records, not from the function under test).
    cold = wb.run(spec, cold=True).steps.set_index("step")
    assert cold.loc[0, "compiles"] >= 1  # a fresh process compiles the step at step 0
    expected = int(cold.loc[spec.change_at, "compiles"])
    assert expected == 1
    # A warm worker: the exercise's spec twice in the shared pool; the second run compiles
    # nothing at all, and it is now the newest stored run of that spec.
    wb.run(spec)
    warm = wb.run(spec).steps.set_index("step")
    assert warm.loc[0, "compiles"] == 0 and warm.loc[spec.change_at, "compiles"] == 0
    assert wb.reusable(spec).steps.set_index("step").loc[0, "compiles"] == 0

    # Leave only warm workers' runs in the store.
    for folder in results.iterdir():
        if json.loads((folder / "environment.json").read_text())["worker_start_s"] > 0:
            shutil.rmtree(folder)
    before = worker_log()
    # With the shared worker warm and only warm runs stored: measured again, in a fresh worker.
    assert evc.exercise_answer(reuse=True) == expected
    assert worker_log() - before == 1
    # Now the newest stored run is that cold one: reused, no worker started.
    assert evc.exercise_answer(reuse=True) == expected
    assert worker_log() - before == 1

    kind, text = evc.judge_compiles("1", expected)
    assert kind == "success" and text.startswith("**Right: 1.**")
    assert evc.judge_compiles("0", expected)[0] == "warn"


def test_eager_vs_compiled_check_messages_and_starts_no_worker(worker_log):
    evc = _load("eager_vs_compiled")
    assert evc.judge_compiles(" 1 ", 1)[0] == "success"
    kind, text = evc.judge_compiles("0", 1)
    assert kind == "warn" and "You said 0" in text and "Right" not in text
    kind, text = evc.judge_compiles("99", 1)  # mo.ui.number would have clamped this to 10
    assert kind == "warn" and "99 is out of range" in text and "0 to 10" in text
    kind, text = evc.judge_compiles("two", 1)
    assert kind == "warn" and "whole number" in text
    assert worker_log() == 0

    # The check cell reads only the submitted form and the measured count; the measuring cell
    # reads nothing, so typing (or submitting) an answer can never rerun it.
    assert _inputs(evc, "judge_compiles(answer.value") == {"answer", "measured_answer"}
    assert _inputs(evc, "measured_answer = exercise_answer(") == set()
    assert "mo.stop(answer.value is None" in _code(evc.app, "judge_compiles(answer.value")


def test_quickstart_replicas_check(worker_log):
    qs = _load("quickstart")
    assert qs.judge_replicas("2", 2, 8)[0] == "success"
    kind, text = qs.judge_replicas("4", 2, 8)
    assert kind == "warn" and "You said 4" in text
    kind, text = qs.judge_replicas("64", 2, 8)  # more devices than the mesh has
    assert kind == "warn" and "out of range" in text and "between 1 and 8" in text
    assert "out of range" in qs.judge_replicas("0", 2, 8)[1]
    assert "whole number" in qs.judge_replicas("", 2, 8)[1]
    assert worker_log() == 0
    # the submitted answer and the layout the page shows: no run, no control of a run
    assert _inputs(qs, "judge_replicas(answer.value") == {
        "answer", "largest", "layout", "layout_devices", "layout_strategy"}
    assert "mo.stop(answer.value is None" in _code(qs.app, "judge_replicas(answer.value")


def _code(app, needle: str) -> str:
    return next(c.code for c in app._cell_manager.cell_data() if needle in c.code)


def test_your_model_exercise_reads_the_fit_table_and_starts_nothing(worker_log):
    from tpu_workbench import sharding

    module = _load("your_model")
    assert _inputs(module, "judge_smallest_slice(slice_answer") == {"fit", "slice_answer"}
    # Llama-3-8B, batch 32 x 2048 tokens: recomputation lets fsdp fit on a smaller slice
    order = ["v6e-8", "v6e-16", "v6e-32", "none"]

    def smallest(table) -> str:
        rows = table[(table.strategy == "fsdp") & table.fits]
        return min(rows.slice, key=order.index) if len(rows) else "none"

    kept = sharding.model_fit_table("hf:llama", "llama-3-8b", 32, 2048, recompute=True)
    full = sharding.model_fit_table("hf:llama", "llama-3-8b", 32, 2048, recompute=False)
    assert order.index(smallest(kept)) < order.index(smallest(full))
    for table in (kept, full):
        right = smallest(table)
        assert module.judge_smallest_slice(right, table)[0] == "success"
        wrong = next(s for s in order if s != right)
        assert module.judge_smallest_slice(wrong, table)[0] == "warn"
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
