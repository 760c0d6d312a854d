"""The pallas_kernels notebook's exercise: how much VMEM one grid step of the attention kernel
needs for a block choice the page's controls cannot show (head_dim 256), worked out from the
tiling rules the page states: tiles padded to whole 128-lane rows, Q/K/V/O double-buffered,
three float32 scratch buffers of which m and l are 128 lanes wide."""

from __future__ import annotations

from . import typed_number

# Gemma 2's head_dim, in bfloat16: the page fixes head_dim at 32, so no control prints this.
QUESTION = {"block_q": 64, "block_k": 256, "head_dim": 256, "dtype": "bfloat16"}
KIB = 1024


def vmem_facts(block_q: int = QUESTION["block_q"], block_k: int = QUESTION["block_k"],
               head_dim: int = QUESTION["head_dim"], dtype: str = QUESTION["dtype"]) -> dict:
    """The kernel's own VMEM accounting of one grid step (:func:`kernels.tiling.
    attention_vmem_table`) as plain data for :func:`judge_vmem`: ``buffers`` (one dict per
    buffer: buffer, rows, width, lanes, dtype, copies, bytes, value_bytes) and ``total``."""
    from kernels import tiling

    table = tiling.attention_vmem_table(block_q, block_k, head_dim, dtype)
    buffers = [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
               for row in table.to_dict("records")]
    return {"question": {"block_q": block_q, "block_k": block_k, "head_dim": head_dim,
                         "dtype": dtype},
            "buffers": buffers, "total": sum(b["bytes"] for b in buffers)}


def _kib(n: float) -> str:
    return f"{n / KIB:,.0f} KiB" if n % KIB == 0 else f"{n / KIB:,.1f} KiB"


def _worked(facts: dict) -> str:
    lines = []
    for b in facts["buffers"]:
        size = 4 if b["dtype"] == "float32" else 2
        copies = f"{b['copies']} x " if b["copies"] > 1 else ""
        padded = (f" (width {b['width']} padded to {b['lanes']} lanes)"
                  if b["lanes"] != b["width"] else "")
        lines.append(f"- {b['buffer']}: {copies}{b['rows']} x {b['lanes']} x {size} B"
                     f"{padded} = {_kib(b['bytes'])}")
    return "\n".join(lines) + f"\n\nTotal: **{_kib(facts['total'])}**."


def _mistakes(facts: dict) -> dict[str, float]:
    """Totals a reader gets by skipping one rule, each with what it skipped."""
    buffers = facts["buffers"]
    tiles = [b for b in buffers if b["copies"] > 1]
    head = next(b["lanes"] for b in buffers if b["buffer"] == "acc")
    found = {
        "counted each Q/K/V/O tile once, but the pipeline double-buffers them (one block "
        "computed on while the next one is copied in)":
            sum(b["bytes"] / b["copies"] for b in buffers),
        "left out the three float32 scratch buffers (m, l and acc)":
            sum(b["bytes"] for b in tiles),
        "counted the tiles at their width, but VMEM stores whole 128-lane rows":
            sum(b["value_bytes"] for b in buffers),
        "made m and l as wide as the head; they are 128 lanes wide whatever the head_dim":
            sum(b["bytes"] for b in buffers if b["buffer"] not in ("m", "l"))
            + sum(b["rows"] * head * 4 for b in buffers if b["buffer"] in ("m", "l")),
    }
    return {why: total for why, total in found.items() if total != facts["total"]}


def judge_vmem(answer: str | None, facts: dict) -> tuple[str, str]:
    """``(callout kind, markdown)`` for `answer` (KiB, as typed) against `facts`
    (:func:`vmem_facts`). Pure: it starts nothing and imports nothing."""
    q = facts["question"]
    text = str(answer if answer is not None else "").strip()
    said = typed_number(text, "KiB")
    if said is None:
        return "warn", (f"{text!r} is not a number: enter the KiB one grid step needs, such as "
                        "`480` (a number, optionally followed by KiB).")
    if not 0 < said <= 1024 * 1024:
        return "warn", (f"{said:g} KiB is out of range: a grid step holds more than 0 and "
                        "less than 1 GiB (a TPU core's VMEM is far smaller); enter KiB.")
    total = facts["total"]
    worked = _worked(facts)
    if abs(said * KIB - total) <= KIB / 2:
        return "success", (f"**Right: {_kib(total)}.** The buffers of one grid step with "
                           f"block_q={q['block_q']}, block_k={q['block_k']}, "
                           f"head_dim={q['head_dim']} in {q['dtype']}:\n\n{worked}")
    hint = next((why for why, wrong in _mistakes(facts).items()
                 if abs(said * KIB - wrong) <= KIB / 2), None)
    return "warn", (f"You said {said:g} KiB; not quite. "
                    + (f"That is the total if one {hint}." if hint else
                       "Go through the VMEM table above buffer by buffer: which of its "
                       "columns change when head_dim grows from 32 to "
                       f"{q['head_dim']} and the dtype is {q['dtype']}?")
                    + " Try again.")
