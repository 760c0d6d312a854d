"""Launch plans for multi-host TPU slices (``tpu-workbench launch``,
:mod:`tpu_workbench.scale.launch`).

The plans are checked against the published slice shapes (v6e-16 = 4 hosts x 4 chips, v6e-32 =
8 x 4), and their commands are run, as printed, through bash with stand-ins for gcloud, curl,
the hosts' interpreters, torchrun and Ray: each stand-in records what it was given, so the
tests see what every host would run (its rank, its peers' addresses, its environment).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tpu_workbench.cli import main
from tpu_workbench.errors import SpecError
from tpu_workbench.planning import slice_plan as sp
from tpu_workbench.runs.spec import ExperimentSpec
from tpu_workbench.scale import launch as ln

# Published: v6e-16 is a 4x4 slice of 4 hosts with 4 chips each, v6e-32 4x8 with 8 hosts
# (Cloud TPU docs; field notes scale_and_ecosystem.md).
PUBLISHED = {"v6e-16": (4, 4, "4x4"), "v6e-32": (8, 4, "4x8")}
ENDPOINTS = "unknown:unknown:10.0.0.1,unknown:unknown:10.0.0.2,unknown:unknown:10.0.0.3," \
            "unknown:unknown:10.0.0.4"
KEYS = ["PJRT_DEVICE", "TPU_WORKER_HOSTNAMES", "MASTER_ADDR", "MASTER_PORT", "NNODES",
        "NODE_RANK", "TORCH_TPU_DEVICES_PER_HOST", "TORCH_TPU_TOPOLOGY"]

RECORDER = f"""#!{sys.executable}
import json, os, sys
if sys.argv[1:3] == ["-m", "pip"]:
    sys.exit(0)  # the container's set-up: nothing to install here
rec = {{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "cwd": os.getcwd(),
        "env": {{k: os.environ.get(k) for k in {KEYS!r}}}}}
with open(os.path.join(os.environ["HOME"], "record.json"), "w") as f:
    json.dump(rec, f)
"""
# gcloud: `auth list` names an account; `compute tpus tpu-vm ssh` runs --command in bash on
# each host it names (a folder per host stands in for its home directory).
FAKE_GCLOUD = f"""#!{sys.executable}
import argparse, os, subprocess, sys
if sys.argv[1:3] == ["auth", "list"]:
    print("someone@example.com")
    sys.exit(0)
p = argparse.ArgumentParser()
p.add_argument("words", nargs=5)
p.add_argument("--zone"); p.add_argument("--project")
p.add_argument("--worker", required=True); p.add_argument("--command", required=True)
a = p.parse_args()
assert a.words[:4] == ["compute", "tpus", "tpu-vm", "ssh"], a.words
if os.environ.get("FAKE_FAIL"):  # host FAKE_FAIL fails at once, the others wait for it
    if a.worker == os.environ["FAKE_FAIL"]:
        sys.exit(3)
    import time
    time.sleep(120)
hosts = range(int(os.environ["FAKE_HOSTS"])) if a.worker == "all" else [int(a.worker)]
for i in hosts:
    env = dict(os.environ, HOME=os.path.join(os.environ["FAKE_ROOT"], f"host{{i}}"))
    subprocess.run(["bash", "-c", a.command], env=env, check=True)
"""
FAKE_CURL = """#!/bin/sh
echo "$FAKE_ENDPOINTS"
"""


def _exe(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def hosts(tmp_path, monkeypatch):
    """Four stand-in hosts with the repo's interpreters, and gcloud and curl on PATH."""
    bin_dir = tmp_path / "bin"
    _exe(bin_dir / "gcloud", FAKE_GCLOUD)
    _exe(bin_dir / "curl", FAKE_CURL)
    for name in ("python3", "torchrun"):
        _exe(bin_dir / name, RECORDER)
    for i in range(4):
        repo = tmp_path / f"host{i}" / "tpu-workbench"
        _exe(repo / ".venv" / "bin" / "python", RECORDER)
        _exe(repo / ".venv-torchtpu" / "bin" / "torchrun", RECORDER)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ROOT", str(tmp_path))
    monkeypatch.setenv("FAKE_HOSTS", "4")
    monkeypatch.setenv("FAKE_ENDPOINTS", ENDPOINTS)
    return tmp_path


