"""The port_your_model notebook's exercise: rewrite a boolean-mask max (``h[h > 0.5].max()``:
a reduction over a selection whose shape depends on the data) as an expression of the same value
with a static shape, the masked form XLA compiles once. ``port`` itself rewrites the mask's sum
and mean (its fix for ``port_masks.py``); the max is left to the reader. Judged by value on
random tensors and by the ops ``make_fx`` traces from it: none may be data-dependent."""

from __future__ import annotations

import ast

BLOCKED = "h[h > 0.5].max()"
DATA_DEPENDENT = ("nonzero", "masked_select", "unique", "argwhere", "_unique")


def judge_masked(answer: str | None) -> tuple[str, str]:
    """``(callout kind, markdown)`` for `answer`, a Python expression of ``h`` (and
    ``torch``). Evaluated on CPU tensors with no other names; imports torch, starts nothing."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    text = str(answer or "").strip()
    if not text:
        return "neutral", "Type an expression of `h` (and `torch`), then press **check**."
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        return "warn", f"That is not a Python expression ({exc.msg}); try `torch.where(...)`."
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - {"h", "torch"}
    if names:
        return "warn", (f"Only `h` and `torch` are defined here, not {', '.join(sorted(names))}.")
    code = compile(tree, "<answer>", "eval")

    def masked(h: torch.Tensor) -> torch.Tensor:
        # torch's C++ imports through the caller's builtins: only __import__ is kept (the
        # names check above already refused any other name than h and torch)
        return eval(code, {"__builtins__": {"__import__": __import__}, "torch": torch},  # noqa: S307
                    {"h": h})

    gen = torch.Generator().manual_seed(0)
    for shape in ((8, 16), (3, 5, 7)):
        h = torch.randn(*shape, generator=gen)
        try:
            got = masked(h)
        except Exception as exc:
            return "warn", f"It fails on a tensor of shape {shape}: {type(exc).__name__}: {exc}"
        want = h[h > 0.5].max()
        if not isinstance(got, torch.Tensor) or got.shape != want.shape \
                or not torch.allclose(got.float(), want, rtol=1e-5, atol=1e-6):
            return "warn", (f"Not the same value: on a random `h` of shape {shape} it gives "
                            f"{_show(got)}, the largest element above 0.5 is "
                            f"{float(want):.6f}.")
    graph = make_fx(masked)(torch.randn(8, 16, generator=gen)).graph
    calls = [n for n in graph.nodes if n.op == "call_function"]
    ops = sorted({str(n.target) for n in calls})
    dynamic = sorted({str(n.target) for n in calls if any(d in str(n.target) for d in
                                                          DATA_DEPENDENT) or _bool_index(n)})
    if dynamic:
        return "warn", (f"Same value, but its shape still depends on the data: it traces to "
                        f"`{'`, `'.join(dynamic)}`. Keep every element and put one that cannot "
                        "win (-inf) where the mask drops it.")
    return "success", ("**Right.** Same value, and every op has a shape known before the data: "
                       f"`{'`, `'.join(o.removeprefix('aten.') for o in ops)}`. XLA compiles it "
                       "once, whatever `h` holds.")


def _bool_index(node) -> bool:
    """An ``aten.index`` whose indices include a boolean mask (a nonzero underneath)."""
    import torch

    if "index" not in str(node.target) or len(node.args) < 2:
        return False
    indices = node.args[1] if isinstance(node.args[1], list | tuple) else [node.args[1]]
    return any(getattr(getattr(i, "meta", {}).get("val"), "dtype", None) == torch.bool
               for i in indices if i is not None)


def _show(value: object) -> str:
    try:
        return f"{float(value):.6f}"  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):
        return f"a {type(value).__name__}"
