"""Generation: decode strategies on XLA:CPU and plain PyTorch, their compile counts, the same
greedy tokens everywhere, buckets and summaries by hand, and bad input before any worker."""

from __future__ import annotations

import json
import types

import pandas as pd
import pytest

import tpu_workbench as wb
from tpu_workbench.environment import backends
from tpu_workbench.generation import analysis as generation
from tpu_workbench.generation.runs import generate_many, phase_hlo
from tpu_workbench.generation.spec import GenerationSpec, with_positions
from tpu_workbench.models import get_model
from tpu_workbench.runs.workers import WorkerPool

needs_xla = pytest.mark.skipif(not backends.have_torch_xla(), reason="needs torch_xla")


# -- pure: buckets, programs, summaries ------------------------------------------------------------


def test_bucket_for_picks_the_smallest_that_holds_the_prompt():
    assert [generation.bucket_for(n, (32, 8, 16)) for n in (1, 8, 9, 16, 17, 32)] == \
        [8, 8, 16, 16, 32, 32]
    with pytest.raises(ValueError, match="longer than the largest bucket 32"):
        generation.bucket_for(33, (8, 16, 32))


def test_cache_length_is_fixed_for_static_strategies_only():
    assert generation.cache_length("naive", (5,), 16, (8,)) is None
    assert generation.cache_length("dynamic_cache", (5,), 16, (8,)) is None
    assert generation.cache_length("static_cache", (5, 9), 16, (8, 16, 32)) == 9 + 16
    assert generation.cache_length("bucketed", (5,), 16, (8, 16, 32)) == 32 + 16
    assert generation.cache_length("static_cache", (5,), 16, (8,), cache_len=64) == 64


def test_programs_counted_by_hand():
    # naive, prompt 5, 4 tokens: lengths 5, 6, 7, 8; dynamic: prefill 5, caches 6, 7, 8
    assert generation.programs("naive", (5,), 4, (8,)) == 4
    assert generation.programs("dynamic_cache", (5,), 4, (8,)) == 1 + 3
    assert generation.programs("static_cache", (5, 9, 17), 4, (8, 16, 32)) == 3 + 1
    assert generation.programs("bucketed", (5, 6, 7), 4, (8, 16, 32)) == 1 + 1


def test_summary_of_hand_made_tokens():
    rows = [dict(request=0, token=i, phase="prefill" if i == 0 else "decode", wall_ms=ms,
                 compiles=c, cached=1 - c, compile_ms=100.0 * c, cache_bytes=b)
            for i, (ms, c, b) in enumerate([(500.0, 1, 10), (300.0, 1, 10), (4.0, 0, 10),
                                            (6.0, 0, 10), (5.0, 0, 10)])]
    got = generation.summarize_run(pd.DataFrame(rows), batch_size=2)
    assert got["ttft_ms"] == 500.0
    assert got["steady_ms_per_token"] == 5.0  # median of tokens 2-4: 4, 6, 5
    assert got["tokens_per_s"] == pytest.approx(2 * 1000 / 5.0)
    assert (got["compiles_total"], got["compiles_steady"], got["cache_hits"]) == (2, 0, 3)
    assert got["new_tokens"] == 5 and got["cache_bytes"] == 10


def test_explain_names_the_shape_that_changed():
    earlier = [{"phase": "prefill", "shapes": {"input_ids": [1, 5], "cache": [0]}},
               {"phase": "decode", "shapes": {"input_ids": [1, 1], "cache": [1, 4, 5, 32]}}]
    text = generation.explain("dynamic_cache", "decode",
                              {"input_ids": [1, 1], "cache": [1, 4, 6, 32]}, earlier)
    assert "cache (1, 4, 5, 32) -> (1, 4, 6, 32)" in text and "grew" in text
    assert "input_ids" not in text
    assert generation.explain("naive", "prefill", {"input_ids": [1, 5]}, []).startswith("first")


# -- bad input: a clear error before any worker starts ---------------------------------------------


class NoWorkers(WorkerPool):
    def worker(self, config):  # noqa: D102
        raise AssertionError("a worker was asked for")

    def start(self, config):  # noqa: D102
        raise AssertionError("a worker was started")


