"""The TPU acceptance command in its CPU form (as CI runs it), its check list against the
README (one list, not two), honest step timing and the chip-metrics sampler."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT

import tpu_workbench as wb
from tpu_workbench import cli
from tpu_workbench.acceptance import checks as acc
from tpu_workbench.errors import SpecError
from tpu_workbench.runs.workers import WORKER_LOG_ENV


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(acc.README_SECTION)
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_readme_only_on_a_tpu_list_is_the_check_list():
    bullets = [line for line in readme_section().splitlines() if line.startswith("- **")]
    assert bullets == acc.readme_items()  # every item is a check, every check an item, in order
    keys = [c.key for c in acc.CHECKS]
    assert len(set(keys)) == len(keys)
    # the two items other issues are building are in the list already
    items = " ".join(c.item for c in acc.CHECKS)
    assert "naive / dynamic_cache / static_cache / bucketed" in items
    assert "calibration of `wb.predict`" in items


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory):
    """``tpu-workbench acceptance --out DIR`` here, once; and the workers it started."""
    tmp = tmp_path_factory.mktemp("acceptance")
    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_WORKBENCH_RESULTS", str(tmp / "results"))
    mp.setenv(WORKER_LOG_ENV, str(tmp / "workers.log"))
    try:
        code = cli.main(["acceptance", "--out", str(tmp / "out")])
    finally:
        mp.undo()
    return code, tmp / "out", (tmp / "workers.log").read_text().splitlines()


def test_cpu_form_lists_every_check_passes_what_runs_and_exits_0(cpu_report):
    code, out, workers = cpu_report
    assert code == 0
    report = json.loads((out / "acceptance.json").read_text())
    rows = {r["key"]: r for r in report["checks"]}
    assert list(rows) == [c.key for c in acc.CHECKS]
    for check in acc.CHECKS:
        row = rows[check.key]
        if check.needs == "cpu":
            assert row["status"] == "pass", row
        else:
            assert row["status"] == "needs a TPU" and "no TPU chip" in row["detail"], row
    assert rows["modes"]["figures"]["modes"] == [acc.CPU_MODE]
    assert report["chip"]["pci_chips"] == 0 and report["versions"]["torch"]
    markdown = (out / "acceptance.md").read_text()
    for check in acc.CHECKS:
        assert f"| {check.key} | " in markdown
    assert "needs a TPU: no TPU chip" in markdown
    # one worker per runtime configuration (plain PyTorch, XLA:CPU), none started twice
    assert sorted(line.split(maxsplit=2)[2] for line in workers) == ["torch:cpu", "xla:cpu x8"]


def test_a_bad_check_name_fails_before_anything_runs(tmp_path):
    with pytest.raises(SpecError, match="unknown acceptance check.*'nope'.*valid: detection"):
        acc.acceptance(tmp_path / "out", only="modes,nope")
    with pytest.raises(SpecError, match="timeout must be a positive number of seconds, got 0"):
        acc.acceptance(tmp_path / "out", timeout=0)
    assert not (tmp_path / "out").exists()


def test_on_a_chip_missing_runtimes_and_unwired_bodies_are_said_not_failed():
    chip = SimpleNamespace(on_tpu=True, has_xla=False, tpu=SimpleNamespace(reason=""),
                           torchtpu=SimpleNamespace(installed=True, reason=""))
    by_key = {c.key: c for c in acc.CHECKS}
    assert acc.blocked(by_key["profile"], chip).status == "needs torch_xla"
    assert acc.blocked(by_key["ici"], chip).status == "not wired"
    assert acc.blocked(by_key["generation"], chip) is None  # wired: runs on a chip
    assert acc.blocked(by_key["mfu"], chip) is None  # runs here: its body is written


def test_off_a_chip_the_reason_is_the_missing_chip_whatever_the_runtime():
    # A fresh machine runs the main suite before .venv-torchtpu exists: the reason still
    # starts with the chip, then says what TorchTPU lacks.
    ctx = SimpleNamespace(on_tpu=False, tpu=SimpleNamespace(reason="no TPU chip found"),
                          torchtpu=SimpleNamespace(reason="torch_tpu is not installed"))
    by_key = {c.key: c for c in acc.CHECKS}
    assert acc.blocked(by_key["mfu"], ctx).detail == "no TPU chip found"
    assert acc.blocked(by_key["timing"], ctx).detail == \
        "no TPU chip found; TorchTPU: torch_tpu is not installed"


def test_a_check_that_raises_is_a_fail_with_the_error():
    def broken(ctx):
        raise RuntimeError("the chip said no")

    row = acc.run_check(acc.Check("x", "an item", "cpu", broken), SimpleNamespace())
    assert row["status"] == "fail" and "RuntimeError: the chip said no" in row["detail"]


# --------------------------------------------------------------------------------------------
# Honest timing: a step's clock stops only after the device finished it
# --------------------------------------------------------------------------------------------
WORK_S = 0.3  # the deliberately slow part of each step


class FakeContext:
    def __init__(self):
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def check_cancel(self):
        pass


def _steps(backend, step_fn, steps=2, monitor=None):
    from tpu_workbench.runs.spec import ExperimentSpec
    from tpu_workbench.worker.backend import ChangeHooks
    from tpu_workbench.worker.train import _steps as run_steps

    ctx = FakeContext()
    spec = ExperimentSpec(model="mlp", mode="torch_eager", steps=steps)
    run_steps(ctx, spec, backend, step_fn, ChangeHooks(None), [{}], [], None, monitor)
    return ctx.records


def test_a_steps_time_includes_a_slow_op():
    """Plain PyTorch on the CPU: a custom op that sleeps inside the loss is in ``wall_ms``."""
    from tpu_workbench.worker.pytorch import TorchBackend

    @torch.library.custom_op("wb_test::slow_identity", mutates_args=())
    def slow_identity(x: torch.Tensor) -> torch.Tensor:
        time.sleep(WORK_S)
        return x.clone()

    weight = torch.nn.Parameter(torch.ones(3))

    def step(batch):
        loss = (weight * slow_identity(torch.ones(3))).sum()
        loss.backward()
        return loss

    records = _steps(TorchBackend(), step)
    assert [r["kind"] for r in records] == ["step", "step"]
    assert all(r["wall_ms"] >= WORK_S * 1e3 for r in records), records


class LateLoss:
    """A loss whose device work ends `WORK_S` after the step returned it (an asynchronous
    device); reading it to the host waits for that work, as a device-to-host copy does."""

    def __init__(self):
        self.work = threading.Thread(target=time.sleep, args=(WORK_S,))
        self.work.start()

    def detach(self):
        return self

    def to(self, device):
        self.work.join()
        return torch.tensor(1.0)


def test_torchtpu_steps_are_timed_by_the_losss_read_even_when_synchronize_returns_early(
        monkeypatch):
    """The pitfall of pytorch/helion#3155: synchronize() returns before compiled work ends.
    TorchTPU's wait reads the loss back, so ``wall_ms`` still includes the work; ``sync_ms``
    shows what synchronize() alone would have timed."""
    from tpu_workbench.worker.torchtpu import TorchTPUBackend

    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a: None)  # returns at once
    records = _steps(TorchTPUBackend(), lambda batch: LateLoss())
    assert all(r["wall_ms"] >= WORK_S * 1e3 for r in records), records
    assert all(r["sync_ms"] <= r["wall_ms"] for r in records)


# --------------------------------------------------------------------------------------------
# Chip metrics: sampled between steps where the SDK is there, never made up where it is not
# --------------------------------------------------------------------------------------------
class FakeSDK:
    """libtpu.sdk.tpumonitoring's shape: get_metric(name).data() -> a list of strings."""

    DATA = {"duty_cycle_pct": ["0: 37.5", "1: 42.5"], "tensorcore_util": ["10.0", "20.0"],
            "hbm_capacity_usage": ["1000", "3000"]}

    def get_metric(self, name):
        if name not in self.DATA:
            raise ValueError(f"unsupported metric {name}")
        return SimpleNamespace(data=lambda: self.DATA[name], description=name)