def _record(home: Path) -> dict:
    return json.loads((home / "record.json").read_text())


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# --------------------------------------------------------------------------------------------
# v6e-16 and v6e-32, both runtimes, every launcher: the library
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("slice_name", list(PUBLISHED))
@pytest.mark.parametrize("runtime", list(ln.RUNTIMES))
@pytest.mark.parametrize("via", list(ln.VIAS))
def test_plan_has_every_host_of_the_slice(slice_name, runtime, via):
    n_hosts, per_host, topology = PUBLISHED[slice_name]
    plan = ln.launch_plan(slice_name, runtime, via, cluster="c1", check_model=False)
    assert (plan.hosts, plan.chips_per_host, plan.topology) == (n_hosts, per_host, topology)
    assert plan.mesh == (n_hosts * per_host,)  # fsdp: every chip of the slice on one axis
    assert [h.index for h in plan.host_plans] == list(range(n_hosts))
    for h in plan.host_plans:
        argv = list(h.argv)
        if runtime == "torch_xla":
            assert h.env["PJRT_DEVICE"] == "TPU" and _after(argv, "--mesh") == str(plan.chips)
            assert argv[1:4] == ["-m", "tpu_workbench", "shard"]
        else:
            assert [_after(argv, f) for f in ("--nnodes", "--node_rank", "--nproc_per_node")] \
                == [str(n_hosts), str(h.index), str(per_host)]
            assert h.env["NODE_RANK"] == str(h.index) and h.env["NNODES"] == str(n_hosts)
            assert h.env["TORCH_TPU_DEVICES_PER_HOST"] == str(per_host)
            assert h.env["MASTER_PORT"] == "29500" and "MASTER_ADDR" in h.env
            assert argv[-2] == ln.GANG_MODULE and _after(argv, "--master_addr")
    if via == "gcloud":
        workers = [next(w for w in shlex.split(c) if w.startswith("--worker=")) for c in
                   plan.launch]
        assert workers == (["--worker=all"] if runtime == "torch_xla" else
                           [f"--worker={i}" for i in range(n_hosts)])


def test_plans_with_hostnames_are_literal_and_tp_uses_the_slice_mesh():
    names = [f"10.1.0.{i}" for i in range(8)]
    plan = ln.launch_plan("v6e-32", "torch_tpu", "gcloud", strategy="dp_tp", hostnames=names,
                          check_model=False)
    assert plan.mesh == (4, 8)  # 4x8: the model axis along the last physical axis, 8 chips
    assert all(h.env["TPU_WORKER_HOSTNAMES"] == ",".join(names) for h in plan.host_plans)
    assert all(_after(list(h.argv), "--master_addr") == "10.1.0.0" for h in plan.host_plans)
    assert "metadata" not in plan.script  # nothing to look up on the hosts
    assert ln.launch_plan("v6e-16", mesh="2x8", strategy="tp", check_model=False).mesh == (2, 8)


