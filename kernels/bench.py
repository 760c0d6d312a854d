"""Time the flash-attention kernel against XLA's own attention on a TPU, from PyTorch.

Run as ``PJRT_DEVICE=TPU python -m kernels.bench --json`` (the notebook starts it as a
subprocess so that the notebook process never holds the TPU). Prints one JSON line per
(shape, implementation): median and spread of the step time over ``--repeats`` runs after
warm-up, the device synced before every clock read. NOT VERIFIED: no TPU in this project.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import pandas as pd

# (batch, heads, seq, head_dim): GPT-2 small's attention at two lengths
SHAPES = [(8, 12, 1024, 64), (4, 12, 2048, 64)]


def run_tpu_benchmark(shapes: list[tuple[int, int, int, int]] | None = None, repeats: int = 20,
                      timeout: float = 600) -> pd.DataFrame:
    """Run this module on the TPU in a subprocess; a DataFrame with columns ``shape``,
    ``impl`` ("pallas kernel" / "XLA attention"), ``median_ms``, ``min_ms``, ``max_ms``."""
    cmd = [sys.executable, "-m", "kernels.bench", "--json", "--repeats", str(repeats)]
    for s in shapes or SHAPES:
        cmd += ["--shape", "x".join(map(str, s))]
    env = {**os.environ, "PJRT_DEVICE": "TPU"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"kernel benchmark failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return pd.DataFrame([json.loads(line) for line in proc.stdout.splitlines()
                         if line.startswith("{")])


def _bench(shape: tuple[int, int, int, int], repeats: int) -> list[dict]:
    import torch
    import torch.nn.functional as F
    import torch_xla
    import torch_xla.core.xla_model as xm

    from .torch_bridge import flash_attention

    device = torch_xla.device()
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16).to(device) for _ in range(3))
    impls = {
        "pallas kernel": lambda: flash_attention(q, k, v, causal=True),
        "XLA attention": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    rows = []
    for name, fn in impls.items():
        times = []
        for i in range(repeats + 3):  # 3 warm-up runs (the first compiles)
            xm.wait_device_ops()
            t0 = time.perf_counter()
            out = fn()
            torch_xla.sync()
            xm.wait_device_ops()
            if i >= 3:
                times.append((time.perf_counter() - t0) * 1e3)
        del out
        rows.append({"shape": "x".join(map(str, shape)), "impl": name,
                     "median_ms": statistics.median(times), "min_ms": min(times),
                     "max_ms": max(times)})
    return rows


def main(argv: list[str] | None = None) -> None:
    """Parse ``--shape BxHxTxD`` (repeatable), ``--repeats N``, ``--json``; print the rows."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shape] or SHAPES
    for shape in shapes:
        for row in _bench(shape, args.repeats):  # type: ignore[arg-type]
            print(json.dumps(row) if args.json else row, flush=True)


if __name__ == "__main__":
    main()