def test_chip_metrics_are_sampled_after_each_step():
    from tpu_workbench.worker.monitoring import ChipMonitor
    from tpu_workbench.worker.pytorch import TorchBackend

    monitor = ChipMonitor(sdk=FakeSDK(), every_s=0.0)
    records = _steps(TorchBackend(), lambda b: torch.tensor(2.0), steps=2, monitor=monitor)
    assert [r["kind"] for r in records] == ["step", "tpu_metrics"] * 2
    sample = records[1]
    assert sample["duty_cycle_pct"] == 40.0 and sample["duty_cycle_pct_per_chip"] == [37.5, 42.5]
    assert sample["tensorcore_util_pct"] == 15.0 and sample["hbm_used_bytes"] == 2000.0
    assert "hbm_total_bytes" not in sample and "hbm_capacity_total" in monitor.errors
    assert monitor.summary()["samples"] == 2


def test_chip_metrics_sampling_is_throttled_and_absent_without_the_sdk():
    from tpu_workbench.worker.monitoring import ChipMonitor, parse_values, unavailable_reason

    monitor = ChipMonitor(sdk=FakeSDK(), every_s=60.0)
    assert monitor.sample(0) is not None and monitor.sample(1) is None
    assert monitor.sample(2, force=True) is not None  # the last step is always sampled
    assert parse_values(["0: 1.5%", "n/a", 2]) == [1.5, 2.0]
    reason = unavailable_reason()  # this machine: no chip (and, in .venv, no libtpu)
    assert "libtpu" in reason or "no TPU chip" in reason
    off = ChipMonitor()
    assert not off.available and off.sample(0, force=True) is None
    assert off.summary()["reason"] == reason and off.summary()["samples"] == 0


