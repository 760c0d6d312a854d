"""Launch plans for multi-host TPU slices: the exact commands and environment every host of a
slice runs, for torch_xla (one SPMD process per host) or TorchTPU (torchrun, a process per
chip), started through gcloud (TPU VMs), xpk (GKE) or Ray.

Pure: primitives in (a slice name, a runtime, a launcher and the spec options), text out; it
runs nothing. Hosts and chips per host come from the one slice table
(:data:`tpu_workbench.environment.chips.SLICES`). :func:`execute` runs a plan only where its tool
and credentials exist and otherwise says which is missing, before anything starts.

Every host must start: torch_xla's multi-host SPMD and TorchTPU's rendezvous both wait for all
hosts, and a slice with one host missing hangs (pytorch/xla#9681, #8295). So every launcher
below starts all hosts at once: gcloud's ``--worker=all`` (or one ssh per host, run together),
one xpk workload (a JobSet of one pod per host), or one Ray task per host of a slice placement
group.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..environment.chips import Slice, get_slice
from ..environment.runtimes import Runtime
from ..errors import SpecError
from ..planning.slice_plan import check_mesh
from ..runs.spec import MODES
from ..sharding.mesh import mesh_text, strategy_name

RUNTIMES: dict[str, str] = {
    "torch_xla": "one SPMD process per host, PJRT_DEVICE=TPU, the mesh over every chip",
    "torch_tpu": "TorchTPU: torchrun on every host, one process per chip (tpu_dist)",
}
VIAS: dict[str, str] = {
    "gcloud": "gcloud compute tpus tpu-vm ssh (a queued or created TPU VM slice)",
    "xpk": "xpk workload create (GKE; a JobSet with one pod per host)",
    "ray": "a Ray driver: ray.util.tpu slice placement group, one task per host",
}
_RUNTIME_OF = {r.launch_name: r for r in Runtime if r.launch_name}  # "torch_xla" -> Runtime.XLA
DEFAULT_MODE = {"torch_xla": "compile", "torch_tpu": "tpu_compile"}
MASTER_PORT = 29500  # torchrun's and TorchTPU's default rendezvous port
TITAN_MODULE = "tpu_workbench.worker.titan"  # TorchTitan's trainer, one rank per chip
GANG_MODULE = "tpu_workbench.worker.gang"  # the rank program torchrun starts: one per chip,
# reading its job (spec, device, records folder) from the JSON file named by its argument
METADATA = "http://metadata.google.internal/computeMetadata/v1/instance/attributes"
# On a TPU VM every host reads its slice's hosts from the metadata server (as JAX's
# cloud_tpu_cluster does): "unknown:unknown:10.0.0.2,unknown:unknown:10.0.0.3,...", worker 0 first.
HOSTNAMES_FROM_METADATA = (
    f'export TPU_WORKER_HOSTNAMES="$(curl -sf -H Metadata-Flavor:Google '
    f'{METADATA}/worker-network-endpoints | tr , "\\n" | cut -d: -f3 | paste -sd, -)"')
MASTER_FROM_HOSTNAMES = 'export MASTER_ADDR="${TPU_WORKER_HOSTNAMES%%,*}"'
# What a fresh xpk container (xpk's base image with the working directory copied in) installs.
XPK_SETUP = {
    "torch_xla": "python3 -m pip install -q -e '.[tpu]'",
    "torch_tpu": "python3 -m pip install -q -r requirements-torchtpu.txt && "
                 "python3 -m pip install -q --no-deps -e .",
}
_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # xpk's name_type (xpk/parser/validators.py)


class Shell(str):
    """A shell word written as the host must see it (``"$JOB_COMPLETION_INDEX"``), not quoted."""


def _word(w: Any) -> str:
    return str(w) if isinstance(w, Shell) else shlex.quote(str(w))


@dataclass(frozen=True)
class HostPlan:
    """What one host of the slice runs: its environment and its program (``argv``), and the
    shell text that sets both up (``command``). Values the host finds out when it starts
    (its peers' addresses) are shell expressions (``$TPU_WORKER_HOSTNAMES``...)."""

    index: int
    env: dict[str, str]
    argv: tuple[str, ...]
    command: str


@dataclass(frozen=True)
class LaunchPlan:
    """How to run one experiment on every host of a slice (:func:`launch_plan`)."""

    slice: str
    chip: str
    topology: str
    hosts: int
    chips_per_host: int
    runtime: str
    via: str
    mesh: tuple[int, ...]
    strategy: str
    spec: dict[str, Any]
    host_plans: tuple[HostPlan, ...]
    launch: tuple[str, ...]  # shell commands run from your machine, all of them at once
    files: dict[str, str] = field(default_factory=dict)  # files the launch commands read
    tools: tuple[str, ...] = ()  # programs --execute needs on PATH
    notes: tuple[str, ...] = ()

    @property
    def chips(self) -> int:
        return self.hosts * self.chips_per_host

    @property
    def script(self) -> str:
        """The launch commands as one bash script: every host started together, then wait.
        Each is cut before its flags into ``\\``-continued lines (bash joins them again)."""
        lines = [" \\\n    ".join(_flag_groups(c)) for c in self.launch]
        if len(lines) == 1:
            return lines[0]
        return "\n".join([*(f"{c} &" for c in lines), "wait"])

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mesh"] = list(self.mesh)
        d["script"] = self.script
        return d

    def text(self) -> str:
        """The plan for a terminal or a notebook's code block: header, every host, launch."""
        out = [f"# {self.slice} ({self.chip}, topology {self.topology}): {self.hosts} host(s) "
               f"x {self.chips_per_host} chips = {self.chips} chips; {self.runtime} via "
               f"{self.via}; {self.strategy} on mesh {mesh_text(self.mesh)} "
               f"({math.prod(self.mesh)} devices)"]
        out += [f"# {n}" for n in self.notes]
        # What every host runs, once: <host> stands for the words that are its index.
        first = self.host_plans[0]
        words = [f"{k}={v}" for k, v in first.env.items()] + list(first.argv)
        for h in self.host_plans[1:]:
            mine = [f"{k}={v}" for k, v in h.env.items()] + list(h.argv)
            words = [w if w == m else re.sub(r"\d+$", "<host>", w) for w, m in zip(
                words, mine, strict=True)]
        out.append(f"# every host (0-{self.hosts - 1}"
                   f"{'; <host> is its index' if any('<host>' in w for w in words) else ''}): "
                   + " ".join(words))
        out = [w for line in out for w in textwrap.wrap(
            line, 96, subsequent_indent="#     ", break_on_hyphens=False)]
        for name, body in self.files.items():
            out += [f"cat > {name} <<'EOF'", body.rstrip("\n"), "EOF"]
        out.append(self.script)
        return "\n".join(out)


def _flag_groups(command: str) -> list[str]:
    """`command`'s words, each ``--flag`` with its value: one shell-quoted group per line."""
    groups: list[list[str]] = [[]]
    for w in shlex.split(command):
        if w.startswith("--"):
            groups.append([])
        groups[-1].append(shlex.quote(w))
    return [" ".join(g) for g in groups if g]


def _check_name(what: str, value: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value) or len(value) > 40:
        raise SpecError(f"{what} {value!r} must be at most 40 characters of lowercase letters, "
                        "digits and '-', starting with a letter (xpk's and GKE's names)")
    return value


def check_spec_options(model: str, preset: str, mesh: tuple[int, ...], strategy: str,
                       batch_size: int | None) -> None:
    """The model, preset and batch must lay out on `mesh` (the checks a run makes before it
    starts: batch divisible by the data axis, widths by the model axis). Imports torch."""
    from .. import models, sharding

    family = models.get_model(model)
    cfg = family.config(preset)
    sharding.validate(mesh, strategy, family, cfg, batch_size or family.default_batch_size(cfg))


def _workdir(workdir: str) -> str:
    return _word(workdir) if workdir.startswith("/") else '"$HOME"/' + _word(workdir)


def _program(rt: Runtime, via: str, sl: Slice, spec: dict[str, Any], rank: int | Shell,
             hostnames: Sequence[str] | None) -> tuple[dict[str, Any], list[Any], list[str]]:
    """(env, argv, lookups) of one host: what it exports, runs, and finds out first."""
    container = via == "xpk"  # xpk's image: pip installs on PATH; TPU VMs: the repo's venvs
    mesh = "x".join(map(str, spec["mesh"]))
    if rt.xla:  # one SPMD process per host
        python = "python3" if container else ".venv/bin/python"
        argv = [python, "-m", "tpu_workbench", "shard", "--model", spec["model"], "--preset",
                spec["preset"], "--mode", spec["mode"], "--mesh", mesh, "--strategy",
                spec["strategy"], "--steps", str(spec["steps"]), "--chip", sl.chip,
                "--out", _out_dir(sl, spec)]
        if spec["batch_size"] is not None:
            argv[-2:-2] = ["--batch-size", str(spec["batch_size"])]
        return {"PJRT_DEVICE": "TPU"}, argv, []
    lookups = []
    env: dict[str, Any] = {"TORCH_TPU_TOPOLOGY": sl.topology_text,
                           "TORCH_TPU_DEVICES_PER_HOST": str(sl.chips_per_host),
                           "NNODES": str(sl.hosts), "NODE_RANK": rank}
    if hostnames:
        env["TPU_WORKER_HOSTNAMES"] = ",".join(hostnames)
        env["MASTER_ADDR"] = hostnames[0]
    else:  # gcloud: each host asks the metadata server; GKE and the Ray driver set it
        lookups = ([HOSTNAMES_FROM_METADATA] if via == "gcloud" else []) + \
            [MASTER_FROM_HOSTNAMES]
    env["MASTER_PORT"] = str(MASTER_PORT)
    torchrun = "torchrun" if container else ".venv-torchtpu/bin/torchrun"
    master = hostnames[0] if hostnames else Shell('"$MASTER_ADDR"')
    out = _out_dir(sl, spec)
    job = {"spec": {**{k: spec[k] for k in ("model", "preset", "mode", "steps", "batch_size",
                                            "mesh", "strategy")}, "device": "tpu"},
           "device": "tpu", "out": out}
    module = GANG_MODULE
    if spec.get("titan"):  # TorchTitan's trainer: its rank program reads a TitanSpec
        job = {"spec": spec["titan"], "device": "tpu", "out": out}
        module = TITAN_MODULE
    lookups.append(f"mkdir -p {_word(out)} && printf %s "
                   f"{_word(json.dumps(job, separators=(',', ':')))} > {_word(out)}/job.json")
    argv = [torchrun, "--nnodes", str(sl.hosts), "--node_rank", rank, "--nproc_per_node",
            str(sl.chips_per_host), "--master_addr", master, "--master_port", str(MASTER_PORT),
            "-m", module, f"{out}/job.json"]
    return env, argv, lookups


def _out_dir(sl: Slice, spec: dict[str, Any]) -> str:
    return f"results/launch-{sl.name}-{spec['strategy']}"


def _host_command(env: dict[str, Any], argv: list[Any], lookups: list[str],
                  workdir: str | None, setup: str | None = None) -> str:
    """``cd WORKDIR && [setup &&] [lookups &&] export ENV && PROGRAM``: one line of shell."""
    parts = [*([f"cd {_workdir(workdir)}"] if workdir else []), *([setup] if setup else []),
             *lookups,
             " ".join(["export", *(f"{k}={_word(v)}" for k, v in env.items())]),
             " ".join(_word(a) for a in argv)]
    return " && ".join(parts)


def launch_plan(slice_name: str, runtime: str = "torch_xla", via: str = "gcloud", *,
                model: str = "mingpt", preset: str = "tiny", mode: str | None = None,
                steps: int = 20, batch_size: int | None = None,
                mesh: str | Sequence[int] | None = None, strategy: str = "fsdp",
                name: str | None = None, zone: str | None = None, project: str | None = None,
                cluster: str | None = None, workload: str | None = None,
                hostnames: Sequence[str] | None = None, workdir: str = "tpu-workbench",
                check_model: bool = True, titan: Any = None) -> LaunchPlan:
    """The commands and environment that run one experiment on every host of `slice_name`.

    `runtime`: ``torch_xla`` (each host runs ``tpu-workbench shard`` with ``PJRT_DEVICE=TPU``
    and the mesh over every chip of the slice) or ``torch_tpu`` (each host runs ``torchrun
    --nnodes H --node_rank i --nproc_per_node C`` of the workbench's rank program, with
    TorchTPU's multi-host environment: ``TPU_WORKER_HOSTNAMES``, ``MASTER_ADDR``,
    ``TORCH_TPU_DEVICES_PER_HOST``...). `via`: ``gcloud`` (TPU VM `name` in `zone`, the repo
    set up in `workdir` on every host), ``xpk`` (GKE `cluster`, `workload`) or ``ray``.
    `hostnames` (host 0 first) makes every address literal; without them each host finds
    them when it starts. The spec options (`model` ... `strategy`) are those of
    ``tpu-workbench bench``/``shard``; `mesh` must cover the slice's chips exactly.

    `titan`: a :class:`~tpu_workbench.titan.spec.TitanSpec` over the slice's chips
    (``titan_spec(..., ranks=<chips>, device="tpu", check_env=False)``): each host runs
    TorchTitan's trainer (:mod:`tpu_workbench.worker.titan`) instead of the workbench's rank,
    with the spec's TOML, degrees and steps; ``runtime`` must be ``torch_tpu``.

    Raises :class:`SpecError` naming what would be valid for an unknown slice, topology, chip,
    runtime, launcher, mode, strategy, or a mesh that is not the slice's, before anything runs.
    """
    if runtime not in RUNTIMES:
        raise SpecError(f"unknown runtime {runtime!r}; valid: {', '.join(RUNTIMES)}")
    if via not in VIAS:
        raise SpecError(f"unknown launcher {via!r} (--via); valid: {', '.join(VIAS)}")
    sl = get_slice(slice_name)
    mode = mode or DEFAULT_MODE[runtime]
    rt = _RUNTIME_OF[runtime]
    valid = [m for m, v in MODES.items() if v.runtime is rt]
    if mode not in valid:
        raise SpecError(f"mode {mode!r} does not run on {runtime}; {runtime} modes: "
                        f"{', '.join(valid)}")
    strategy = strategy_name(strategy)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
        raise SpecError(f"steps must be a positive int, got {steps!r}")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size <= 0):
        raise SpecError(f"batch_size must be a positive int or None, got {batch_size!r}")
    if titan is not None:
        if runtime != "torch_tpu" or titan.ranks != sl.chips:
            raise SpecError(f"TorchTitan runs on TorchTPU over every chip: --runtime torch_tpu "
                            f"and {sl.chips} ranks on {sl.name} (got {runtime}, "
                            f"{titan.ranks} ranks)")
        model, preset, mode, steps = titan.model, titan.preset, "tpu_eager", titan.steps
        mesh, strategy, batch_size, check_model = titan.mesh, titan.strategy, None, False
    shape = check_mesh(mesh, strategy, sl) if titan is None else tuple(titan.mesh)
    if hostnames is not None and len(hostnames) != sl.hosts:
        raise SpecError(f"{len(hostnames)} hostname(s) given but {sl.name} has {sl.hosts} "
                        f"host(s); give one per host, host 0 first")
    if check_model:
        check_spec_options(model, preset, shape, strategy, batch_size)
    spec = {"model": model, "preset": preset, "mode": mode, "steps": steps,
            "batch_size": batch_size, "mesh": list(shape), "strategy": strategy,
            **({"titan": titan.compact()} if titan is not None else {})}
    name = name or f"workbench-{sl.name}"
    _check_name("TPU name", name)
    notes = [RUNTIMES[runtime], VIAS[via]]
    files: dict[str, str] = {}
    plans = [_resolved(i, rt, via, sl, spec, hostnames, None if via == "xpk" else workdir)
             for i in range(sl.hosts)]
    if via == "xpk":
        if not cluster:
            raise SpecError("--via xpk needs --cluster: the GKE cluster with a "
                            f"{sl.accelerator_type} node pool (xpk cluster create ...)")
        _check_name("cluster", cluster)
        workload = _check_name("workload", workload or re.sub(
            r"[^a-z0-9-]+", "-", f"wb-{model}-{strategy}-{sl.name}".lower())[:40].strip("-"))
        # One command for every pod: GKE's JobSet gives each its JOB_COMPLETION_INDEX.
        env, argv, lookups = _program(rt, via, sl, spec, Shell('"$JOB_COMPLETION_INDEX"'),
                                      hostnames)
        tool = ["xpk", "workload", "create", "--cluster", cluster, "--workload", workload,
                "--tpu-type", sl.accelerator_type, "--num-slices", "1",
                *(["--zone", zone] if zone else []), *(["--project", project] if project
                                                       else []),
                "--command", _host_command(env, argv, lookups, None, XPK_SETUP[runtime])]
        launch = [shlex.join(tool)]
        notes.append("GKE sets TPU_WORKER_HOSTNAMES and JOB_COMPLETION_INDEX in every pod")
        tools: tuple[str, ...] = ("xpk", "gcloud", "kubectl")
    elif via == "gcloud":
        base = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", name,
                *(["--zone", zone] if zone else []), *(["--project", project] if project else [])]
        if rt.xla:  # the same command on every host
            launch = [shlex.join([*base, "--worker=all", "--command", plans[0].command])]
        else:  # torchrun's --node_rank differs per host: one ssh each, run together
            launch = [shlex.join([*base, f"--worker={h.index}", "--command", h.command])
                      for h in plans]
        if not zone:
            notes.append("no --zone: gcloud uses its compute/zone property")
        tools = ("gcloud",)
    else:
        script = f"launch_{sl.name.replace('-', '_')}.py"
        files[script] = ray_driver(sl, plans, rt, hostnames is not None)
        launch = [shlex.join(["python", script])]
        notes.append("run where the Ray cluster is reachable (RAY_ADDRESS or its head node)")
        tools = ("python",)
    return LaunchPlan(sl.name, sl.chip, sl.topology_text, sl.hosts, sl.chips_per_host,
                      runtime, via, shape, strategy, spec, tuple(plans), tuple(launch), files,
                      tools, tuple(notes))


