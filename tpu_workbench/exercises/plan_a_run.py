"""The plan-a-run exercise: the training state per chip under fsdp, reasoned from the memory
convention the page states, before the fit table is read."""

from __future__ import annotations

import math

from ..sharding import fit


def state_gb(n_params: float, strategy: str, mesh: str) -> float:
    """GB of training state (weights, gradients, Adam) per chip: the one memory convention,
    :func:`tpu_workbench.sharding.fit.fits`, without activations."""
    return fit.fits(n_params, strategy, mesh)["per_device_bytes"] / 1e9


def judge(answer: float | None, n_params: float, mesh: str = "v6e-8") -> tuple[str, str]:
    """(callout kind, markdown) for an answer in GB per chip for fsdp on `mesh`: within 3%."""
    if answer is None or not math.isfinite(answer) or answer <= 0:
        return "warn", "Enter a positive number of GB (1 GB = 10^9 bytes)."
    want = state_gb(n_params, "fsdp", mesh)
    replicated = state_gb(n_params, "dp", mesh)
    usable = fit.fits(n_params, "dp", mesh)["usable_bytes"] / 1e9
    if abs(answer - want) <= 0.03 * want:
        return "success", (
            f"**Right**: {want:,.1f} GB per chip. Replicated (dp) the same state would be "
            f"{replicated:,.1f} GB a chip, {'within' if replicated <= usable else 'over'} the "
            f"{usable:,.1f} GB the convention lets a chip use: that is why large models shard "
            "their state.")
    if abs(answer - replicated) <= 0.03 * replicated:
        return "warn", ("That is the whole state, on one chip: fsdp splits it over every chip "
                        "of the slice.")
    if abs(answer * 4 - want) <= 0.03 * want or abs(answer * 2 - want) <= 0.03 * want:
        return "warn", ("Too little: count every part, 16 bytes a parameter (4 weights, 4 "
                        "gradients, 8 for Adam's two moments).")
    return "warn", ("Not quite: bytes per parameter times parameters, divided by the chips "
                    "fsdp splits over.")
