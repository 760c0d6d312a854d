"""Gangs: one run as N gloo processes under torchrun (tpu_workbench.runs.gang), DTensor strategies
that train (tpu_workbench.worker.dtensor_train), supervision of dying and hanging ranks."""

from __future__ import annotations

import os
import time

import psutil
import pytest
import torch

import tpu_workbench as wb
from tpu_workbench import models
from tpu_workbench.runs import gang

STEPS = 3


def one_process_losses(steps: int, seed: int = 0) -> list[float]:
    """The same training in this process with plain PyTorch: the expected losses."""
    family = models.get_model("mingpt")
    cfg = family.config("tiny")
    torch.manual_seed(seed)
    model = family.build(cfg)
    gen = torch.Generator().manual_seed(seed)
    batches = [family.make_batch(cfg, cfg.batch_size, gen) for _ in range(min(steps, 8))]
    opt = torch.optim.AdamW(model.parameters(), lr=family.default_lr, foreach=False)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = family.loss(model, batches[step % len(batches)])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def spec(strategy: str, mesh: tuple[int, ...], steps: int = STEPS) -> wb.ExperimentSpec:
    return wb.ExperimentSpec(model="mingpt", preset="tiny", mode="torch_eager", steps=steps,
                             mesh=mesh, strategy=strategy)


@pytest.fixture(scope="module")
def reference() -> list[float]:
    return one_process_losses(4)


@pytest.fixture(scope="module")
def four(tmp_path_factory) -> dict[str, wb.RunResult]:
    out = tmp_path_factory.mktemp("gang")
    return {s: wb.run(spec(s, mesh), out_dir=out, timeout=300)
            for s, mesh in (("fsdp", (4,)), ("tp", (1, 4)), ("dp_tp", (2, 2)))}


@pytest.mark.parametrize("strategy", ["fsdp", "tp", "dp_tp"])
def test_four_processes_train_with_the_losses_of_one(four, reference, strategy):
    result = four[strategy]
    steps = result.steps
    assert list(steps["step"]) == list(range(STEPS))
    assert steps["loss"].tolist() == pytest.approx(reference[:STEPS], rel=1e-5)
    assert all(len(t) == 4 and all(ms > 0 for ms in t) for t in steps["rank_wall_ms"])
    assert result.runtime["processes"] == 4 and result.runtime["launcher"] == "torchrun"
    assert (result.out_dir / "gang" / "rank3.jsonl").exists()
    assert len(gang.rank_frame(result)) == 4 * STEPS


def test_collectives_per_step_have_the_xla_frame_columns(four):
    frames = {s: gang.collectives_frame(r) for s, r in four.items()}
    for frame in frames.values():
        assert set(wb.sharding.COLLECTIVE_COLUMNS) <= set(frame.columns)
        assert (frame["count"] > 0).all() and (frame["bytes"] > 0).all()
    kinds = {s: set(zip(f["kind"], f["phase"], f["axis"], strict=True))
             for s, f in frames.items()}
    # FSDP over all 4 (a 1-D mesh: its one axis, data): parameters gathered for forward and
    # backward, gradients reduce-scattered
    assert {("all-gather", "forward", "data"), ("all-gather", "backward", "data"),
            ("reduce-scatter", "backward", "data")} <= kinds["fsdp"]
    assert not any(k == "all-reduce" for k, _, _ in kinds["fsdp"])
    # TP on a 1x4 mesh: row-parallel outputs all-reduced over the model axis (every device,
    # "all" as in the XLA frame), attention's fused q/k/v output gathered
    assert {("all-reduce", "forward", "all"), ("all-gather", "forward", "all")} <= kinds["tp"]
    assert not any(k == "reduce-scatter" for k, _, _ in kinds["tp"])
    # 2-D: TP on the model axis, the gradients averaged over the data axis (as SPMD's dp_tp)
    assert ("all-reduce", "forward", "model") in kinds["dp_tp"]
    assert ("all-reduce", "backward", "data") in kinds["dp_tp"]
    assert not any(k == "reduce-scatter" for k, _, _ in kinds["dp_tp"])
    tp = frames["tp"]
    assert (tp["group_size"] == 4).all() and (tp["estimated_us"] > 0).all()