def _resolved(index: int, rt: Runtime, via: str, sl: Slice, spec: dict[str, Any],
              hostnames: Sequence[str] | None, workdir: str | None) -> HostPlan:
    """Host `index`'s plan, its rank written out (xpk: no workdir, the container's setup)."""
    env, argv, lookups = _program(rt, via, sl, spec, index, hostnames)
    command = _host_command(env, argv, lookups, workdir,
                            XPK_SETUP[rt.launch_name] if via == "xpk" else None)
    if not rt.xla and not hostnames:  # torchrun's ranks need their peers' addresses
        env = {**env, "TPU_WORKER_HOSTNAMES": "$TPU_WORKER_HOSTNAMES",
               "MASTER_ADDR": "${TPU_WORKER_HOSTNAMES%%,*}"}
    return HostPlan(index, {k: str(v) for k, v in env.items()},
                    tuple(str(a).strip('"') for a in argv), command)


_RAY_DRIVER = '''\
"""Run {slice} ({runtime}) on every host of a Ray TPU slice: written by tpu-workbench launch."""
import os
import subprocess
import urllib.request

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.util.tpu import slice_placement_group

COMMANDS = {commands}  # host i's shell command, host 0 first
CHIPS_PER_HOST = {chips_per_host}
SET_HOSTNAMES = {set_hostnames}
METADATA = "{metadata}/agent-worker-number"


@ray.remote(num_cpus=0)
def host_info():
    """(this host's TPU worker number: GKE's TPU_WORKER_ID or the TPU VM's metadata, this
    node's IP); None where neither says, and then the bundle order counts."""
    worker = os.environ.get("TPU_WORKER_ID")
    if worker is None:
        try:
            req = urllib.request.Request(METADATA, headers={{"Metadata-Flavor": "Google"}})
            worker = urllib.request.urlopen(req, timeout=5).read()
        except OSError:
            pass
    return (None if worker is None else int(worker)), ray.util.get_node_ip_address()


@ray.remote(num_cpus=0)
def run_host(command, hostnames):
    env = dict(os.environ)
    if hostnames:
        env["TPU_WORKER_HOSTNAMES"] = hostnames
    return subprocess.run(["bash", "-c", command], env=env).returncode


ray.init()
tpu_slice = slice_placement_group("{topology}", "{version}")  # one bundle per host
pg = tpu_slice.placement_group
ray.get(pg.ready())


def on(bundle):
    return PlacementGroupSchedulingStrategy(placement_group=pg,
                                            placement_group_bundle_index=bundle)


info = ray.get([host_info.options(scheduling_strategy=on(b)).remote()
                for b in range(len(COMMANDS))])
# host i of the plan runs on the bundle whose TPU VM is worker i (every host starts at once)
order = sorted(range(len(info)), key=lambda b: (info[b][0] is None, info[b][0], b))
hostnames = ",".join(info[b][1] for b in order) if SET_HOSTNAMES else ""
codes = ray.get([run_host.options(scheduling_strategy=on(b), resources={{"TPU": CHIPS_PER_HOST}})
                 .remote(COMMANDS[i], hostnames) for i, b in enumerate(order)])
print("exit codes per host:", codes)
raise SystemExit(max(codes))
'''


