"""``port`` on the suite's own broken models: every planted blocker named at its line (the
``# BLOCKER: kind`` comments of tests/models/port_*.py), the shape and device fixes tried and
measured, the edits a line needs run on a patched copy (the model's file untouched), a Dynamo
crash kept as a finding, and nothing reported on the workbench's clean models.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import tpu_workbench as wb
from tpu_workbench.porting import patch
from tpu_workbench.porting.findings import _device_fix

MODELS = Path(__file__).parent / "models"
REF = {"shapes": "tests/models/port_shapes.py:make", "masks": "tests/models/port_masks.py:make"}


def planted(name: str) -> set[tuple[str, int]]:
    """(kind, line) of every ``# BLOCKER: kind`` comment in tests/models/port_<name>.py."""
    lines = (MODELS / f"port_{name}.py").read_text().splitlines()
    return {(m[1], i) for i, text in enumerate(lines, 1)
            if (m := re.search(r"# BLOCKER: (\w+)", text))}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    sources = {name: (MODELS / f"port_{name}.py").read_text() for name in REF}
    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path_factory.mktemp("results")))
    pool = wb.WorkerPool(max_workers=1)
    heard: list[str] = []
    try:
        out = {name: wb.port(ref, out=tmp_path_factory.mktemp(name), pool=pool,
                             on_progress=heard.append) for name, ref in REF.items()}
        # the clean ones, kept short: 3 steps (the fewest port takes), small batches
        for model, preset in (("mingpt", "tiny"), ("resnet", "tiny"), ("hf:llama", "tiny")):
            out[model] = wb.port(model, preset, steps=3, batch_size=4, pool=pool)
        out["heard"] = heard
        out["untouched"] = all((MODELS / f"port_{name}.py").read_text() == text
                               for name, text in sources.items())
        yield out
    finally:
        pool.shutdown()
        mp.undo()


@pytest.mark.parametrize("name", list(REF))
def test_every_planted_blocker_is_named_at_its_line(reports, name):
    found = reports[name].findings
    mine = found[found["file"].str.endswith(f"port_{name}.py")]
    assert planted(name) <= set(zip(mine["kind"], mine["line"], strict=True)), found
    assert (found["where"] != "").all() and (found["fix"] != "").all()
    # only lines of the model's file: nothing inside torch, torch_xla or the workbench
    assert set(found["file"]) == {str(MODELS / f"port_{name}.py")}


def test_the_shape_and_device_fixes_were_tried_and_helped(reports):
    found = reports["shapes"].findings.set_index("kind")
    shapes = found.loc["shapes"]
    assert "'tokens' dim 1" in shapes["evidence"] and "[32, 64]" in shapes["fix"]
    before, after = map(int, re.search(r"compilations after the first step (\d+) -> (\d+)",
                                       shapes["verified"]).groups())
    assert before >= 3 > after  # a new length almost every step, then only the buckets
    device = found.loc["cpu_tensor"]
    assert "torch.arange(tokens.shape[1], device=tokens.device)" in device["fix"]
    assert re.search(r"CPU copies at this line 1 -> 0 per step", device["verified"])
    # the print of .item(), moved into a step closure in a patched copy: no read cuts the step
    read = found.loc["host_read"]
    assert "xm.add_step_closure(lambda: print(" in read["fix"]
    assert re.search(r"host reads at this line 1 -> 0 per step \(in patched/port_shapes.py\); "
                     r"graph executions per step (\d+) -> 1", read["verified"]), read["verified"]
    assert int(re.search(r"executions per step (\d+)", read["verified"])[1]) >= 2
    assert not pd.isna(read["cost_s"])
    steps = reports["shapes"].steps
    assert {"as written", "pad to buckets", "on device", "edited"} == set(steps["variant"])
    padded = steps[steps["variant"] == "pad to buckets"]
    assert padded["compiles"].iloc[-1] == 0  # the last step of the padded run compiles nothing
    assert found["cost_s"].iloc[0] == reports["shapes"].findings["cost_s"].max()  # costliest first


def test_a_model_that_crashes_under_dynamo_still_gets_its_report_and_the_other_kinds(reports):
    found = reports["masks"].findings
    crash = found[found["kind"] == "dynamo_crash"].iloc[0]
    assert "two different devices" in crash["evidence"]
    assert crash["line"] == dict((k, i) for k, i in planted("masks"))["cpu_tensor"]
    # the tensor attribute, moved to the device as a buffer would be, no longer crosses
    device = found[found["kind"] == "cpu_tensor"].iloc[0]
    assert device["verified"].startswith("CPU copies at this line 1 -> 0 per step")
    fallback = found[found["kind"] == "fallback"].iloc[0]
    assert "aten::median" in fallback["evidence"]  # its edit: test_the_edits_a_line_needs_...
    float64 = found[found["kind"] == "float64"].iloc[0]
    assert "torch.float32" in float64["fix"] and "-> 0 per step" in float64["verified"]