@pytest.mark.parametrize("fields, message", [
    (dict(decode="beam"), "unknown decode strategy 'beam'; valid: naive, dynamic_cache"),
    (dict(decode="bucketed", prompts=(40,)), "longer than the largest bucket 32"),
    (dict(decode="static_cache", cache_len=12), "needs 21 cache positions but cache_len=12"),
    (dict(model="mingpt", new_tokens=16), "covers block_size=11"),
    (dict(model="hf:llama", new_tokens=100), "covers max_position_embeddings=64"),
    (dict(model="resnet"), "needs a sequence model"),
    (dict(mode="dynamo"), "mode 'dynamo' is not offered for generation"),
    (dict(new_tokens=0), "new_tokens must be an int from 1"),
    (dict(prompts=()), "prompts must be a non-empty tuple"),
])
def test_bad_input_fails_before_any_worker(fields, message, results):
    spec = GenerationSpec(**fields)
    with pytest.raises(wb.SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        wb.generate(spec, pool=NoWorkers())
    with pytest.raises(wb.SpecError):
        generate_many([spec], fresh=False, pool=NoWorkers())


def test_with_positions_raises_one_option_for_every_strategy():
    naive = with_positions(GenerationSpec(model="mingpt", decode="naive", new_tokens=16))
    bucketed = with_positions(GenerationSpec(model="mingpt", decode="bucketed", new_tokens=16))
    assert naive.options == bucketed.options == {"block_size": 32}  # largest bucket, same model
    assert with_positions(GenerationSpec(model="hf:llama")).options == {}  # 64 positions fit


def test_cli_bad_input_is_an_error_naming_it(tmp_path, capsys):
    from tpu_workbench.cli import main

    assert main(["generate", "--strategies", "beam", "--out", str(tmp_path)]) == 2
    assert "unknown decode strategy 'beam'" in capsys.readouterr().err


# -- measured: one warm pool, programs that never coincide across specs ---------------------------

# (spec fields) for minGPT and hf:llama on XLA lazy (bucketed with its HLO captured) and on plain
# PyTorch; minGPT's static cache also under torch_xla.compile. Every spec's programs have shapes
# no other spec's have (a sequence length, a cache length), so a shared warm worker counts each
# spec's compilations as a fresh one would.
MINGPT = {
    "naive": dict(decode="naive", new_tokens=3),
    "static8": dict(decode="static_cache", new_tokens=8),
    "static16": dict(decode="static_cache", new_tokens=16),
    "bucketed": dict(decode="bucketed", new_tokens=2, prompts=(5, 9, 17), capture=("hlo",)),
}
HF = {"static": dict(decode="static_cache", new_tokens=4),
      "bucketed": dict(decode="bucketed", new_tokens=4)}
BASELINE_ONLY = {"naive": dict(decode="naive", new_tokens=4),  # the no-cache reference
                 "dynamic": dict(decode="dynamic_cache", new_tokens=4)}


def _specs(model: str, table: dict, mode: str) -> dict[str, GenerationSpec]:
    base = with_positions(GenerationSpec(model=model, new_tokens=16))  # one model for all
    return {k: GenerationSpec(model=model, mode=mode, options=base.options,
                              **{**f, "capture": f.get("capture", ()) if mode == "lazy" else ()})
            for k, f in table.items()}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    if not backends.have_torch_xla():
        pytest.skip("needs torch_xla")
    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path_factory.mktemp("results")))
    pool = WorkerPool(max_workers=3)  # lazy, lazy with HLO dumps, plain PyTorch
    runs = {}
    plan = [(model, mode, table) for model, table in (("mingpt", MINGPT), ("hf:llama", HF))
            for mode in ("lazy", "torch_eager")]
    plan += [("hf:llama", "torch_eager", BASELINE_ONLY),
             ("mingpt", "compile", {"static": dict(decode="static_cache", new_tokens=5)})]
    try:
        for model, mode, table in plan:
            specs = _specs(model, table, mode)
            got = generate_many(list(specs.values()), fresh=False, pool=pool)
            assert not got.errors, got.errors
            runs.update({(model, mode, k): r for k, r in zip(specs, got.results, strict=True)})
    finally:
        pool.shutdown()
        mp.undo()
    return runs


