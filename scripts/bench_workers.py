#!/usr/bin/env python3
"""What a cold worker costs to start: spawned (``python -m tpu_workbench.worker``) vs forked
from the template process that has imported torch (:mod:`tpu_workbench.runs.template`).

For each way and runtime, `--repeat` workers are started one after another, each timed from
the request to its "ready" line (runtime imported, devices counted), with the CPU seconds the
worker process itself used to get there. The template's own start-up (one per process) is
timed apart. Median and spread (min-max) of each; ratios within this one run.

    .venv/bin/python scripts/bench_workers.py --repeat 5

A benchmark, not a test: run it on an idle machine (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import psutil

from tpu_workbench.runs import template as worker_template
from tpu_workbench.runs.spec import RuntimeConfig
from tpu_workbench.runs.workers import Worker

CONFIGS = {"xla": RuntimeConfig("xla", "cpu", 8), "torch": RuntimeConfig("torch", "cpu", 1)}


def _one(config: RuntimeConfig) -> tuple[float, float, bool]:
    t0 = time.perf_counter()
    worker = Worker(config)
    try:
        worker.wait_ready(300)
        ready = time.perf_counter() - t0
        cpu = psutil.Process(worker.proc.pid).cpu_times()
        return ready, cpu.user + cpu.system, worker.forked
    finally:
        worker.stop()


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runtimes", default="xla,torch")
    args = parser.parse_args(argv)
    runtimes = args.runtimes.split(",")
    if bad := [r for r in runtimes if r not in CONFIGS]:
        parser.error(f"unknown runtime(s) {', '.join(bad)}; valid: {', '.join(CONFIGS)}")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    t0 = time.perf_counter()
    worker_template.warm()
    assert worker_template._template() is not None, "the template did not start"
    print(f"template start (import torch once): {time.perf_counter() - t0:.2f} s")
    medians: dict[tuple[str, str], float] = {}
    for runtime in runtimes:
        for way in ("spawn", "fork"):
            os.environ[worker_template.TEMPLATE_ENV] = "0" if way == "spawn" else "1"
            rows = [_one(CONFIGS[runtime]) for _ in range(args.repeat)]
            assert all(forked == (way == "fork") for _, _, forked in rows)
            ready, cpu = [r[0] for r in rows], [r[1] for r in rows]
            medians[(runtime, way)] = statistics.median(ready)
            print(f"{runtime:5} {way:5}  ready {_fmt(ready)}   worker CPU {_fmt(cpu)}")
        print(f"{runtime:5} spawn/fork ready ratio: "
              f"{medians[(runtime, 'spawn')] / medians[(runtime, 'fork')]:.1f}x")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