def _gone(pids: list[int]) -> bool:
    """No process of these pids, nor any in their process groups or sessions, is alive."""
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if p.pid in pids or os.getpgid(p.pid) in pids or os.getsid(p.pid) in pids:
                return False
        except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
            continue
    return True


def test_a_killed_rank_ends_the_gang_naming_it(monkeypatch, tmp_path, reference):
    monkeypatch.setenv("TPU_WORKBENCH_GANG_FAULT", "kill:1:2")
    t0 = time.monotonic()
    with pytest.raises(wb.WorkerCrashed, match=r"rank 1 of 2 .*killed by SIGKILL at step 1") \
            as err:
        wb.run(spec("dp", (2,), steps=4), out_dir=tmp_path, timeout=120)
    assert time.monotonic() - t0 < 120
    steps = [r for r in err.value.records if r.get("kind") == "step"]
    assert [r["step"] for r in steps] == [0, 1]  # kept: the steps before the fault
    assert [r["loss"] for r in steps] == pytest.approx(reference[:2], rel=1e-5)  # dp: DDP
    pids = gang.gang_error_ranks(err.value)
    assert _gone([pids["launcher_pid"], *pids["rank_pids"]])
    assert list(tmp_path.glob("*-failed/gang/rank1.jsonl"))


def test_a_hanging_rank_stalls_the_gang_naming_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TPU_WORKBENCH_GANG_FAULT", "hang:1:2")
    monkeypatch.setenv(gang.STALL_ENV, "3")
    with pytest.raises(wb.RunTimeout, match=r"rank 1 is behind, last seen at step 1 \(end\); "
                                            r"rank 0 waits at step 2") as err:
        wb.run(spec("fsdp", (2,), steps=4), out_dir=tmp_path, timeout=120)
    steps = [r for r in err.value.records if r.get("kind") == "step"]
    assert [r["step"] for r in steps] == [0, 1]
    pids = gang.gang_error_ranks(err.value)
    assert _gone([pids["launcher_pid"], *pids["rank_pids"]])


@pytest.mark.parametrize(("changes", "message"), [
    ({"mesh": (3,), "strategy": "fsdp"}, r"batch_size=32 does not divide over the data axis"),
    ({"mesh": (2, 2), "strategy": "dp", "batch_size": 5},
     r"batch_size=5 does not divide .* splits the batch 2 ways"),
    ({"mesh": (1, 3), "strategy": "tp"}, r"n_head=4, n_embd=128 is not divisible by 3"),
    ({"mesh": (2,), "strategy": "zero3"}, r"unknown strategy 'zero3'; valid strategies: dp"),
    ({"mesh": (2,), "strategy": "tp"}, r"strategy 'tp' needs a 2-D mesh"),
    ({"mesh": (2,), "mode": "inductor"}, r"inductor is not offered for a gang"),
    ({"mesh": (2,), "capture": ("profile",)}, r"capture=\('profile',\) is not offered"),
])
def test_bad_gang_specs_fail_before_anything_starts(monkeypatch, changes, message):
    def no_gang(config):
        raise AssertionError("a gang was started")

    monkeypatch.setattr(gang, "Gang", no_gang)
    bad = spec("fsdp", (2,)).replace(**changes)
    with pytest.raises(wb.SpecError, match=message):
        wb.submit(bad)


def _ranks(g: gang.Gang, n: int, tmp_path, report: str = "") -> list:
    g.ranks = [gang._Rank(r) for r in range(n)]
    g.log_file = tmp_path / "torchrun.log"
    g.log_file.write_text(report)
    for r in g.ranks:
        r.pid, r.progress, r.steps = 100 + r.rank, (2, 1), 2
    return g.ranks