def _tokens(result):
    return generation.token_frame(result.records)


@needs_xla
def test_naive_compiles_at_every_new_length(measured):
    t = _tokens(measured[("mingpt", "lazy", "naive")])
    assert list(t["seq_len"]) == [5, 6, 7]
    assert (t["compiles"] >= 1).all()  # each token's sequence is one longer: a new program


@needs_xla
def test_static_cache_compiles_the_same_whatever_the_token_count(measured):
    counts = [int(_tokens(measured[("mingpt", "lazy", k)])["compiles"].sum())
              for k in ("static8", "static16")]
    assert counts[0] == counts[1] <= 3  # a prefill and a decode program (torch_xla may add one)
    t16 = _tokens(measured[("mingpt", "lazy", "static16")])
    assert t16[t16["token"] >= 2]["compiles"].sum() == 0  # steady decode: cache hits only
    assert (t16[t16["token"] >= 2]["cached"] >= 1).all()
    hf = _tokens(measured[("hf:llama", "lazy", "static")])
    assert hf[hf["token"] >= 2]["compiles"].sum() == 0
    compiled = _tokens(measured[("mingpt", "compile", "static")])
    assert compiled[compiled["token"] >= 2]["compiles"].sum() == 0
    assert 2 <= compiled["compiles"].sum() <= 3


@needs_xla
def test_bucketed_compiles_one_prefill_per_bucket_and_one_decode(measured):
    result = measured[("mingpt", "lazy", "bucketed")]
    t = _tokens(result)
    # By hand: 5, 9, 17 land in buckets 8, 16, 32 (three prefill programs); the decode step
    # has one cache length (32 + 3) for all three requests: one decode program.
    assert int(t[t["phase"] == "prefill"]["compiles"].sum()) == 3
    assert int(t[t["phase"] == "decode"]["compiles"].sum()) == 1
    compiles = [r for r in result.records if r.get("kind") == "compile"]
    assert all(r["cause"] for r in compiles)  # torch_xla's own words (explain_compiles)
    assert any("input_ids (1, 8) -> (1, 16)" in r["explanation"] for r in compiles)
    texts = phase_hlo(result)
    assert set(texts) == {"prefill", "decode"}
    cache = "f32[1,4,34,32]"  # (batch, heads, largest bucket 32 + 2 new tokens, head dim)
    assert cache in texts["prefill"] and cache in texts["decode"]
    assert "s64[1,8]" in texts["prefill"] and "s64[1,8]" not in texts["decode"]


@needs_xla
@pytest.mark.parametrize("model, table", [("mingpt", MINGPT), ("hf:llama", HF)])
def test_every_strategy_gives_plain_pytorchs_greedy_tokens(measured, model, table):
    for key in table:  # XLA lazy vs plain PyTorch, same strategy: the same tokens and logits
        xla, torch = (_tokens(measured[(model, mode, key)]) for mode in ("lazy", "torch_eager"))
        assert xla["token_id"].tolist() == torch["token_id"].tolist(), key
        assert xla["top_logit"].tolist() == pytest.approx(torch["top_logit"].tolist(), abs=1e-4)
    ref = _tokens(measured[(model, "torch_eager", "naive")])  # no cache at all: the reference
    keys = [*table, *(BASELINE_ONLY if model == "hf:llama" else ())]
    for key in keys:  # each cache strategy vs naive, on the first request (the same prompt)
        got = _tokens(measured[(model, "torch_eager", key)])
        got = got[got["request"] == 0]
        n = min(len(got), len(ref))
        assert got["token_id"][:n].tolist() == ref["token_id"][:n].tolist(), key
        assert got["top_logit"][:n].tolist() == pytest.approx(ref["top_logit"][:n].tolist(),
                                                              abs=1e-4), key


