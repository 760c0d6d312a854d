"""What does not compile: ops that ran outside XLA and Dynamo's graph breaks, per step.

The model with known holes is defined here and trained by the worker's own loop
(:func:`tpu_workbench.worker.train.train` with the torch_xla backend) in a subprocess, as a worker
would: on XLA:CPU torch_xla 2.9 has no lowering for the backward of nearest upsampling (the hole
the UNet family works around, see models/unet.py), so ``aten::upsample_nearest2d_backward``
runs on the CPU once per step; and a Python ``if`` on a tensor's value is a graph break for
Dynamo (and a host read of the value between its two graphs). A user's top-1 mixture of experts
(tests/models/tiny_moe.py) breaks inside its loop over experts, so Dynamo skips its whole
``forward``, which only Dynamo's log tells. minGPT tiny through the runner shows the explicit
zero.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tpu_workbench as wb
from tpu_workbench.models.base import ModelFamily
from tpu_workbench.records import FALLBACK_COLUMNS

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
BRANCH = "if self.branch and h.sum() > 1e9:  # data-dependent branch"
MOE = ROOT / "tests" / "models" / "tiny_moe.py"
MOE_BRANCH = "if mask.any():  # skip an expert no point was routed to"


@dataclass
class HolesConfig:
    channels: int = 4
    size: int = 4
    batch_size: int = 2


class Holes(nn.Module):
    """conv -> nearest 2x upsampling -> conv; `branch`: a Python `if` on a tensor's value."""

    def __init__(self, cfg: HolesConfig, branch: bool):
        super().__init__()
        self.branch = branch
        self.a = nn.Conv2d(cfg.channels, cfg.channels, 3, padding=1)
        self.b = nn.Conv2d(cfg.channels, cfg.channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.interpolate(self.a(x), scale_factor=2, mode="nearest")
        if self.branch and h.sum() > 1e9:  # data-dependent branch
            h = h * 0.5
        return self.b(h)


class HolesFamily(ModelFamily):
    name = "holes"
    presets = {"tiny": HolesConfig()}
    metric_name = "mse"
    branch = False

    def build(self, cfg: HolesConfig) -> nn.Module:
        return Holes(cfg, self.branch)

    def make_batch(self, cfg, batch_size, generator):
        x = torch.randn(batch_size, cfg.channels, cfg.size, cfg.size, generator=generator)
        return {"x": x, "y": torch.randn(batch_size, cfg.channels, 2 * cfg.size, 2 * cfg.size,
                                         generator=generator)}

    def loss(self, model, batch):
        return F.mse_loss(model(batch["x"]), batch["y"])

    def evaluate(self, model, batch):
        return self.loss(model, batch)

    def flops_per_step(self, cfg, batch_size):
        return 0.0


class _Context:
    """The worker's TaskContext, collecting the records in a list."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.records: list[dict] = []

    def emit(self, record: dict) -> None:
        self.records.append(record)

    def check_cancel(self) -> None:
        pass


def worker_main(mode: str, steps: int, branch: bool, out: str) -> None:
    """In the subprocess: train HolesFamily with the worker's loop and torch_xla backend; write
    the records, the summary and the time each step's fallback read took to `out`."""
    import time

    from tpu_workbench import models
    from tpu_workbench.worker.backend import backend_for
    from tpu_workbench.worker.train import train

    HolesFamily.branch = branch
    models.get_model = lambda name: HolesFamily()
    backend = backend_for("xla")
    backend.runtime_info()
    read_ms: list[float] = []
    step_fallbacks = backend.step_fallbacks

    def timed(step):
        t0 = time.perf_counter()
        try:
            return step_fallbacks(step)
        finally:
            read_ms.append((time.perf_counter() - t0) * 1e3)

    backend.step_fallbacks = timed
    ctx = _Context(Path(out).parent)
    spec = wb.ExperimentSpec(model="mlp", preset="tiny", mode=mode, steps=steps)
    summary = train(ctx, spec.to_dict(), backend)
    Path(out).write_text(json.dumps({"records": ctx.records, "summary": summary,
                                     "read_ms": read_ms}, default=str))


def _train_holes(tmp_path: Path, mode: str, steps: int, branch: bool = False):
    """HolesFamily trained in a fresh torch_xla process: (RunResult, ms per fallback read)."""
    spec = wb.ExperimentSpec(model="mlp", preset="tiny", mode=mode, steps=steps)
    out = tmp_path / f"{mode}.json"
    env = {**os.environ, **wb.runtime_config(spec).env(), "PYTHONPATH": str(ROOT)}
    code = (f"import sys; sys.path.insert(0, {str(HERE.parent)!r}); import test_fallbacks; "
            f"test_fallbacks.worker_main({mode!r}, {steps}, {branch}, {str(out)!r})")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    result = wb.RunResult(spec=spec, run_id=f"holes-{mode}", runtime={}, records=data["records"],
                          summary=data["summary"], out_dir=None, wall_s=0.0)
    return result, data["read_ms"]


@pytest.fixture(scope="module")
def lazy_holes(tmp_path_factory):
    return _train_holes(tmp_path_factory.mktemp("lazy"), "lazy", steps=4)


def test_lazy_records_the_upsample_backward_falling_back_every_step(lazy_holes):
    result, _ = lazy_holes
    steps = [r for r in result.records if r["kind"] == "step"]
    ops = [(r["step"], r["op"], r["count"]) for r in result.records if r["kind"] == "fallback"]
    assert ops == [(s, "aten::upsample_nearest2d_backward", 1) for s in range(4)]
    assert [r["fallbacks"] for r in steps] == [1, 1, 1, 1]
    assert all("graph_breaks" not in r for r in steps)  # lazy: no Dynamo, nothing to count
    # what the fallback costs: the CPU op cuts each step into two XLA programs
    assert [r["executions"] for r in steps[1:]] == [2, 2, 2]

    table = wb.fallbacks(result)
    assert list(table.columns) == FALLBACK_COLUMNS
    (row,) = table.to_dict("records")
    assert (row["kind"], row["op"], row["count"], row["per_step"], row["steps"]) == (
        "fallback", "aten::upsample_nearest2d_backward", 4, 1.0, "0-3")


def test_reading_the_counters_costs_under_a_few_ms(lazy_holes):
    _, read_ms = lazy_holes
    assert len(read_ms) == 4
    assert sorted(read_ms)[len(read_ms) // 2] < 5.0, read_ms  # median; measured ~0.1 ms


def test_dynamo_records_the_graph_break_with_its_source_line(tmp_path):
    result, _ = _train_holes(tmp_path, "dynamo", steps=3, branch=True)
    breaks = [r for r in result.records if r["kind"] == "graph_break"]
    assert breaks, result.records
    line = next(i for i, text in enumerate(HERE.read_text().splitlines(), 1)
                if text.strip() == BRANCH)
    first = breaks[0]
    assert first["step"] == 0 and first["reason"].startswith("generic_jump")
    assert first["where"] == f"tests/test_fallbacks.py:{line} in forward"
    assert first["line"] == BRANCH
    steps = [r for r in result.records if r["kind"] == "step"]
    assert steps[0]["graph_breaks"] >= 1 and all(r["graph_breaks"] == 0 for r in steps[1:])

    table = wb.fallbacks(result)
    gb = table[table["kind"] == "graph_break"].iloc[0]
    assert (gb["op"], gb["where"], gb["steps"]) == (first["reason"], first["where"], "0")
    assert "data-dependent" in gb["note"]
    # Between the two graphs the `if` reads h.sum() on the host, every step. (torch_xla's
    # openxla bridge clears all counters while it compiles, so step 0 reads none of it.) The
    # upsample backward does not fall back here: AOT autograd decomposes it into ops XLA lowers.
    ops = [(r["step"], r["op"], r["count"]) for r in result.records if r["kind"] == "fallback"]
    assert ops == [(1, "aten::_local_scalar_dense", 1), (2, "aten::_local_scalar_dense", 1)]
    fb = table[table["kind"] == "fallback"].iloc[0]
    assert (fb["op"], fb["count"], fb["steps"]) == ("aten::_local_scalar_dense", 2, "1-2")


def test_mingpt_lazy_has_no_fallbacks_and_says_so(results):
    spec = wb.ExperimentSpec(model="mingpt", preset="tiny", mode="lazy", steps=3)
    pool = wb.WorkerPool()
    try:
        result = wb.run(spec, pool=pool)
    finally:
        pool.shutdown()
    assert [r["fallbacks"] for r in result.records if r.get("kind") == "step"] == [0, 0, 0]
    table = wb.fallbacks(result)
    assert table[["mode", "kind", "op", "count"]].to_dict("records") == [
        {"mode": "lazy", "kind": "fallback", "op": "none", "count": 0}]
    assert table["note"].iloc[0].startswith("no CPU fallbacks")

    from tpu_workbench.cli.bench import outside_compiler

    assert outside_compiler(table) == "no CPU fallbacks (lazy)"


def _moe_where() -> str:
    """``file:line in forward`` of the MoE's ``if mask.any():``, found in its source."""
    line = next(i for i, text in enumerate(MOE.read_text().splitlines(), 1)
                if text.strip() == MOE_BRANCH)
    return f"tests/models/tiny_moe.py:{line} in forward"


def _assert_moe_skip_reported(result) -> None:
    """One graph break at step 0, at the MoE's `if mask.any():`, that made Dynamo skip
    `forward` whole; the table and the CLI say the function ran uncompiled."""
    breaks = [r for r in result.records if r["kind"] == "graph_break"]
    assert [(r["step"], r["reason"], r["where"], r["line"], r["skipped_frame"], r["count"])
            for r in breaks] == [
        (0, "Data-dependent branching", _moe_where(), MOE_BRANCH, _moe_where(), 1)], breaks
    assert "data-dependent branching" in breaks[0]["detail"].lower()
    steps = [r for r in result.records if r["kind"] == "step"]
    assert [r["graph_breaks"] for r in steps] == [1] + [0] * (len(steps) - 1)

    table = wb.fallbacks(result)
    (row,) = table[table["kind"] == "graph_break"].to_dict("records")
    assert (row["op"], row["where"], row["skipped_frame"], row["steps"]) == (
        "Data-dependent branching", _moe_where(), _moe_where(), "0")
    assert "`forward`" in row["note"] and "uncompiled" in row["note"]
    assert "data-dependent" in row["note"]

    from tpu_workbench.cli.bench import outside_compiler

    text = outside_compiler(table)
    assert "no graph breaks" not in text
    assert f"{result.spec.mode}: forward ran uncompiled" in text, text


def test_a_frame_dynamo_skips_is_reported_with_its_reason_and_line(results):
    """The issue's case: the break sits in a loop, so Dynamo compiles nothing of `forward`
    (measured: a counting backend receives 0 graphs) and graph_break_reasons stays empty. A
    second run in the same warm worker reports it again: Dynamo would otherwise keep running
    the skipped code uncompiled without tracing it anew."""
    pool = wb.WorkerPool()
    try:
        for seed, steps in ((0, 2), (1, 1)):  # cold, then warm
            spec = wb.ExperimentSpec(model=f"{MOE}:make", preset="default", mode="dynamo",
                                     steps=steps, seed=seed)
            result = wb.run(spec, pool=pool)
            _assert_moe_skip_reported(result)
            # the experts' `if` reads mask.any() on the host, 4 experts a step
            ops = [(r["step"], r["op"], r["count"]) for r in result.records
                   if r["kind"] == "fallback" and r["op"] == "aten::_local_scalar_dense"]
            assert ops == [(s, "aten::_local_scalar_dense", 4) for s in range(steps)]
    finally:
        pool.shutdown()


def test_inductor_reports_the_skipped_frame_too(results):
    pool = wb.WorkerPool()
    try:
        result = wb.run(wb.ExperimentSpec(model=f"{MOE}:make", preset="default",
                                          mode="inductor", steps=2), pool=pool)
    finally:
        pool.shutdown()
    _assert_moe_skip_reported(result)


def test_reading_dynamos_skips_prints_nothing_and_compiles_nothing(capfd):
    """In this process, on the CPU: what the worker reads of Dynamo's log, with no graph for
    `forward` (a counting backend) and not a line more on stdout or stderr."""
    import importlib.util

    from tpu_workbench.worker.backend import GraphBreaks

    module_spec = importlib.util.spec_from_file_location("tiny_moe_inline", MOE)
    moe = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(moe)
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    breaks = GraphBreaks()
    model = torch.compile(moe.build(), backend=counting)
    batch = moe.make_batch(32, torch.Generator().manual_seed(0))
    moe.loss(model, batch).backward()
    (record,) = breaks.new(0)
    assert graphs == []
    assert record["reason"] == "Data-dependent branching"
    assert record["where"].endswith(f":{_moe_where().split(':', 1)[1]}")
    assert record["skipped_frame"] == record["where"]
    assert capfd.readouterr() == ("", "")