class HostSDK:
    """A v6e-8 host's SDK: one value per chip, every chip of the host, with its index."""

    def __init__(self, busy: dict[int, float], chips: int = 8):
        self.values = [busy.get(i, 0.0) for i in range(chips)]

    def get_metric(self, name):
        scale = {"hbm_capacity_usage": 1e9, "hbm_capacity_total": 32e9}.get(name, 1.0)
        data = [f"{i}: {v * scale if name != 'hbm_capacity_total' else scale}"
                for i, v in enumerate(self.values)]
        return SimpleNamespace(data=lambda: data, description=name)


def test_chip_metrics_are_the_runs_own_chips_not_the_hosts_mean():
    """One busy chip (2) among eight idle ones: the run on chip 2 reads its 90 %, not the
    host's 11.25 %, and the record names the chip; a run over chips 2 and 3 reads their mean;
    values without an index are taken in chip order."""
    from tpu_workbench.worker.monitoring import ChipMonitor

    sample = ChipMonitor(sdk=HostSDK({2: 90.0}), chips=[2]).sample(0, force=True)
    assert sample["chips"] == [2]
    assert sample["duty_cycle_pct"] == 90.0 and sample["duty_cycle_pct_per_chip"] == [90.0]
    assert sample["hbm_used_bytes"] == 90e9 and sample["hbm_total_bytes"] == 32e9
    pair = ChipMonitor(sdk=HostSDK({2: 90.0, 3: 50.0}), chips=[2, 3]).sample(0, force=True)
    assert pair["duty_cycle_pct"] == 70.0 and pair["duty_cycle_pct_per_chip"] == [90.0, 50.0]

    class Plain(FakeSDK):
        DATA = {"duty_cycle_pct": ["5.0", "60.0", "5.0"]}

    monitor = ChipMonitor(sdk=Plain(), chips=[1])
    assert monitor.sample(0, force=True)["duty_cycle_pct"] == 60.0
    assert monitor.summary()["chips"] == [1]
    missing = ChipMonitor(sdk=Plain(), chips=[5]).sample(0, force=True)
    assert "duty_cycle_pct" not in missing and missing["chips"] == [5]


def test_a_one_device_run_samples_its_own_chip(monkeypatch):
    """The worker's train() with libtpu's SDK faked (a v6e-8 whose chip 0 is busy and the other
    seven idle): the run's one device is chip 0, so its records read chip 0's 80 %, not the
    host's mean of 10 %, and say so, as the run's summary does."""
    import sys

    from tpu_workbench.runs.spec import ExperimentSpec
    from tpu_workbench.worker import monitoring
    from tpu_workbench.worker.pytorch import TorchBackend
    from tpu_workbench.worker.train import train

    monkeypatch.setattr(monitoring, "unavailable_reason", lambda: "")
    monkeypatch.setitem(sys.modules, monitoring.SDK_MODULE, HostSDK({0: 80.0}))
    ctx = FakeContext()
    ctx.out_dir = None
    spec = ExperimentSpec(model="mlp", mode="torch_eager", steps=2)
    summary = train(ctx, spec.to_dict(), TorchBackend())
    samples = [r for r in ctx.records if r["kind"] == "tpu_metrics"]
    assert samples and all(r["duty_cycle_pct"] == 80.0 for r in samples)
    assert all(r["chips"] == [0] for r in samples)
    assert summary["chip_metrics"]["chips"] == [0] and summary["chip_metrics"]["available"]
    # the chart's tooltip and the notebook's line say which chips were read
    import pandas as pd

    from tpu_workbench import notebook as nb
    from tpu_workbench.charts.chips import chip_metrics

    chart = chip_metrics(pd.DataFrame([{**r, "mode": "torch_eager"} for r in samples]))
    rows = [row for data in chart.to_dict()["datasets"].values() for row in data]
    assert rows and {row["chips"] for row in rows} == {"0"}
    run = SimpleNamespace(spec=spec, summary=summary, records=ctx.records)
    assert "of the runs' chips (0)" in nb.chip_metrics_view(SimpleNamespace(results=[run])).text