def test_cli_writes_tables_and_charts(tmp_path, results, capsys):
    from tpu_workbench.cli import main

    out = tmp_path / "gen"
    assert main(["generate", "--model", "mingpt", "--modes", "torch_eager", "--tokens", "3",
                 "--out", str(out)]) == 0
    tokens = pd.read_csv(out / "tokens.csv")
    assert len(tokens) == 4 * 3  # four strategies, three tokens each
    assert set(tokens["strategy"]) == set(generation.STRATEGIES)
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns) == generation.SUMMARY_COLUMNS and len(summary) == 4
    assert pd.read_csv(out / "outputs.csv")["same_as_pytorch"].all()
    for name in ("ms_per_token", "compiles_per_token", "ttft_vs_steady", "compiles_by_phase"):
        assert (out / f"{name}.html").is_file() and (out / f"{name}.png").stat().st_size > 1000
    assert "identical across strategies and modes" in capsys.readouterr().out


def test_cli_decodes_with_trained_weights(tmp_path, results, capsys):
    from tpu_workbench.cli import main

    out = tmp_path / "gen"
    assert main(["generate", "--model", "mingpt", "--modes", "torch_eager", "--strategies",
                 "naive,static_cache", "--prompts", "6,8", "--tokens", "4", "--train-steps",
                 "20", "--out", str(out)]) == 0
    outputs = pd.read_csv(out / "outputs.csv", dtype={"expected": str, "output": str})
    assert set(outputs["weights"]) == {"trained"} and outputs["same_as_pytorch"].all()
    assert set(outputs["reference"]) == {"torch_eager naive"}
    assert outputs["expected"].str.split().map(len).tolist() == [4, 4, 4, 4]
    printed = capsys.readouterr()
    assert "the task's answer:" in printed.out and "weights: " in printed.err


