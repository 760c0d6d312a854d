#!/usr/bin/env python3
"""How much does the runner's timing cost? The runner against a hand-written torch_xla loop.

Both train the same model (same weights, batches and AdamW) in the same mode; the hand-written
loop runs in a plain subprocess with no workbench machinery around its steps (no streaming, no
counters, no compile-log reads). They alternate A/B several times in one run, so the ratio of
their steady-state medians is measured under the same machine load.

    .venv/bin/python scripts/bench_overhead.py --model mingpt --mode compile --steps 60 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HAND_WRITTEN = r"""
import json, os, sys, time
import torch, torch_xla, torch_xla.core.xla_model as xm
from tpu_workbench.models import get_model
model_name, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
family = get_model(model_name); cfg = family.config("tiny")
bs = family.default_batch_size(cfg)
torch.manual_seed(0)
model = family.build(cfg).to(torch_xla.device()).train()
gen = torch.Generator().manual_seed(0)
batches = [{k: v.to(torch_xla.device()) for k, v in family.make_batch(cfg, bs, gen).items()}
           for _ in range(min(steps, 8))]
opt = torch.optim.AdamW(model.parameters(), lr=family.default_lr, foreach=False)
for p in model.parameters():
    opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                    "exp_avg_sq": torch.zeros_like(p)}
def step(batch):
    opt.zero_grad(set_to_none=True)
    loss = family.loss(model, batch); loss.backward(); opt.step()
    return loss
if mode == "compile":
    fn = torch_xla.compile(step)
else:
    def fn(batch):
        loss = step(batch); torch_xla.sync(); return loss
xm.wait_device_ops()
times = []
for i in range(steps):
    t0 = time.perf_counter(); loss = fn(batches[i % len(batches)]); xm.wait_device_ops()
    times.append((time.perf_counter() - t0) * 1e3)
    float(loss.detach().to("cpu"))
print(json.dumps(times))
"""


def hand_written(model: str, mode: str, steps: int) -> list[float]:
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8", "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run([sys.executable, "-c", HAND_WRITTEN, model, mode, str(steps)],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def via_runner(model: str, mode: str, steps: int) -> list[float]:
    import tpu_workbench as wb

    pool = wb.WorkerPool(max_workers=1)  # a fresh worker, like the fresh subprocess above
    try:
        result = wb.run(wb.ExperimentSpec(model=model, mode=mode, steps=steps), pool=pool)
    finally:
        pool.shutdown()
    return result.steps["wall_ms"].tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mingpt")
    parser.add_argument("--mode", default="compile", choices=["compile", "lazy"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    hand, runner = [], []
    for i in range(args.rounds):
        for name, fn, sink in (("hand", hand_written, hand), ("runner", via_runner, runner)):
            times = fn(args.model, args.mode, args.steps)[1:]  # drop step 0 (compile)
            sink.append(statistics.median(times))
            print(f"round {i + 1} {name:6s}: steady median {sink[-1]:.2f} ms "
                  f"(p10 {sorted(times)[len(times) // 10]:.2f}, "
                  f"p90 {sorted(times)[len(times) * 9 // 10]:.2f})", flush=True)
    ratios = [r / h for r, h in zip(runner, hand, strict=True)]
    print(f"\n{args.model}/tiny/{args.mode}, {args.steps} steps x {args.rounds} rounds")
    print(f"hand-written steady median: {statistics.median(hand):.2f} ms")
    print(f"runner steady median:       {statistics.median(runner):.2f} ms")
    print(f"runner / hand-written: median ratio {statistics.median(ratios):.3f} "
          f"(per round: {', '.join(f'{r:.3f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