def test_the_first_failure_is_named_not_its_peers(tmp_path):
    """Pure bookkeeping, no processes: a rank killed by a signal (torchrun reports its exit
    code; its peers then raise on the lost connection) is the cause; among ranks that raised,
    the first to raise; ranks torchrun stopped itself are never blamed."""
    g = gang.Gang(wb.RuntimeConfig("torch", "cpu"))
    report = ("Root Cause (first observed failure):\n[0]:\n  time      : x\n  host      : h\n"
              "  rank      : 2 (local_rank: 2)\n  exitcode  : -9 (pid: 102)\n")
    ranks = _ranks(g, 3, tmp_path, report)
    for r, t in ((0, 5.0), (1, 4.0)):
        ranks[r].error = {"etype": "RuntimeError", "message": "Connection closed by peer", "t": t}
    out = g._failure(1)
    assert out["state"] == "crashed"
    assert "rank 2 of 3 of the gang (pid 102) was killed by SIGKILL at step 2 (forward)" \
        in str(out["error"])
    ranks = _ranks(g, 3, tmp_path)  # rank 1 raised first; 0 and 2 were stopped by torchrun
    ranks[1].error = {"etype": "ValueError", "message": "bad batch", "t": 1.0}
    out = g._failure(1)
    assert out["state"] == "failed" and isinstance(out["error"], wb.RunFailed)
    assert "rank 1 of 3 raised ValueError at step 2 (forward): bad batch" in str(out["error"])


def test_a_gang_mesh_per_strategy():
    assert [gang.mesh_for(s, 4) for s in ("dp", "fsdp", "tp", "dp_tp")] == \
        [(4,), (4,), (1, 4), (2, 2)]
    with pytest.raises(wb.SpecError, match="dp_tp over 2 processes needs an even number"):
        gang.mesh_for("dp_tp", 2)


UNTIED = {"tie_word_embeddings": False}
HELD = [("mingpt", "dp_tp", {}), ("hf:llama", "dp_tp", UNTIED), ("hf:llama", "tp", UNTIED),
        ("hf:llama", "tp", {})]


def _held(rank: int, world: int, port: int, mesh: tuple, out: str) -> None:
    """One rank: lay each model of :data:`HELD` out with the DTensor strategy the gang trains
    with and write the local shape of every parameter it holds."""
    import json

    import torch.distributed as dist

    from tpu_workbench.worker import dtensor_train as dt

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        held = []
        for model, strategy, options in HELD:
            family = models.get_model(model)
            torch.manual_seed(0)
            net = dt.apply(strategy, family.build(family.config("tiny", **options)),
                           dt.make_meshes("cpu", mesh, strategy))
            held.append({n: list(getattr(p, "_local_tensor", p).shape)
                         for n, p in net.named_parameters()})
        with open(f"{out}/rank{rank}.json", "w") as fh:
            json.dump(held, fh)
    finally:
        dist.destroy_process_group()


def test_each_rank_holds_what_the_spmd_device_holds(tmp_path):
    """The gang's DTensor placement (worker.dtensor_train) and SPMD's (sharding.param_specs)
    agree on what each of four devices of a 2x2 mesh holds: the shape of every parameter's
    local piece, rank r against device r. (dp_tp used to be tp plus FSDP2 over data on the
    gang: half of every piece per rank.) An untied embedding splits vocab-parallel on both;
    one tied to the head stays whole on the gang, the one difference."""
    import json
    import socket

    import torch.multiprocessing as mp

    from tpu_workbench import sharding

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mesh = (2, 2)
    mp.spawn(_held, args=(4, port, mesh, str(tmp_path)), nprocs=4)
    held = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for i, (model, strategy, options) in enumerate(HELD):
        family = models.get_model(model)
        with torch.device("meta"):
            net = family.build(family.config("tiny", **options))
        shapes = {n: list(p.shape) for n, p in net.named_parameters()}
        specs = sharding.param_specs(net, strategy, mesh)
        tied = model == "hf:llama" and not options
        if model == "hf:llama":
            assert specs["hf.model.embed_tokens.weight"] == ("model", None)
        for rank in range(4):
            want = {n: sharding.predicted_layout(n, shapes[n], spec, mesh)[rank]["shard_shape"]
                    for n, spec in specs.items()}
            got = {n: held[rank][i][n] for n in want}
            differ = {n for n in want if got[n] != want[n]}
            assert differ == ({"hf.model.embed_tokens.weight"} if tied else set()), \
                (model, strategy, options, rank, differ)