# --------------------------------------------------------------------------------------------
# The commands run as printed (bash, stand-in tools)
# --------------------------------------------------------------------------------------------
def test_printed_gcloud_torch_tpu_plan_starts_every_host_with_its_rank(hosts):
    plan = ln.launch_plan("v6e-16", "torch_tpu", "gcloud", zone="us-east5-b", steps=3,
                          check_model=False)
    # the printed plan, as a reader copies it: comments, four ssh commands in the background
    subprocess.run(["bash", "-c", plan.text()], cwd=hosts, check=True)
    for i in range(4):
        home = hosts / f"host{i}"
        rec = _record(home)
        assert rec["prog"] == "torchrun" and rec["cwd"] == str(home / "tpu-workbench")
        assert _after(rec["argv"], "--node_rank") == str(i)
        assert _after(rec["argv"], "--master_addr") == "10.0.0.1"  # worker 0, from metadata
        assert rec["env"]["TPU_WORKER_HOSTNAMES"] == "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4"
        assert rec["env"]["NODE_RANK"] == str(i) and rec["env"]["TORCH_TPU_TOPOLOGY"] == "4x4"
        job = json.loads((home / "tpu-workbench" / rec["argv"][-1]).read_text())
        spec = ExperimentSpec.from_dict(job["spec"])  # what the gang's rank program reads
        assert (spec.mesh, spec.mode, spec.steps, job["device"]) == ((16,), "tpu_compile", 3,
                                                                      "tpu")


def test_execute_ends_every_host_when_one_fails(hosts, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "1")
    plan = ln.launch_plan("v6e-16", "torch_tpu", "gcloud", check_model=False)
    codes = ln.execute(plan, workdir=str(hosts), poll_s=0.05)
    assert codes[1] == 3 and all(c != 0 for c in codes)  # the waiting hosts were ended


def test_execute_gcloud_torch_xla_runs_one_command_on_all_hosts(hosts):
    plan = ln.launch_plan("v6e-16", "torch_xla", "gcloud", strategy="dp_tp", batch_size=8,
                          check_model=False)
    assert ln.execute(plan, workdir=str(hosts)) == [0]
    for i in range(4):
        rec = _record(hosts / f"host{i}")
        assert rec["env"]["PJRT_DEVICE"] == "TPU"
        assert [_after(rec["argv"], f) for f in ("--mesh", "--strategy", "--batch-size")] \
            == ["4x4", "dp_tp", "8"]


