"""The scale-out exercise: how many processes each runtime starts on a multi-host slice, read
from the launch plans the workbench writes (one SPMD process per host, or one per chip)."""

from __future__ import annotations

import re


def processes(slice_name: str, runtime: str) -> int:
    """Python processes that run the step across `slice_name` under `runtime`, counted from
    the launch plan's per-host programs (``torchrun --nproc_per_node N`` starts N)."""
    from ..scale.launch import launch_plan

    plan = launch_plan(slice_name, runtime, "gcloud")
    total = 0
    for host in plan.host_plans:
        args = " ".join(host.argv)
        match = re.search(r"--nproc[_-]per[_-]node[= ](\d+)", args)
        total += int(match.group(1)) if match else 1
    return total


def judge(answer: str | None, slice_name: str) -> tuple[str, str]:
    """(callout kind, markdown) for "A, B" (torch_xla's processes, then TorchTPU's)."""
    numbers = [int(n) for n in re.findall(r"\d+", str(answer or ""))]
    if len(numbers) != 2:
        return "warn", "Enter two whole numbers, torch_xla's first: e.g. `2, 16`."
    xla, tpu = processes(slice_name, "torch_xla"), processes(slice_name, "torch_tpu")
    said_xla, said_tpu = numbers
    if (said_xla, said_tpu) == (xla, tpu):
        return "success", (f"**Right**: {xla} and {tpu}. torch_xla's one process per host "
                           "drives all of its chips (SPMD); TorchTPU's ranks are one per chip, "
                           "and DTensor shards over them.")
    if (said_tpu, said_xla) == (xla, tpu):
        return "warn", "The two numbers are swapped: torch_xla first."
    hint = ("torch_xla runs one SPMD process per **host**" if said_xla != xla
            else "TorchTPU runs one process per **chip**")
    return "warn", f"Not quite: {hint}."