def test_the_edits_a_line_needs_run_on_a_copy_and_keep_the_result(reports):
    found = reports["masks"].findings.set_index("kind")
    masked = found.loc["data_dependent"]
    assert "torch.where(h > 0.5, h, 0).sum() / (h > 0.5).sum()" in masked["fix"]
    before, after = map(int, re.search(r"compilations after the first step (\d+) -> (\d+)",
                                       masked["verified"]).groups())
    assert before >= 3 and after == 0  # a new mask size every step, then one program
    assert "data-dependent ops at this line 1 -> 0 per step" in masked["verified"]
    median = found.loc["fallback"]
    assert "h.sort(dim=0).values.select(0, (h.shape[0] - 1) // 2)" in median["fix"]
    assert "aten::median runs on the CPU 1 -> 0 per step" in median["verified"]
    losses = re.search(r"loss ([\d.]+) -> ([\d.]+)", masked["verified"]).groups()
    assert losses[0] == losses[1]  # the same model: the edits changed no result
    assert reports["untouched"]  # the model files themselves were never written


def test_patch_edits_one_line_only_where_the_edit_is_mechanical():
    closure = patch.edit("host_read", '    print(f"{loss.item():.3f}")  # log\n')
    assert closure.splitlines() == ["    " + patch.IMPORT,
                                    '    xm.add_step_closure(lambda: print(f"{loss.item():.3f}"))'
                                    "  # log"]
    assert patch.edit("host_read", "    v = out.item()") == "    v = out.detach()"
    assert patch.edit("host_read", "    if loss.item() > 3:") is None  # control flow: the author's
    assert patch.edit("data_dependent", "s = x[m].sum()") == "s = torch.where(m, x, 0).sum()"
    assert patch.edit("data_dependent", "i = x.nonzero()") is None
    assert patch.edit("fallback", "y = x.median(dim=-1).values") == \
        "y = x.sort(dim=-1).values.select(-1, (x.shape[-1] - 1) // 2)"
    assert patch.edit("fallback", "y = x.median()") is None
    t = torch.tensor([[3.0, -1.0, 2.0, 5.0], [7.0, 0.0, 1.0, 4.0]])  # even: the lower middle
    assert torch.equal(t.median(dim=-1).values,
                       eval(patch.edit("fallback", "t.median(dim=-1).values")))


def test_the_report_files_are_written_whole(reports):
    out = reports["shapes"].out
    assert sorted(p.name for p in out.iterdir()) == ["findings.csv", "patched", "report.json",
                                                     "steps.csv"]
    assert sorted(p.name for p in (out / "patched").iterdir()) == ["port_shapes.py",
                                                                  "port_shapes.py.diff"]
    assert "+    xm.add_step_closure" in (out / "patched" / "port_shapes.py.diff").read_text()
    on_disk = pd.read_csv(out / "findings.csv")
    assert list(on_disk["kind"]) == list(reports["shapes"].findings["kind"])
    assert any("Dynamo" in h for h in reports["heard"])  # progress named each pass


@pytest.mark.parametrize("model", ["mingpt", "resnet", "hf:llama"])
def test_clean_models_report_nothing_and_say_what_was_checked(reports, model):
    report = reports[model]
    assert report.clean, report.findings
    assert "no TPU blockers found" in report.text()
    assert any("Dynamo" in c for c in report.checked) and len(report.checked) >= 6


def test_bad_input_is_a_clear_message_not_a_traceback(tmp_path):
    cli = [sys.executable, "-m", "tpu_workbench", "port", "--out", str(tmp_path / "r")]
    missing = subprocess.run([*cli, "--model", "no/such_file.py:make"], capture_output=True,
                             text=True)
    assert missing.returncode == 2 and "no/such_file.py" in missing.stderr
    assert "does not exist" in missing.stderr and "Traceback (most recent" not in missing.stderr
    raising = tmp_path / "raising.py"
    raising.write_text("def make():\n    raise RuntimeError('no config for this size')\n")
    with pytest.raises(wb.SpecError, match=r"calling make\(\) in .*raised RuntimeError: no conf"):
        wb.port(f"{raising}:make")
    with pytest.raises(wb.SpecError, match="without make_batch|make_batch"):
        wb.port("tests/models/bad_return.py:make_half")
    with pytest.raises(wb.SpecError, match="steps >= 3"):
        wb.port("mingpt", "tiny", steps=2)


def test_a_factory_call_moved_onto_the_device():
    assert _device_fix("p = torch.arange(n).to(x.device)") == "p = torch.arange(n, device=x.device)"
    made = _device_fix("m = torch.ones(3, 4).to(dev)  # c")
    assert made == "m = torch.ones(3, 4, device=dev)  # c"
    assert _device_fix("m = torch.ones(3, device=d).to(dev)") == ""  # not that mechanical
    assert _device_fix("h = x * self.scale") == ""