def xpk_workload_create_subset() -> argparse.ArgumentParser:
    """A FAITHFUL SUBSET of xpk 1.16.0's ``xpk workload create`` parser, copied from its
    xpk/parser/workload.py, common.py and validators.py: the flags a plan uses, their types,
    required-ness, the --tpu-type / --device-type exclusive group and xpk's name pattern, with
    the v6e / v5litepod / v5p names of its core/system_characteristics.py. xpk's own parser is
    not used: it imports xpk's commands, which need kubernetes, the google-cloud clients and
    pins (packaging==24.2, urllib3<2.6) that would downgrade this environment."""

    def name_type(value, pat=re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")):
        match = pat.fullmatch(value)
        if not match or len(match.group(0)) > 40:
            raise argparse.ArgumentTypeError(f"Name must be less than 40 characters and match "
                                             f"the pattern `{pat.pattern}`")
        return value

    tpu_types = ([f"v6e-{n}" for n in (1, 4, 8, 16, 32, 64, 128, 256)]
                 + [f"v5litepod-{n}" for n in (8, 16, 32, 64, 128, 256)]
                 + [f"v5p-{n}" for n in (8, 16, 32, 64, 128)])
    parser = argparse.ArgumentParser(prog="xpk")
    create = parser.add_subparsers(dest="group", required=True).add_parser("workload") \
        .add_subparsers(dest="verb", required=True).add_parser("create")
    create.add_argument("--workload", type=name_type, required=True)
    create.add_argument("--cluster", type=name_type, required=True)
    create.add_argument("--command", type=str, required=True)
    device = create.add_mutually_exclusive_group(required=True)
    device.add_argument("--tpu-type", type=str, choices=tpu_types)
    device.add_argument("--device-type", type=str)
    create.add_argument("--num-slices", type=int, default=1)
    for flag in ("--project", "--zone", "--docker-image"):
        create.add_argument(flag, type=str, default=None)
    create.add_argument("--env", action="append", type=str)
    return parser


@pytest.mark.parametrize("runtime", list(ln.RUNTIMES))
def test_xpk_command_parses_and_each_pod_gets_its_rank(hosts, monkeypatch, runtime):
    plan = ln.launch_plan("v6e-16", runtime, "xpk", cluster="tpu-cluster", zone="us-east5-b",
                          check_model=False)
    args = xpk_workload_create_subset().parse_args(shlex.split(plan.launch[0])[1:])
    assert (args.cluster, args.tpu_type, args.num_slices, args.zone) == (
        "tpu-cluster", "v6e-16", 1, "us-east5-b")
    # Run the pod's command as GKE would in pod 2 (the working directory copied into it).
    pod = hosts / "pod"
    pod.mkdir()
    env = dict(os.environ, HOME=str(pod), JOB_COMPLETION_INDEX="2",
               TPU_WORKER_HOSTNAMES="10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4")
    subprocess.run(["bash", "-c", args.command], cwd=pod, env=env, check=True)
    rec = _record(pod)
    if runtime == "torch_xla":
        assert rec["prog"] == "python3" and rec["env"]["PJRT_DEVICE"] == "TPU"
    else:
        assert rec["prog"] == "torchrun" and _after(rec["argv"], "--node_rank") == "2"
        assert _after(rec["argv"], "--master_addr") == "10.0.0.1"
        assert rec["env"]["NODE_RANK"] == "2"


def test_v5e_goes_by_cloud_tpu_names():
    plan = ln.launch_plan("v5e-16", "torch_xla", "xpk", cluster="c1", check_model=False)
    args = xpk_workload_create_subset().parse_args(shlex.split(plan.launch[0])[1:])
    assert args.tpu_type == "v5litepod-16" and plan.hosts == 4  # xpk's and gcloud's name
    ray_plan = ln.launch_plan("v5litepod-16", "torch_xla", "ray", check_model=False)
    assert 'slice_placement_group("4x4", "v5litepod")' in ray_plan.files["launch_v5e_16.py"]


FAKE_RAY = {
    "ray/__init__.py": '''
import os
from . import util
def init(*a, **k): pass
def get(refs, timeout=None): return refs
class _Remote:
    def __init__(self, fn, opts=None): self.fn, self.opts = fn, opts or {}
    def options(self, **o): return _Remote(self.fn, {**self.opts, **o})
    def remote(self, *a, **k):
        b = self.opts["scheduling_strategy"].placement_group_bundle_index
        util.BUNDLE = b
        os.environ["TPU_WORKER_ID"] = str(3 - b)  # bundles in reverse worker order
        os.environ["HOME"] = os.path.join(os.environ["FAKE_ROOT"], f"host{3 - b}")
        return self.fn(*a, **k)
def remote(*a, **k):
    return _Remote(a[0]) if a and callable(a[0]) else _Remote
''',
    "ray/util/__init__.py": '''
BUNDLE = None
def get_node_ip_address(): return f"10.0.1.{BUNDLE}"
''',
    "ray/util/tpu.py": '''
import os
class _PG:
    def ready(self): return None
class _Slice:
    placement_group = _PG()
def slice_placement_group(topology, accelerator_version, **kwargs):
    open(os.path.join(os.environ["FAKE_ROOT"], "slice.txt"), "w").write(
        f"{topology} {accelerator_version}")
    return _Slice()
''',
    "ray/util/scheduling_strategies.py": '''
class PlacementGroupSchedulingStrategy:
    def __init__(self, placement_group, placement_group_bundle_index=-1, **kw):
        self.placement_group_bundle_index = placement_group_bundle_index
''',
}


def test_ray_driver_places_host_i_on_worker_i(hosts):
    plan = ln.launch_plan("v6e-16", "torch_tpu", "ray", check_model=False)
    (name, driver), = plan.files.items()
    ast.parse(driver)
    for path, text in FAKE_RAY.items():
        (hosts / "fake" / path).parent.mkdir(parents=True, exist_ok=True)
        (hosts / "fake" / path).write_text(text)
    (hosts / name).write_text(driver)
    env = dict(os.environ, PYTHONPATH=str(hosts / "fake"))
    subprocess.run([sys.executable, name], cwd=hosts, env=env, check=True)
    assert (hosts / "slice.txt").read_text() == "4x4 v6e"
    for i in range(4):  # worker i sits on bundle 3 - i, whose node's IP is 10.0.1.(3 - i)
        rec = _record(hosts / f"host{i}")
        assert _after(rec["argv"], "--node_rank") == str(i)
        assert rec["env"]["TPU_WORKER_HOSTNAMES"] == "10.0.1.3,10.0.1.2,10.0.1.1,10.0.1.0"
        assert _after(rec["argv"], "--master_addr") == "10.0.1.3"


def test_ray_names_and_chips_per_host_agree_with_ray():
    ray_tpu = pytest.importorskip("ray.util.tpu")
    from ray._private.accelerators.tpu import VALID_TPU_TYPES, get_chips_per_host
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    assert {"topology", "accelerator_version"} <= set(
        inspect.signature(ray_tpu.slice_placement_group).parameters)
    assert {"placement_group", "placement_group_bundle_index"} <= set(
        inspect.signature(PlacementGroupSchedulingStrategy).parameters)
    from tpu_workbench.environment.chips import SLICES

    for sl in SLICES.values():
        if sl.hosts > 1:  # Ray's own rule for hosts; v6e-8 is 1 host of 8 in the table
            version = ln.ray_accelerator_version(sl)
            assert version in VALID_TPU_TYPES
            assert get_chips_per_host(sl.topology_text, version) == sl.chips_per_host, sl.name


# --------------------------------------------------------------------------------------------
# Impossible requests, and --execute without the tool
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"slice_name": "3x3"}, r"no v6e slice has topology '3x3'; v6e topologies: .*4x4 \(v6e-16\)"),
    ({"slice_name": "v6e-12"}, r"unknown TPU slice 'v6e-12'; known slices: v6e-1, v6e-4"),
    ({"slice_name": "v7-16"}, r"unknown TPU chip 'v7'.*known chips: v5e, v6e, v5p"),
    ({"mesh": "8x4"}, r"mesh 8x4 has 32 devices but v6e-16 has 16 chips.*16 or one of .*4x4"),
    ({"mesh": "16", "strategy": "tp"}, r"'tp' needs a 2-D.*v6e-16: 4x4"),
    ({"runtime": "jax"}, r"unknown runtime 'jax'; valid: torch_xla, torch_tpu"),
    ({"via": "slurm"}, r"unknown launcher 'slurm'.*gcloud, xpk, ray"),
    ({"runtime": "torch_tpu", "mode": "lazy"}, r"torch_tpu modes: tpu_eager, tpu_fused"),
    ({"via": "xpk"}, r"--via xpk needs --cluster"),
    ({"hostnames": ["a", "b"]}, r"2 hostname\(s\) given but v6e-16 has 4 host"),
    ({"name": "My_TPU"}, r"TPU name 'My_TPU' must be"),
])
def test_impossible_requests_say_what_is_valid(kwargs, match):
    kwargs = {"slice_name": "v6e-16", **kwargs}
    with pytest.raises(SpecError, match=match):
        ln.launch_plan(check_model=False, **kwargs)


