"""Generation: decode strategies on XLA:CPU and plain PyTorch, their compile counts, the same
greedy tokens everywhere, buckets and summaries by hand, and bad input before any worker."""

from __future__ import annotations

import pandas as pd
import pytest

import tpu_workbench as wb
from tpu_workbench.environment import backends
from tpu_workbench.generation import analysis as generation
from tpu_workbench.generation.runs import generate_many, phase_hlo
from tpu_workbench.generation.spec import GenerationSpec, with_positions
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