def ray_accelerator_version(sl: Slice) -> str:
    """Ray's name for a slice's chip (``ray.util.tpu``: v6e, v5p, v5litepod)."""
    return "v5litepod" if sl.chip == "v5e" else sl.chip


def ray_driver(sl: Slice, plans: Sequence[HostPlan], rt: Runtime, literal: bool) -> str:
    """The Python driver that runs each host's command on one bundle of a
    ``ray.util.tpu.slice_placement_group`` (TorchTPU's peers: the bundles' IPs, worker 0
    first, unless the plan already has them)."""
    return _RAY_DRIVER.format(slice=sl.name, runtime=rt.launch_name, topology=sl.topology_text,
                              version=ray_accelerator_version(sl),
                              chips_per_host=sl.chips_per_host,
                              commands="[\n" + "".join(f"    {p.command!r},\n"
                                                         for p in plans) + "]",
                              set_hostnames=not rt.xla and not literal,
                              metadata=METADATA)


# --------------------------------------------------------------------------------------------
# --execute: only where the launcher and its credentials exist
# --------------------------------------------------------------------------------------------
INSTALL = {
    "gcloud": "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)",
    "xpk": "pip install xpk (it drives gcloud and kubectl)",
    "kubectl": "gcloud components install kubectl",
    "python": "a Python with ray installed (pip install ray)",
}