def test_cli_plans_both_slices_and_refuses_bad_batch(capsys):
    for slice_name, (n_hosts, per_host, _) in PUBLISHED.items():
        assert main(["launch", "--slice", slice_name, "--runtime", "torch_tpu", "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert (plan["hosts"], plan["chips_per_host"], len(plan["host_plans"])) == (
            n_hosts, per_host, n_hosts)
        assert plan["mesh"] == [n_hosts * per_host] and len(plan["launch"]) == n_hosts
    # the spec options are checked as a run checks them: fsdp splits the batch 16 ways
    assert main(["launch", "--slice", "v6e-16", "--batch-size", "10"]) == 2
    assert "batch_size=10 does not divide" in capsys.readouterr().err


@pytest.mark.parametrize("via, tools, said", [
    ("gcloud", [], "`gcloud` is not on PATH"),
    ("gcloud", ["gcloud"], "gcloud has no active credentials"),
    ("xpk", ["gcloud"], "`xpk` is not on PATH"),
    ("ray", ["python"], "no Ray cluster to join"),
])
def test_execute_without_the_tool_says_so_and_runs_nothing(tmp_path, monkeypatch, capsys, via,
                                                           tools, said):
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    for tool in tools:  # stand-ins that log every call; this gcloud lists no account
        _exe(bin_dir / tool, f'#!/bin/sh\necho "$0 $*" >> {calls}\n')
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ln, "RAY_CLUSTER_FILE", str(tmp_path / "no-ray-cluster"))
    argv = ["launch", "--slice", "v6e-16", "--via", via, "--cluster", "c1", "--execute"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "# every host (0-3)" in out  # the plan is printed first
    assert said in err and "nothing was run" in err
    logged = calls.read_text().splitlines() if calls.exists() else []
    assert all(line.endswith("auth list --filter=status:ACTIVE --format=value(account)")
               for line in logged)  # at most the credentials were asked for
    assert not list(tmp_path.glob("launch_*.py"))  # no Ray driver written either


# --------------------------------------------------------------------------------------------
# Collectives per step on the slice
# --------------------------------------------------------------------------------------------
def test_step_collectives_per_strategy():
    """What each strategy sends per step (Megatron-LM, ZeRO-3), on the slice's torus: the kinds,
    counts and bytes here; their times are the one ICI model's (tests/test_ici.py)."""
    gb = 1e9
    # dp of 1e9 fp32 params on v6e-16 (4x4): one all-reduce of the 4 GB of gradients over
    # every chip, so along both axes of the torus
    (row,) = sp.step_collectives(10**9, 1024, 8, "v6e-16", "dp", 32, 128)
    assert (row["kind"], row["physical_axes"], row["bytes"]) == ("all-reduce", "4x4", 4 * gb)
    # fsdp: the parameters gathered for the forward and again for the backward pass, the
    # gradients reduce-scattered
    rows = sp.step_collectives(10**9, 1024, 8, "v6e-16", "fsdp", 32, 128)
    assert [r["kind"] for r in rows] == ["all-gather", "all-gather", "reduce-scatter"]
    assert {r["bytes"] for r in rows} == {4 * gb}
    # tp, 8 layers: 2 all-reduces forward and 2 backward per layer, of one layer's activations
    # b*s*h*4 B, over the model axis: 4 chips along one axis of v6e-16, 16 (a ring) on v6e-256
    (tp16,) = sp.step_collectives(10**9, 1024, 8, "v6e-16", "tp", 32, 128)
    v = 32 * 128 * 1024 * 4
    assert (tp16["count"], tp16["bytes"], tp16["physical_axes"]) == (32, v, "4")
    (tp256,) = sp.step_collectives(10**9, 1024, 8, "v6e-256", "tp", 32, 128)
    assert tp256["physical_axes"] == "16"
    assert tp256["estimated_us"] < tp16["estimated_us"]  # a wrapped ring of 16 beats a line
    # dp_tp on 4x4: activations of a quarter of the batch, gradients a quarter each chip
    act, grad = sp.step_collectives(10**9, 1024, 8, "v6e-16", "dp_tp", 32, 128)
    assert act["bytes"] == v / 4 and grad["bytes"] == 4 * gb / 4
    with pytest.raises(SpecError, match="has 32 devices"):
        sp.step_collectives(10**9, 1024, 8, "v6e-16", "dp", 32, 128, mesh=(32,))
