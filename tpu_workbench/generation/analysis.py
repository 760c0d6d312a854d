"""Generation, analysed: decode strategies, buckets, per-run summaries and why a token compiled.

Pure: plain values and DataFrames in (the ``token`` and ``compile`` records a ``generate`` run
streams, see :mod:`tpu_workbench.records`), values and DataFrames out. The worker's decode loops
are in :mod:`tpu_workbench.worker.generate`; what to run is a
:class:`~tpu_workbench.generation.spec.GenerationSpec`.

Why strategies matter on XLA: a program is compiled for fixed shapes. A decode loop whose
input grows by a token per step (``naive``) or whose cache grows (``dynamic_cache``) is a new
shape, so a new compilation, every token. A cache preallocated at a fixed length and written at
a position held in a tensor (``static_cache``) keeps every decode step one program; padding the
prompts to a few lengths (``bucketed``) bounds the prefill programs too, whatever the prompt.
"""

from __future__ import annotations

import math
import re
from typing import Any

STRATEGIES: dict[str, str] = {
    "naive": "re-run the whole growing sequence for every new token (no cache)",
    "dynamic_cache": "a KV cache that grows by one position per token (HF's DynamicCache)",
    "static_cache": "a KV cache preallocated at a fixed length, written at a position index "
                    "(HF's StaticCache)",
    "bucketed": "prompts padded to the next bucket length, then the static cache",
}
STATIC_STRATEGIES = ("static_cache", "bucketed")  # a preallocated cache of fixed length
DEFAULT_BUCKETS = (8, 16, 32)
PHASES = ("prefill", "decode")

# The ``token`` record's columns (one row per generated token), in this order.
TOKEN_COLUMNS = ["strategy", "request", "prompt_len", "token", "phase", "seq_len", "cache_len",
                 "wall_ms", "compiles", "cached", "compile_ms", "executions", "cache_bytes",
                 "token_id", "top_logit"]
# :func:`summarize`'s columns: one row per run.
SUMMARY_COLUMNS = ["model", "preset", "mode", "measured_on", "strategy", "batch_size", "new_tokens",
                   "requests", "ttft_ms", "steady_ms_per_token", "steady_ms_p10",
                   "steady_ms_p90", "steady_tokens", "tokens_per_s", "compiles_total",
                   "compiles_steady", "cache_hits", "compile_ms", "cache_bytes", "run_id"]


