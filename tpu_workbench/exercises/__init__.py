"""Workshop exercises' judges: pure functions, one module per notebook, never shown on the page."""

from __future__ import annotations

import math


def typed_number(answer: object, suffix: str = "") -> float | None:
    """`answer` as a reader typed a number: spaces, thousands commas and a trailing `suffix` (in
    any case: ``"13x"``, ``"480 KiB"``) allowed; None when it is not a finite number."""
    text = str(answer if answer is not None else "").strip().replace(",", "")
    if suffix and text.lower().endswith(suffix.lower()):
        text = text[: -len(suffix)].strip()
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