RAY_CLUSTER_FILE = "/tmp/ray/ray_current_cluster"  # written by `ray start` on a cluster's node


def missing(plan: LaunchPlan) -> list[str]:
    """What this machine lacks to run `plan`, one sentence each (empty: it can run): its tools
    on PATH, then gcloud's active account, or for Ray the ``ray`` package and a cluster."""
    import importlib.util
    import os
    import shutil
    import subprocess

    gaps = [f"`{t}` is not on PATH ({INSTALL.get(t, 'install it')})"
            for t in plan.tools if shutil.which(t) is None]
    if gaps:
        return gaps
    if plan.via == "ray":
        if importlib.util.find_spec("ray") is None:
            return ["the `ray` package is not installed here (pip install ray)"]
        if not os.environ.get("RAY_ADDRESS") and not os.path.exists(RAY_CLUSTER_FILE):
            return ["no Ray cluster to join: set RAY_ADDRESS (ray://HEAD:10001) or run on "
                    "the cluster's head node (ray start --head)"]
        return []
    try:
        probe = subprocess.run(["gcloud", "auth", "list", "--filter=status:ACTIVE",
                                "--format=value(account)"], capture_output=True, text=True,
                               timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"gcloud could not be asked for its credentials ({exc})"]
    if probe.returncode != 0 or not probe.stdout.strip():
        return ["gcloud has no active credentials (gcloud auth login, or a service account)"]
    return []