@pytest.mark.parametrize("length", [None, 16])  # growing, and preallocated at 16 positions
def test_mingpt_kv_cache_gives_the_full_forwards_logits(length):
    import torch

    from tpu_workbench.models.mingpt import GPT, GPTConfig, kv_cache

    cfg = GPTConfig(block_size=16)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    seq = torch.randint(3, (2, 9))
    with torch.no_grad():
        full = model(seq)  # no cache: every position at once, the causal mask
        cache = kv_cache(cfg, 2, length)
        steps = [model(seq[:, :5], cache, torch.arange(5))]  # prefill, then one at a time
        steps += [model(seq[:, t:t + 1], cache, torch.tensor([t])) for t in range(5, 9)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
    assert cache[0].k.shape[2] == (length or 9)


# -- the model's dtype: a bf16 Transformers model gets a bf16 static cache -------------------------
class _Context:
    def __init__(self):
        self.records, self.out_dir = [], None

    def emit(self, record):
        self.records.append(record)

    def check_cancel(self):
        pass


def test_a_bf16_models_static_cache_is_bf16_at_half_the_bytes():
    """hf:llama tiny built with ``options={"dtype": "bfloat16"}`` (a field of Transformers'
    config, which ``from_config`` builds the weights in): the StaticCache the worker's HFLM makes
    holds bf16 keys and values, and its bytes are the hand count at 2 bytes a value, half of the
    float32 model's."""
    import torch

    from tpu_workbench import models
    from tpu_workbench.worker.generate import HFLM

    family = models.get_model("hf:llama")
    batch, length = 2, 16
    # 2 layers x (K, V) x batch x 4 KV heads x length x head_dim 16 (hidden 128 / 8 heads)
    values = 2 * 2 * batch * 4 * length * 16
    for dtype, size in ((torch.bfloat16, 2), (torch.float32, 4)):
        cfg = family.config("tiny", dtype=str(dtype).removeprefix("torch."))
        lm = HFLM(family.build(cfg), cfg, torch.device("cpu"))
        cache = lm.new_cache(length, batch)
        assert {t.dtype for layer in cache.layers for t in (layer.keys, layer.values)} == {dtype}
        assert lm.cache_bytes(cache) == values * size


def test_a_bf16_model_decodes_with_its_static_cache_as_without_one():
    """The worker's generate() in plain PyTorch, bf16 hf:llama: the static cache's greedy tokens
    equal naive decoding's (the whole sequence each token, no cache); its records report the
    bf16 cache's bytes (a float32 cache could not even take bf16 keys: index_copy_ refuses)."""
    from tpu_workbench.worker.generate import generate
    from tpu_workbench.worker.pytorch import TorchBackend

    base = with_positions(GenerationSpec(model="hf:llama", new_tokens=4))
    options = {**base.options, "dtype": "bfloat16"}
    tokens, cache_bytes = {}, {}
    for decode in ("naive", "static_cache"):
        spec = GenerationSpec(model="hf:llama", mode="torch_eager", decode=decode, new_tokens=4,
                              options=options)
        ctx = _Context()
        tokens[decode] = generate(ctx, spec.to_dict(), TorchBackend())["tokens"]
        cache_bytes[decode] = {r["cache_bytes"] for r in ctx.records if r["kind"] == "token"}
    assert tokens["static_cache"] == tokens["naive"]
    # layers x (K, V) x batch 1 x KV heads x (prompt 5 + 4 new tokens) x head_dim x 2 bytes
    assert cache_bytes["static_cache"] == {2 * 2 * 1 * 4 * 9 * 16 * 2}
    assert cache_bytes["naive"] == {0}


# -- the task's prompts and answers, program shapes, the continuations table --------------------


def test_task_prompts_begin_the_sorted_answer_that_task_answer_completes():
    import torch

    from tpu_workbench.models import get_model

    for name in ("mingpt", "hf:llama"):  # the Hugging Face families share minGPT's task
        family = get_model(name)
        cfg = family.config("tiny")
        rows = family.task_prompts(cfg, 8, 3, torch.Generator().manual_seed(1)).tolist()
        assert len(rows) == 3 and {len(r) for r in rows} == {8}
        for row in rows:
            assert row[6:] == sorted(row[:6])[:2]  # six digits, then two of their sorted half
            assert family.task_answer(cfg, row) == sorted(row[:6])[2:]
    family, cfg = get_model("mingpt"), get_model("mingpt").config("tiny")
    assert family.task_answer(cfg, [2, 0, 1, 1, 0, 2, 0, 0]) == [1, 1, 2, 2]  # by hand
    assert family.task_answer(cfg, [2, 0, 1, 1, 0, 2, 1]) is None  # 1 does not start 0 0 1 1 2 2
    assert family.task_answer(cfg, [2, 0, 1]) is None  # fewer digits than the task sorts
    assert family.task_answer(cfg, [2, 0, 1, 1, 0, 7]) is None  # 7 is no digit of the task


def test_a_static_cache_and_a_bucket_of_its_prompts_length_share_programs():
    # static_cache with prompts 6 and 8 and bucketed with a bucket of 8: both caches hold
    # 8 + 4 positions, so bucketed's prefill (8 tokens) and its decode step are static's own.
    static = generation.program_shapes("static_cache", (6, 8), 4, (8,))
    bucketed = generation.program_shapes("bucketed", (6,), 4, (8,))
    assert bucketed <= static and len(static) == 3
    assert not generation.program_shapes("bucketed", (6,), 4, (16,)) & static  # cache 20


@needs_xla
def test_a_run_whose_programs_its_modes_worker_compiled_gets_a_fresh_worker(monkeypatch):
    from tpu_workbench.generation import runs

    pools = {}

    def fake_generate(spec, pool=None, **kwargs):
        pools[spec.decode] = pool
        return types.SimpleNamespace(spec=spec)

    monkeypatch.setattr(runs, "generate", fake_generate)
    specs = [GenerationSpec(model="mingpt", mode="lazy", decode=d, prompts=p, new_tokens=4,
                            buckets=(8,))
             for d, p in (("static_cache", (6, 8)), ("bucketed", (6,)), ("naive", (6,)))]
    generate_many(specs)
    assert pools["bucketed"] is not pools["static_cache"]  # its programs were static's
    assert pools["naive"] is pools["bucketed"]  # naive's share nothing with bucketed's


def test_continuations_put_each_runs_tokens_beside_the_tasks_answer():
    outputs = pd.DataFrame([
        dict(mode="torch_eager", strategy="naive", request=0, prompt="2 0 1 1 0 2",
             output="0 0 1", expected="0 0 1", correct=True),
        dict(mode="lazy", strategy="static_cache", request=0, prompt="2 0 1 1 0 2",
             output="0 1 1", expected="0 0 1", correct=False),
        dict(mode="torch_eager", strategy="naive", request=1, prompt="1 1 1 1 1 1 1",
             output="1 1 1", expected="1 1 1", correct=True),
        dict(mode="lazy", strategy="static_cache", request=1, prompt="1 1 1 1 1 1 1",
             output="1 1 1", expected="1 1 1", correct=True),
    ])
    table = generation.continuations(outputs).set_index("run")
    assert table.loc["prompt"].tolist() == ["2 0 1 1 0 2", "1 1 1 1 1 1 1"]
    assert table.loc["the task's answer"].tolist() == ["0 0 1", "1 1 1"]
    assert table.loc["torch_eager naive"].tolist() == ["0 0 1 ✓", "1 1 1 ✓"]
    assert table.loc["lazy static_cache"].tolist() == ["0 1 1 ✗", "1 1 1 ✓"]
    assert table.loc["every run the same"].tolist() == ["NO", "yes"]
    note = generation.outputs_note(outputs.assign(weights="trained", same_as_pytorch=None,
                                                  reference=None))
    assert note.startswith("**3 of 4** continuations (2 runs x 2 requests) are the task's")
    assert "No plain-PyTorch run" in note


def test_timing_figures_are_quoted_to_three_significant_digits():
    assert [generation.significant(v) for v in (60.0703, 0.70412, 1615.3, 9.996, 0.0)] == \
        ["60.1", "0.704", "1,620", "10.0", "0"]
    summary = pd.DataFrame([dict(mode="lazy", measured_on="XLA:CPU", strategy="bucketed",
                                 ttft_ms=1234.5, steady_ms_per_token=1.7049,
                                 steady_ms_p10=1.651, steady_ms_p90=60.07, tokens_per_s=586.6,
                                 compiles_total=2, cache_bytes=26624)])
    row = generation.timing_table(summary).iloc[0]
    assert (row["first token ms"], row["steady ms: median (p10-p90)"],
            row["tokens/s (median)"], row["KV cache KB"]) == \
        ("1,230", "1.70 (1.65-60.1)", "587", "26.6")


def test_entry_inputs_are_the_entry_computations_parameters_in_order():
    text = """HloModule m

%add (p0.1: f32[], p1.2: f32[]) -> f32[] {
  %p0.1 = f32[] parameter(0)
  %p1.2 = f32[] parameter(1)
}

ENTRY %SyncTensorsGraph.9 (p0.3: f32[4,8], p1.4: s64[1,8], p2.5: s64[8]) -> (f32[4]) {
  %p1.4 = s64[1,8]{1,0} parameter(1)
  %p0.3 = f32[4,8]{1,0} parameter(0)
  %p2.5 = s64[8]{0} parameter(2)
}
"""
    assert generation.entry_inputs(text) == ["f32[4,8]", "s64[1,8]", "s64[8]"]
    decode = text.replace("s64[1,8]{1,0}", "s64[1,1]{1,0}").replace("s64[8]{0}", "s64[1]{0}")
    frame = generation.compare_inputs({"prefill": text, "decode": decode})
    assert frame[~frame["same"]]["input shape"].tolist() == ["s64[1,1]", "s64[1,8]", "s64[1]",
                                                            "s64[8]"]
    assert frame[frame["same"]]["input shape"].tolist() == ["f32[4,8]"]


# -- trained weights: checked before any worker, decoded like plain PyTorch's full recompute ------


def _fake_run(folder, **spec):
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"")
    (folder / "spec.json").write_text(json.dumps({"model": "mingpt", "preset": "tiny",
                                                  "options": {}, **spec}))
    return str(folder)


