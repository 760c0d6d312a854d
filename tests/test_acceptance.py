"""The TPU acceptance command in its CPU form (as CI runs it), its check list against the
README (one list, not two), honest step timing and the chip-metrics sampler."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from conftest import ROOT

import tpu_workbench as wb
from tpu_workbench import cli
from tpu_workbench.acceptance import checks as acc
from tpu_workbench.acceptance import judge
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


# --------------------------------------------------------------------------------------------
# The chip checks' bodies, each run against fakes: a plausible chip passes, an implausible fails
# --------------------------------------------------------------------------------------------
# Figures by hand (not by the code under test):
GPT2_PARAMS = 124_439_808  # GPT-2 small, as published (models/mingpt.py says the same)
# 3 x forward matmuls of the gpt2 preset (8 sequences of 2 * 6 - 1 = 11 tokens, d 768, V 50257):
# 12 x (24*88*768^2 + 4*88*11*768) + 2*88*768*50257 = 21,777,321,984; x 3:
GPT2_FLOPS = 65_331_965_952
# AdamW's update on a v6e: 124,439,808 x 24 bytes / 1638 GB/s (Cloud TPU docs) = 1.8233 ms; the
# MFU of a step that fast: 65.332e9 / 1.8233e-3 s / 918e12 = 3.903%; 20x slower: 0.1952%.
V6E_FLOOR_MS, V6E_MFU_HIGH, V6E_MFU_LOW = 1.8233, 0.03903, 0.001952
XM_DOCSTRING_LIMIT = 34_088_157_184  # torch_xla 2.9's xm.get_memory_info docstring: 31.75 GiB
TINY_PARAMS = 400_000  # fabricated: the order of minGPT tiny; its AdamW state is 4.8 MB
V6E_PROBE = {"runtime": "xla", "pjrt_device": "TPU", "device_hw": "TPU",
             "device_kind": "TPU v6 lite", "device_count": 1}


def _train(wall_ms=9.0, sync_ms=0.2, losses=(3.0, 2.9, 2.8, 2.7, 2.6, 2.5, 2.4, 2.3)):
    """Eight step records: step 0 compiles (5 s), then `wall_ms` each."""
    return [{"kind": "step", "step": i, "wall_ms": 5000.0 if i == 0 else wall_ms,
             "sync_ms": 5000.0 if i == 0 else sync_ms, "compiles": int(i == 0), "loss": loss}
            for i, loss in enumerate(losses)]


def _run(spec, records=(), out_dir="", **summary):
    return SimpleNamespace(spec=spec, records=list(records), out_dir=str(out_dir),
                           run_id=f"fake-{spec.mode}", runtime=dict(V6E_PROBE),
                           summary={"n_params": TINY_PARAMS, **summary})


def _gpt2_run(spec, wall_ms):
    return _run(spec, _train(wall_ms), n_params=GPT2_PARAMS, flops_per_step=GPT2_FLOPS,
                batch_size=8, items_per_step=88, item_unit="tokens", metric_name="",
                metric=float("nan"))


class FakeChip(acc.Context):
    """A one-chip v6e host (torch_xla and TorchTPU both there) whose probe is `probe` and whose
    runs are `runs(spec)`: nothing is started."""

    def __init__(self, tmp_path, runs, probe=None, chips=1):
        self.out = self.runs_dir = tmp_path
        self.pool = SimpleNamespace(release_chip=lambda: None)
        self.timeout = 1.0
        self.tpu = SimpleNamespace(chips=chips, available=True, reason="", fallback="")
        self.torchtpu = SimpleNamespace(chips=chips, installed=True, reason="",
                                        summary=lambda: "fake TorchTPU")
        self.has_xla = True
        self.memo = {"probe": {**V6E_PROBE, **(probe or {})}}
        self.runs = runs

    def run(self, spec):
        return self.runs(spec)


def _files(folder, files):
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
    return folder


# Each scenario: (tmp_path, monkeypatch, plausible) -> a FakeChip; FAILS: what the fail says.
def _detection(tmp, mp, ok):
    mp.setattr(acc.backends, "tpu_kind_on_pci", lambda: "TPU v6e")
    mp.setattr(acc.backends, "tpu_holder_details", lambda: [])
    seen = {} if ok else {"device_kind": "cpu", "device_hw": "CPU"}  # the worker fell back
    return FakeChip(tmp, None, seen)


def _device_kind(tmp, mp, ok):
    mp.setattr(acc.backends, "tpu_kind_on_pci", lambda: "TPU v6e" if ok else "TPU v5e")
    return FakeChip(tmp, None)


def _peaks_hbm(tmp, mp, ok):
    limit = XM_DOCSTRING_LIMIT if ok else 16 * 2**30  # a v5e's HBM on a chip called v6e
    memory = {"device_memory": {"bytes_limit": limit}, "device_memory_source": "xm"}
    return FakeChip(tmp, lambda spec: _run(spec, memory=memory))


def _memory(tmp, mp, ok):
    peak = 60e6 if ok else 1e6  # below the model's own 4.8 MB of state: not this run's figure
    device = {"bytes_used": min(30e6, peak), "peak_bytes_used": peak,
              "bytes_limit": XM_DOCSTRING_LIMIT}
    return FakeChip(tmp, lambda spec: _run(spec, memory={
        "device_memory": device, "device_memory_source": "xm.get_memory_info"}))


def _modes(tmp, mp, ok):
    mp.setattr(acc, "available_modes", lambda: ["torch_eager", "lazy", "tpu_compile"])
    drift = [{**s, "loss": s["loss"] * (1 if ok or not s["step"] else 1.1)} for s in _train()]
    return FakeChip(tmp, lambda spec: _run(spec, drift if spec.mode == "lazy" else _train()))


def _timing(tmp, mp, ok):
    return FakeChip(tmp, lambda spec: _gpt2_run(spec, 9.0 if ok else 1.0))  # floor 1.82 ms


def _optimised_hlo(tmp, mp, ok):
    layout = "{1,0:T(8,128)}" if ok else "{1,0}"  # XLA:CPU's layouts have no tiles
    text = (f"ENTRY %main {{ %p0 = f32[8,128]{layout} parameter(0)\n  ROOT %fusion.1 = "
            f"f32[8,128]{layout} fusion(f32[8,128]{layout} %p0), kind=kLoop }}\n")
    _files(tmp / "hlo", {"module_0001.SyncTensorsGraph.after_optimizations.txt": text})
    return FakeChip(tmp, lambda spec: _run(spec, out_dir=tmp))


def _persistent_cache(tmp, mp, ok):
    from tpu_workbench.runs import compile_cache

    second = ({"first_step_ms": 900.0, "persistent_hits": 3, "deserialize_failures": 0} if ok
              else {"first_step_ms": 21000.0, "persistent_hits": 0, "deserialize_failures": 3})
    frame = pd.DataFrame([{"first_step_ms": 20000.0, "persistent_hits": 0,
                           "deserialize_failures": 0}, second])
    mp.setattr(compile_cache, "persistent_cache_check", lambda spec, timeout: SimpleNamespace(
        frame=frame, verdict="loaded" if ok else "could not load them"))
    return FakeChip(tmp, None)


def _profile(tmp, mp, ok):
    from tpu_workbench import profiling

    ops = pd.DataFrame({"hlo_op": ["fusion.12", "convolution.3", "copy.1"] if ok else [],
                        "per_step_us": [120.0, 80.0, 5.0] if ok else []})
    mp.setattr(profiling, "load_profile", lambda run: SimpleNamespace(ops=ops))
    return FakeChip(tmp, lambda spec: _run(spec))


def _torchtpu_profile(tmp, mp, ok):
    _files(tmp / "profile", {"plugins/profile/1/host.xplane.pb": b"\x08\x01" if ok else b""})
    return FakeChip(tmp, lambda spec: _run(spec, out_dir=tmp))


def _pallas(tmp, mp, ok):
    scale = 1.001 if ok else 1.1
    pallas = [{**s, "loss": s["loss"] * scale} for s in _train()]
    return FakeChip(tmp, lambda spec: _run(spec, pallas if spec.options else _train()))


def _spmd(tmp, mp, ok):
    layout = [{"kind": "layout", "device": d if ok else 0} for d in range(4)]
    return FakeChip(tmp, lambda spec: _run(spec, layout + _train()), {"device_count": 4})


def _torchtpu_cache(tmp, mp, ok):
    cache = {"compilations": 3, "hits": 21, "requests": 24} if ok else \
        {"compilations": 24, "hits": 0, "requests": 24}  # a compile every step
    return FakeChip(tmp, lambda spec: _run(spec, cache=cache))


def _stablehlo(tmp, mp, ok):
    text = "func.func @main() { %0 = stablehlo.dot_general ... }" if ok else ""
    _files(tmp / "hlo", {"0_forward.stablehlo.txt": text, "0_backward.stablehlo.txt": text})
    return FakeChip(tmp, lambda spec: _run(spec, out_dir=tmp))


def _dtensor(tmp, mp, ok):
    from tpu_workbench.scale import dtensor_sharding

    mp.setattr(dtensor_sharding, "layout", lambda *a, **k: [
        {"kind": "layout", "device": d if ok else 0} for d in range(4)])
    return FakeChip(tmp, None, chips=4)


def _dtensor_train(tmp, mp, ok):
    gang = [{**s, "loss": s["loss"] * (1 if ok else 1.01)} for s in _train()]
    return FakeChip(tmp, lambda spec: _run(spec, gang if spec.mesh else _train()), chips=4)


def _mfu(tmp, mp, ok):
    return FakeChip(tmp, lambda spec: _gpt2_run(spec, 9.0 if ok else 0.9))


def _chip_metrics(tmp, mp, ok):
    hbm = 2e9 if ok else 6.0  # 6.0: a percentage of HBM where bytes belong
    samples = [{"kind": "tpu_metrics", "step": i, "duty_cycle_pct": 40.0,
                "duty_cycle_pct_per_chip": [40.0], "tensorcore_util_pct": 15.0,
                "hbm_used_bytes": hbm, "hbm_used_bytes_per_chip": [hbm]} for i in range(8)]
    return FakeChip(tmp, lambda spec: _run(spec, _train() + samples,
                                           chip_metrics={"samples": 8, "errors": {}}))


def _generation(tmp, mp, ok):
    from tpu_workbench.generation import runs

    runs_ = SimpleNamespace(errors={}, outputs=pd.DataFrame(
        {"mode": ["torch_eager", "tpu_compile"], "same_as_pytorch": [None, True]}),
        summary=pd.DataFrame({"mode": ["tpu_compile"], "strategy": ["static_cache"],
                              "compiles_total": [2 if ok else 9]}))  # 9: one per token
    mp.setattr(runs, "generate_many", lambda specs, **k: runs_)
    mp.setattr(runs, "specs_for", lambda *a, **k: [])
    return FakeChip(tmp, None)


def _calibration(tmp, mp, ok):
    from tpu_workbench.planning import predict

    low, high = (6.0, 8.0) if ok else (2.0, 3.0)
    mp.setattr(predict, "predict", lambda *a, **k: pd.DataFrame([{
        "predicted_step_min_ms": low, "predicted_step_max_ms": high, "bottleneck": "hbm"}]))
    return FakeChip(tmp, lambda spec: _gpt2_run(spec, 9.0))


def _serving(tmp, mp, ok):
    from tpu_workbench.scale import serve_launch
    from tpu_workbench.serving import serve

    measured = pd.DataFrame({"concurrency": [1, 8], "itl_mean_ms": [10.0, 12.0],
                             "ttft_ms": [50.0, 200.0]})
    scale = 1.1 if ok else 2.0  # predicted / measured
    mp.setattr(serve_launch, "missing", lambda: None)
    mp.setattr(serve_launch, "execute", lambda launch, out: measured)
    mp.setattr(serve, "serve_plan", lambda *a, **k: SimpleNamespace(frame=measured.assign(
        itl_mean_ms=measured.itl_mean_ms * scale, ttft_ms=measured.ttft_ms * scale)))
    return FakeChip(tmp, None)


SCENARIOS = {  # check -> (scenario, what its fail says)
    "detection": (_detection, "the worker sees 1 x cpu"),
    "device_kind": (_device_kind, "PCI says TPU v5e: they disagree"),
    "peaks_hbm": (_peaks_hbm, "HBM 16.00 GiB is 50% of the table's"),
    "memory": (_memory, "(inconsistent)"),
    "modes": (_modes, "losses differ from plain PyTorch: ['lazy']"),
    "timing": (_timing, "fastest 1.00 ms, the AdamW update's HBM floor on v6e: 1.82 ms"),
    "optimised_hlo": (_optimised_hlo, "0 with TPU tiled layouts"),
    "persistent_cache": (_persistent_cache, "0 hit(s), 3 deserialize failure(s)"),
    "profile": (_profile, "0 HLO op row(s)"),
    "pallas": (_pallas, "losses differ"),
    "spmd": (_spmd, "1 device(s) hold the layout"),
    "torchtpu_cache": (_torchtpu_cache, "24 compilation(s), 0 hit(s)"),
    "stablehlo": (_stablehlo, "0 with stablehlo ops"),
    "torchtpu_profile": (_torchtpu_profile, "0 not empty"),
    "dtensor": (_dtensor, "on 1 device(s)"),
    "dtensor_train": (_dtensor_train, "losses differ"),
    "mfu": (_mfu, "above what the HBM floor allows"),
    "chip_metrics": (_chip_metrics, "HBM in use 6 bytes"),
    "generation": (_generation, "static_cache compiled 9 time(s)"),
    "calibration": (_calibration, "passes within 1.50-3.75 ms"),
    "serving": (_serving, "worst 2.00"),
}


def test_every_wired_check_body_has_a_chip_scenario():
    wired = {c.key for c in acc.CHECKS if c.run is not None}
    assert set(SCENARIOS) == wired  # the 18 chip-only bodies and the chip form of the CPU two
    assert [c.key for c in acc.CHECKS if c.run is None] == ["ici"]  # not wired: no body to run


@pytest.mark.parametrize("plausible", [True, False], ids=["plausible", "implausible"])
@pytest.mark.parametrize("key", list(SCENARIOS))
def test_chip_check_body_against_fakes(key, plausible, tmp_path, monkeypatch):
    scenario, fails_with = SCENARIOS[key]
    check = next(c for c in acc.CHECKS if c.key == key)
    row = acc.run_check(check, scenario(tmp_path, monkeypatch, plausible))
    assert "where" not in row["figures"], row  # judged, not an exception
    if plausible:
        assert row["status"] == "pass", row
    else:
        assert row["status"] == "fail" and fails_with in row["detail"], row


def test_timing_says_when_synchronize_does_not_wait(tmp_path, monkeypatch):
    outcome = acc.check_timing(_timing(tmp_path, monkeypatch, True))
    assert outcome.status == "pass" and outcome.figures["synchronize_waits"] is False
    assert "synchronize does NOT wait" in outcome.detail


def test_mfu_band_is_the_hbm_floor_of_the_adamw_update():
    def row(ms):  # what summarize_results gives for a steady step of `ms`, figured by hand
        return {"mfu": GPT2_FLOPS / (ms / 1e3) / 918e12, "peak_tflops": 918.0,
                "peak_source": "v6e x1 bf16 peak (chip table)", "flops_per_step": GPT2_FLOPS,
                "n_params": GPT2_PARAMS, "achieved_tflops": 0.0, "steady_median_ms": ms}

    ok = judge.judge_mfu(row(9.0), "TPU v6 lite", "compile")  # 0.791%
    assert ok.status == "pass"
    assert ok.figures["mfu_high"] == pytest.approx(V6E_MFU_HIGH, rel=1e-3)
    assert ok.figures["mfu_low"] == pytest.approx(V6E_MFU_LOW, rel=1e-3)
    assert ok.figures["floor_ms"] == pytest.approx(V6E_FLOOR_MS, rel=1e-4)
    assert judge.judge_mfu(row(1.0), "TPU v6 lite", "compile").status == "fail"  # 7.1%
    assert "host-bound" in judge.judge_mfu(row(40.0), "TPU v6 lite", "compile").detail  # 0.18%
    assert judge.judge_mfu(row(9.0), "TPU v9", "compile").status == "fail"


def test_calibration_passes_within_a_quarter_of_the_predicted_range():
    def cal(ms):
        return {"predicted_step_min_ms": 6.0, "predicted_step_max_ms": 8.0,
                "measured_step_ms": ms, "in_range": 6.0 <= ms <= 8.0, "error": ms / 8 - 1}

    # 6 x 0.75 = 4.5 ms, 8 x 1.25 = 10 ms
    assert [judge.judge_calibration(cal(ms)).status for ms in (4.4, 4.6, 7.0, 9.9, 10.1)] == \
        ["fail", "pass", "pass", "pass", "fail"]


def test_peaks_and_hbm_are_the_runtimes_against_the_chip_table():
    v6e_gib = 32 * 2**30  # TorchTPU's total_memory of a 32 GiB chip
    assert judge.judge_peaks_hbm("TPU v6 lite", None, XM_DOCSTRING_LIMIT, "xm").status == "pass"
    assert judge.judge_peaks_hbm("TPU v5 lite", None, XM_DOCSTRING_LIMIT, "xm").status == "fail"
    assert judge.judge_peaks_hbm("TPU v6e", 918e12, v6e_gib, "torch.tpu").status == "pass"
    wrong_peak = judge.judge_peaks_hbm("TPU v6e", 459e12, v6e_gib, "torch.tpu")  # v5p's
    assert wrong_peak.status == "fail" and "459 TFLOP/s is not the table's" in wrong_peak.detail
    assert judge.judge_peaks_hbm("TPU v6 lite", None, None, "none").status == "fail"
    assert "not in the chip table" in judge.judge_peaks_hbm("TPU v9", None, v6e_gib, "x").detail


def test_torchtpu_memory_and_out_of_range_chip_metrics():
    summary = {"hbm_summary": "HBM: 12 MiB / 32 GiB", "hbm_bytes": 32 * 2**30,
               "device_memory_source": "torch.tpu._hbm_usage_summary()"}
    assert judge.judge_memory(summary, TINY_PARAMS, "TPU v6e").status == "pass"
    assert judge.judge_memory(summary, TINY_PARAMS, "TPU v5e").status == "fail"  # 16 GiB chip
    assert judge.judge_memory({"device_memory_source": "n/a"}, TINY_PARAMS, "TPU v6e").status \
        == "fail"
    sample = {"kind": "tpu_metrics", "duty_cycle_pct": 140.0, "hbm_used_bytes": 2e9}
    over = judge.judge_chip_metrics([sample], None, TINY_PARAMS, "TPU v6e")
    assert over.status == "fail" and "1 percentage(s) outside 0-100" in over.detail
    assert "not sampled: no TPU chip" in judge.judge_chip_metrics(
        [], "no TPU chip", TINY_PARAMS, "TPU v6e").detail