def test_a_runs_chips_are_its_device_or_every_device_of_its_mesh(tmp_path):
    """torch_xla (XLA:CPU, 8 devices) in a worker: a run without a mesh steps on device 0; an
    SPMD run on a 2x4 mesh on all 8 (torch_xla's mesh spans every device). Said in the summary
    whether or not the chips could be sampled."""
    from tpu_workbench.environment import backends
    from tpu_workbench.runs.workers import WorkerPool

    if not backends.have_torch_xla():
        pytest.skip("needs torch_xla")
    one = wb.ExperimentSpec(model="mlp", mode="lazy", steps=1)
    pool = WorkerPool(max_workers=1)
    try:
        single = wb.run(one, pool=pool, out_dir=tmp_path)
        meshed = wb.run(one.replace(mesh=(2, 4), strategy="dp"), pool=pool, out_dir=tmp_path)
    finally:
        pool.shutdown()
    assert single.summary["chip_metrics"]["chips"] == [0]
    assert meshed.summary["chip_metrics"]["chips"] == list(range(8))


def test_chip_metrics_chart_and_the_notebook_view():
    import marimo as mo
    import pandas as pd

    from tpu_workbench import notebook as nb
    from tpu_workbench.charts.chips import chip_metrics
    from tpu_workbench.runs.spec import ExperimentSpec

    samples = pd.DataFrame({"step": [0, 1], "mode": ["lazy", "lazy"],
                            "duty_cycle_pct": [40.0, 60.0], "hbm_used_bytes": [2e9, 3e9]})
    spec = chip_metrics(samples).to_dict()
    util, hbm = spec["vconcat"]
    assert util["facet"]["column"]["field"] == "metric"  # one panel per utilisation metric
    assert util["spec"]["encoding"]["y"]["field"] == "percent"
    assert hbm["encoding"]["y"]["field"] == "hbm_gb"
    assert sorted(r["hbm_gb"] for r in spec["datasets"][hbm["data"]["name"]]) == [2.0, 3.0]

    run = SimpleNamespace(spec=ExperimentSpec(model="mlp", mode="lazy"), summary={}, records=[
        {"kind": "step", "step": 0}, {"kind": "tpu_metrics", "step": 0, "duty_cycle_pct": 50.0}])
    assert "1 sample(s)" in nb.chip_metrics_view(SimpleNamespace(results=[run])).text
    beside = nb.with_chip_metrics(mo.md("steps"), nb.chip_samples([run]))  # run_live's view
    assert "steps" in beside.text and "vega" in beside.text.lower()
    assert nb.with_chip_metrics("steps", []) == "steps"  # no samples: the chart alone
    run.records = run.records[:1]
    run.summary = {"chip_metrics": {"available": False, "reason": "no TPU chip on the PCI bus"}}
    callout = nb.chip_metrics_view(SimpleNamespace(results=[run])).text
    assert "needs a TPU: no TPU chip on the PCI bus" in callout


class ChipContext(acc.Context):
    """A context on a (pretend) v6e host whose runs return the given records, to check the
    chip bodies' verdicts without a chip."""

    def __init__(self, records):
        self.memo, self.has_xla = {}, True
        self.tpu = SimpleNamespace(chips=1, reason="")
        self.records = records

    def run(self, spec):
        return SimpleNamespace(records=self.records(spec), summary={}, out_dir="")


def test_chip_bodies_flag_a_synchronize_that_does_not_wait_and_a_mode_that_drifts(monkeypatch):
    steps = [{"kind": "step", "step": i, "wall_ms": 9.0, "sync_ms": 0.2, "loss": 3.0 - i / 10}
             for i in range(4)]
    timing = acc.check_timing(ChipContext(lambda spec: steps))
    assert timing.status == "pass" and timing.figures["synchronize_waits"] is False
    assert "synchronize does NOT wait" in timing.detail

    monkeypatch.setattr(acc, "available_modes", lambda: ["torch_eager", "lazy", "tpu_compile"])
    drift = [{**s, "loss": s["loss"] * (1.1 if s["step"] else 1)} for s in steps]
    modes = acc.check_modes(ChipContext(lambda spec: drift if spec.mode == "lazy" else steps))
    assert modes.status == "fail" and "['lazy']" in modes.detail