def execute(plan: LaunchPlan, workdir: str = ".", poll_s: float = 0.5) -> list[int]:
    """Run `plan`'s launch commands all at once (every host must start) and wait for them;
    returns their exit codes. One that fails ends the others (they would wait for it
    forever). Where the tool or its credentials are missing, raises :class:`WorkbenchError`
    saying which, and runs nothing. Files the plan needs (the Ray driver) are written into
    `workdir` first, whole."""
    import os
    import signal
    import subprocess
    import time
    from pathlib import Path

    from ..errors import WorkbenchError

    gaps = missing(plan)
    if gaps:
        raise WorkbenchError(f"cannot execute the {plan.slice} plan via {plan.via} here, so "
                             "nothing was run: " + "; ".join(gaps)
                             + ". The commands above run as printed where they exist.")
    for name, body in plan.files.items():
        tmp = Path(workdir) / (name + ".tmp")
        tmp.write_text(body)
        tmp.replace(Path(workdir) / name)
    # each in its own session, so ending one ends what it started (an ssh, a driver) too
    procs = [subprocess.Popen(["bash", "-c", c], cwd=workdir, start_new_session=True)
             for c in plan.launch]
    while None in (codes := [p.poll() for p in procs]):
        if any(c not in (None, 0) for c in codes):
            for p, c in zip(procs, codes, strict=True):
                if c is None:
                    os.killpg(p.pid, signal.SIGTERM)
        time.sleep(poll_s)
    return codes