def bucket_for(length: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds a prompt of `length` tokens (ValueError if none does)."""
    fits = [b for b in sorted(buckets) if b >= length]
    if not fits:
        raise ValueError(f"a prompt of {length} tokens is longer than the largest bucket "
                         f"{max(buckets)} (buckets {', '.join(map(str, sorted(buckets)))})")
    return fits[0]


def cache_length(strategy: str, prompts: tuple[int, ...], new_tokens: int,
                 buckets: tuple[int, ...], cache_len: int | None = None) -> int | None:
    """Positions a strategy's cache holds: None for ``naive`` (no cache) and ``dynamic_cache``
    (it grows); for the static strategies `cache_len` if given, else the longest prompt (or the
    largest bucket) plus the new tokens, so every request of the run fits one cache shape."""
    if strategy not in STATIC_STRATEGIES:
        return None
    if cache_len is not None:
        return cache_len
    longest = max(buckets) if strategy == "bucketed" else max(prompts)
    return longest + new_tokens


def program_shapes(strategy: str, prompts: tuple[int, ...], new_tokens: int,
                   buckets: tuple[int, ...], cache_len: int | None = None) -> set[tuple]:
    """The distinct programs (shapes) the strategy's decode loop asks XLA for, worked out from
    the shapes each step feeds the model: ``(code path, phase, tokens fed, cache positions)``.
    Two runs of one model and batch size whose sets share a member share that program (a warm
    worker would serve it from its cache).

    naive: the whole sequence, one length per token, no cache; dynamic_cache: a prefill per
    prompt length, then one token against a cache that holds one position more each step;
    static_cache: a prefill per prompt length and one decode step, against the cache of one
    length; bucketed: a prefill per bucket used and the same one decode step."""
    if strategy == "naive":
        return {("no cache", "step", p + i, 0) for p in prompts for i in range(new_tokens)}
    if strategy == "dynamic_cache":
        return ({("growing cache", "prefill", p, 0) for p in prompts}
                | {("growing cache", "decode", 1, p + i - 1) for p in prompts
                   for i in range(1, new_tokens)})
    length = cache_length(strategy, prompts, new_tokens, buckets, cache_len)
    fed = prompts if strategy == "static_cache" else [bucket_for(p, buckets) for p in prompts]
    decode = {("static cache", "decode", 1, length)} if new_tokens > 1 else set()
    return {("static cache", "prefill", p, length) for p in fed} | decode


def programs(strategy: str, prompts: tuple[int, ...], new_tokens: int,
             buckets: tuple[int, ...], cache_len: int | None = None) -> int:
    """How many distinct programs the strategy's decode loop compiles on a fresh worker,
    counted by hand (:func:`program_shapes`): naive one per sequence length fed in;
    dynamic_cache one prefill per prompt length and one decode per cache length;
    static_cache one prefill per prompt length and one decode; bucketed one prefill per bucket
    used and one decode."""
    return len(program_shapes(strategy, prompts, new_tokens, buckets, cache_len))


def explain(strategy: str, phase: str, shapes: dict[str, list[int]],
            earlier: list[dict[str, list[int]]]) -> str:
    """Why a token's step compiled, in words: which input's shape is new and which length, from
    the `shapes` it fed the model and the `earlier` steps' shapes of the same run."""
    seen = [e for e in earlier if e.get("phase") == phase]
    same = [e for e in seen if e.get("shapes") == shapes]
    text = ", ".join(f"{name} {tuple(shape)}" for name, shape in shapes.items())
    if same:
        return (f"{phase} with shapes seen before ({text}): the program differs in something "
                "other than shape (a first use of a cache written in place, a new live tensor)")
    if not seen:
        return f"first {phase} program of this run ({text})"
    last = seen[-1]["shapes"]
    changed = [f"{name} {tuple(last[name])} -> {tuple(s)}" for name, s in shapes.items()
               if last.get(name) != s]
    why = {"naive": "the whole sequence is fed again, one token longer",
           "dynamic_cache": "the cache grew by one position",
           "static_cache": "a prompt of a new length",
           "bucketed": "a prompt in a new bucket"}[strategy]
    return f"new {phase} shape: {'; '.join(changed) or text} ({why})"


def token_frame(records: list[dict[str, Any]]):
    """The ``token`` records as a DataFrame with :data:`TOKEN_COLUMNS` (plus any labels)."""
    import pandas as pd

    rows = [r for r in records if r.get("kind") == "token"]
    frame = pd.DataFrame(rows, columns=None if rows else TOKEN_COLUMNS)
    return frame.drop(columns=["kind"], errors="ignore")


def steady_tokens(frame):
    """The rows of a run's steady decode: decode tokens after each request's first decode step
    (which pays the decode compilation of a cache strategy); all decode tokens if that is
    none."""
    decode = frame[frame["phase"] == "decode"]
    later = decode[decode["token"] >= 2]
    return later if len(later) else decode


def summarize_run(frame, batch_size: int) -> dict[str, Any]:
    """One run's figures from its token rows: time to first token (the first request's
    prefill, compile included), steady ms per token (median, with the 10th and 90th
    percentiles and how many tokens they are of: a busy host shows as a wide spread),
    tokens/s over the batch at the median, compilations in all and in the steady decode,
    cache hits, compile ms, the cache's bytes."""
    if not len(frame):
        return {}
    steady = steady_tokens(frame)
    first = frame[(frame["request"] == frame["request"].min()) & (frame["token"] == 0)]
    ms = float(steady["wall_ms"].median()) if len(steady) else math.nan
    spread = steady["wall_ms"].quantile([0.1, 0.9]).tolist() if len(steady) else [math.nan] * 2
    return {
        "batch_size": batch_size, "new_tokens": int(frame["token"].max()) + 1,
        "requests": int(frame["request"].nunique()),
        "ttft_ms": float(first["wall_ms"].iloc[0]) if len(first) else math.nan,
        "steady_ms_per_token": ms, "steady_ms_p10": float(spread[0]),
        "steady_ms_p90": float(spread[1]), "steady_tokens": len(steady),
        "tokens_per_s": batch_size * 1e3 / ms if ms and ms == ms else math.nan,
        "compiles_total": int(frame["compiles"].sum()),
        "compiles_steady": int(steady["compiles"].sum()),
        "cache_hits": int(frame["cached"].sum()), "compile_ms": float(frame["compile_ms"].sum()),
        "cache_bytes": int(frame["cache_bytes"].max()),
    }


def compiles_by_phase(tokens):
    """Compilations per run and phase (prefill / decode): where the compiles go."""
    keys = ["model", "mode", "measured_on", "strategy", "phase"]
    keys = [k for k in keys if k in tokens.columns]
    return tokens.groupby(keys, as_index=False)[["compiles", "compile_ms"]].sum()


def continuations(outputs):
    """The greedy continuations of :attr:`GenerationComparison.outputs` side by side: a column
    per request, whose first rows are its prompt and what the task says follows, then a row
    per run (``mode strategy``) holding its tokens, marked ✓ where they are the task's answer
    and ✗ where they are not, and a last row saying whether every run wrote the same."""
    import pandas as pd

    if not len(outputs):
        return pd.DataFrame(columns=["run"])
    marks = {True: " ✓", False: " ✗"}
    requests = sorted(outputs["request"].unique())
    first = outputs.drop_duplicates("request").set_index("request")
    rows = [{"run": "prompt", **{f"request {r}": first.at[r, "prompt"] for r in requests}},
            {"run": "the task's answer",
             **{f"request {r}": first.at[r, "expected"] or "(none)" for r in requests}}]
    for (mode, strategy), run in outputs.groupby(["mode", "strategy"], sort=False):
        run = run.set_index("request")
        rows.append({"run": f"{mode} {strategy}",
                     **{f"request {r}": run.at[r, "output"] + marks.get(run.at[r, "correct"], "")
                        for r in requests if r in run.index}})
    agree = outputs.groupby("request")["output"].nunique().eq(1)
    rows.append({"run": "every run the same",
                 **{f"request {r}": "yes" if agree[r] else "NO" for r in requests}})
    return pd.DataFrame(rows)


def outputs_note(outputs) -> str:
    """Markdown: how many continuations of :attr:`GenerationComparison.outputs` are the task's
    answer and how many equal plain PyTorch's reference, as numbers."""
    checked, same = outputs["correct"].dropna(), outputs["same_as_pytorch"].dropna()
    runs = len(outputs[["mode", "strategy"]].drop_duplicates())
    trained = bool((outputs["weights"] == "trained").all())
    text = (f"**{int(checked.sum())} of {len(checked)}** continuations ({runs} runs x "
            f"{outputs['request'].nunique()} requests) are the task's answer"
            + ("." if trained else ": random weights, so this says nothing about the caches."))
    if len(same):
        refs = ", ".join(sorted(set(outputs["reference"].dropna())))
        text += (f" **{int(same.sum())} of {len(same)}** equal plain PyTorch's full recompute "
                 f"({refs}: the whole sequence fed again for each token, no cache), in every "
                 "batch row.")
    else:
        text += " No plain-PyTorch run to compare with: add `torch_eager` to the modes."
    return text


def significant(value: float, digits: int = 3) -> str:
    """`value` as text to `digits` significant digits, never in exponent form (60.0703 ->
    "60.1", 0.70412 -> "0.704", 1615.3 -> "1,620", 9.996 -> "10.0"): a measured time quoted
    with no more precision than a shared machine's timing has. NaN is ""."""
    if value != value:
        return ""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    places = digits - 1 - math.floor(math.log10(abs(value)))
    value = round(value, places)  # 9.996 rounds up to 10.0: one place fewer then
    places = digits - 1 - math.floor(math.log10(abs(value)))
    return f"{round(value, places):,.{max(places, 0)}f}"


def timing_table(summary):
    """The per-run figures a reader compares, from :attr:`GenerationComparison.summary`: the
    run, first-token ms, steady ms (median and p10-p90), tokens/s, compilations and the KV
    cache's KB, floats as text to three significant digits (:func:`measured_where` says where
    they were measured)."""
    import pandas as pd

    sig = significant
    rows = [{"run": f"{r.mode} {r.strategy}", "first token ms": sig(r.ttft_ms),
             "steady ms: median (p10-p90)": f"{sig(r.steady_ms_per_token)} "
                                            f"({sig(r.steady_ms_p10)}-{sig(r.steady_ms_p90)})",
             "tokens/s (median)": sig(r.tokens_per_s), "compilations": int(r.compiles_total),
             "KV cache KB": sig(r.cache_bytes / 1e3) if r.cache_bytes else "0"}
            for r in summary.itertuples()]
    return pd.DataFrame(rows)


def measured_where(summary) -> str:
    """Where each mode of a summary (or tokens) frame was measured, in words:
    ``torch_eager on plain PyTorch, CPU, 1 thread; lazy on XLA:CPU``."""
    pairs = dict(zip(summary["mode"], summary["measured_on"], strict=True))
    return "; ".join(f"{mode} on {where}" for mode, where in pairs.items())


def compiling(frame):
    """The rows of `frame` (tokens or summary) from modes that compile: all but plain
    PyTorch's ``torch_eager``, whose every compile count is 0."""
    return frame[frame["mode"] != "torch_eager"]


def text_of(token_ids: list[int]) -> str:
    """Generated token ids as text (the tiny models' vocab is digits): ``"0 1 1 2"``."""
    return " ".join(str(t) for t in token_ids)


def entry_computation(hlo_text: str) -> str:
    """The ENTRY computation of an HLO module's text (the program XLA runs; the small
    computations before it are reducers and combiners it calls), or the whole text if none."""
    lines = hlo_text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("ENTRY")), None)
    if start is None:
        return hlo_text
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("}")),
               len(lines) - 1)
    return "\n".join(lines[start:end + 1])


_PARAMETER = re.compile(r"=\s*(\S+?)(?:\{[^}]*\})?\s+parameter\((\d+)\)")


def entry_inputs(hlo_text: str) -> list[str]:
    """The shapes of the ENTRY computation's parameters (what the program is fed: weights,
    caches, token ids, positions), in parameter order: ``["f32[384]", "s64[1,8]", ...]``."""
    found = [(int(m.group(2)), m.group(1))
             for m in _PARAMETER.finditer(entry_computation(hlo_text))]
    return [shape for _, shape in sorted(found)]


def compare_inputs(texts: dict[str, str]):
    """How many inputs of each shape each program (name -> HLO text) takes, a row per shape,
    the shapes whose counts differ first (``same`` False): what the programs differ in."""
    import pandas as pd

    counts = {name: pd.Series(entry_inputs(text)).value_counts() for name, text in texts.items()}
    frame = pd.DataFrame(counts).fillna(0).astype(int).rename_axis("input shape").reset_index()
    frame["same"] = frame[list(texts)].nunique(axis=1).eq(1)
    return frame.sort_values(["same", "input shape"], kind="stable").reset_index(drop=True)