@pytest.mark.parametrize("make, fields, message", [
    (lambda t: str(t / "nowhere"), {}, "is not the folder of a training run with a checkpoint"),
    (lambda t: _fake_run(t / "run", options={"n_layer": 1}), {},
     "were trained for .*'n_layer': 1.* but this generation asks for"),
    (lambda t: _fake_run(t / "run"), dict(prompts=(8,), new_tokens=5),
     r"feed the model 12 positions .* covers block_size=11; generate at most 4 tokens \(the "
     "weights of .* were trained with block_size=11\\)"),
])
def test_bad_weights_fail_before_any_worker(tmp_path, make, fields, message, results):
    spec = GenerationSpec(model="mingpt", mode="torch_eager", weights=make(tmp_path), **fields)
    with pytest.raises(wb.SpecError, match=message):
        wb.generate(spec, pool=NoWorkers())
    assert with_positions(spec) == spec  # trained weights keep their position table


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """minGPT tiny trained on its task (a worker, plain PyTorch), and its prompts' greedy
    continuations by full recompute: the model fed the whole sequence for each new token,
    plain PyTorch, none of the worker's decode code."""
    import torch

    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path_factory.mktemp("results")))
    try:
        run = wb.trained_weights("mingpt", steps=150, reuse=False)
    finally:
        mp.undo()
    family, cfg, model = wb.load_trained(run)
    gen = torch.Generator().manual_seed(0)  # the worker's: GenerationSpec.seed
    prompts = [family.task_prompts(cfg, p, 1, gen) for p in TRAINED_PROMPTS]
    reference = []
    with torch.no_grad():
        for seq in prompts:
            for _ in range(TRAINED_TOKENS):
                seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
            reference.append(seq[0, -TRAINED_TOKENS:].tolist())
    return run, reference


