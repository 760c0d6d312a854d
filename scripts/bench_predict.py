#!/usr/bin/env python3
"""Predicted step times against published v6e training runs of Llama-3.1-8B.

    .venv/bin/python scripts/bench_predict.py [--slices v6e-8,v6e-16] [--out predict-bench]

Each row compiles the workbench's own step of Llama-3.1-8B's shape (hf:llama llama-3-8b: FSDP,
seq 8192, torch_xla's flash attention, every block rematerialised, mixed precision) for the
slice with libtpu, one and two blocks (a few minutes per slice on two cores, cached afterwards),
and compares the prediction with the published step time at the published global batch. It
prints the efficiency that would match each run exactly (compute at the chip's peak
otherwise), so the constant :data:`tpu_workbench.planning.predict.MXU_EFFICIENCY` can be
checked on the runs it was not fitted to.

Published figures (MaxText on JAX: AI-Hypercomputer/tpu-recipes,
training/trillium/Llama3.1-8B-MaxText/v6e-N/README.md @ac200eb; torchprime on torch_xla:
AI-Hypercomputer/torchprime torchprime/torch_xla_models/README.md @d0d7f36).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# MaxText's recipes for v6e-8, -16 and -32 run without collective matmuls (their config
# llama3_1_8b_8192_no_collective_matmul adds this libtpu flag, DISABLE_COLLECTIVE_MATMUL in
# MaxText's benchmarks/xla_flags_library.py); the others with the compiler's defaults.
NO_COLLECTIVE_MATMUL = ("--xla_jf_spmd_threshold_for_windowed_einsum_mib=1000000",)
PUBLISHED = [  # slice, global batch, seconds per step, libtpu flags, source
    ("v6e-8", 24, 3.443, NO_COLLECTIVE_MATMUL, "MaxText, tpu-recipes v6e-8 README"),
    ("v6e-16", 48, 3.393, NO_COLLECTIVE_MATMUL, "MaxText, tpu-recipes v6e-16 README"),
    ("v6e-32", 96, 3.495, NO_COLLECTIVE_MATMUL, "MaxText, tpu-recipes v6e-32 README"),
    ("v6e-64", 320, 5.652, (), "MaxText, tpu-recipes v6e-64 README (per-device batch 5)"),
    # Above 64 chips predict compiles the per-chip equivalent: v6e-64 at 4 sequences per chip.
    ("v6e-128", 512, 4.602, (), "MaxText, tpu-recipes v6e-128 README (per-device batch 4)"),
    ("v6e-256", 1024, 4.546, (), "MaxText, tpu-recipes v6e-256 README (per-device batch 4)"),
    ("v6e-256", 1024, 4.819, (), "torchprime torch_xla_models/README.md @d0d7f36"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", default="v6e-8,v6e-16,v6e-32,v6e-64,v6e-128,v6e-256")
    parser.add_argument("--out", type=Path, default=Path("predict-bench"))
    args = parser.parse_args()
    import pandas as pd

    from tpu_workbench.planning import predict as plan

    wanted = set(args.slices.split(","))
    rows = []
    for slice_name, batch, seconds, flags, source in PUBLISHED:
        if slice_name not in wanted:
            continue
        started = time.perf_counter()
        frame = plan.predict("hf:llama", "llama-3-8b", slices=[slice_name], strategies=["fsdp"],
                             seq_len=8192, batch_size=batch, recompute=True, attention="flash",
                             libtpu_flags=flags,
                             on_progress=lambda m: print(" ", m, file=sys.stderr, flush=True))
        r = frame.iloc[0]
        peak_compute = r["predicted_compute_ms"] * plan.MXU_EFFICIENCY  # at 100% of the peak
        rest = r["predicted_step_ms"] - r["predicted_compute_ms"]
        fitted = peak_compute / max(seconds * 1e3 - rest, 1e-9)
        rows.append({"slice": slice_name, "batch": batch, "published_s": seconds,
                     "predicted_s": r["predicted_step_ms"] / 1e3,
                     "error": r["predicted_step_ms"] / 1e3 / seconds - 1,
                     "efficiency_that_matches": fitted, "bottleneck": r["bottleneck"],
                     "compiler_memory_gb": r["compiler_memory_gb"],
                     "estimated_memory_gb": r["estimated_memory_gb"], "fits": r["fits"],
                     "collective_matmul": not flags,
                     "source": source, "wall_s": time.perf_counter() - started})
        print(pd.DataFrame(rows[-1:]).to_string(index=False), flush=True)
    out = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out / "published.csv", index=False)
    print(f"\nMXU_EFFICIENCY = {plan.MXU_EFFICIENCY} ({plan.MXU_EFFICIENCY_SOURCE})")
    print(out.drop(columns=["source"]).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