TRAINED_PROMPTS, TRAINED_TOKENS = (6, 7, 8, 6), 4


def _decode_here(weights, decode, **fields):
    """The worker's generate() in this process, plain PyTorch: each request's tokens."""
    from tpu_workbench.worker.generate import generate
    from tpu_workbench.worker.pytorch import TorchBackend

    spec = GenerationSpec(model="mingpt", mode="torch_eager", decode=decode,
                          prompts=TRAINED_PROMPTS, new_tokens=TRAINED_TOKENS, buckets=(8,),
                          weights=weights, **fields).validate()
    summary = generate(_Context(), spec.to_dict(), TorchBackend())
    return [rows[0] for rows in summary["tokens"]], summary


def test_the_trained_models_tokens_are_its_full_recomputes_in_every_strategy(trained):
    run, reference = trained
    assert len({tuple(r) for r in reference}) > 1  # the continuation depends on the prompt
    assert any(len(set(r)) > 1 for r in reference)  # and is not one token over and over
    for decode in generation.STRATEGIES:
        tokens, summary = _decode_here(str(run.out_dir), decode)
        assert tokens == reference, decode
        assert summary["threads"] == 1  # plain PyTorch decodes on one intra-op thread
    # and the full recompute is the task's answer: the weights learned to sort
    family = get_model("mingpt")
    answers = [family.task_answer(family.config("tiny"), rows[0])
               for rows in summary["prompt_tokens"]]
    right = sum(a[:TRAINED_TOKENS] == r for a, r in zip(answers, reference, strict=True))
    assert right >= len(reference) - 1, (answers, reference)


def test_a_cache_written_at_the_wrong_position_changes_the_trained_models_tokens(
        trained, monkeypatch):
    """The check has teeth: decode positions one too early (each step overwrites the previous
    token's keys and reads the wrong position embedding) give other tokens than the full
    recompute, for the static cache."""
    import torch

    from tpu_workbench.worker import generate as worker

    run, reference = trained

    def one_early(start, length, device):
        start = max(start - 1, 0) if length == 1 else start  # the prefill stays right
        return torch.arange(start, start + length).to(device)

    monkeypatch.setattr(worker, "_positions", one_early)
    tokens, _ = _decode_here(str(run.out_dir), "static_cache")
    assert tokens != reference


@needs_xla
def test_the_trained_model_decodes_on_xla_as_in_plain_pytorch(trained, results):
    run, reference = trained
    specs = [GenerationSpec(model="mingpt", mode="lazy", decode=d, prompts=TRAINED_PROMPTS,
                            new_tokens=TRAINED_TOKENS, buckets=(8,), weights=str(run.out_dir))
             for d in ("static_cache", "bucketed")]
    got = generate_many(specs)
    assert not got.errors, got.errors
    for result in got.results:
        assert [rows[0] for rows in result.summary["tokens"]] == reference, result.spec.decode
    # bucketed shares static's programs here (cache 8 + 4, prompt 8 = bucket 8), so it ran in
    # a fresh worker and compiled its own: one prefill and one decode step
    bucketed = _tokens(got.results[1])
    assert int(bucketed["compiles"].sum()) == generation.programs(
        "bucketed", TRAINED_PROMPTS, TRAINED_TOKENS, (8,)) == 2
