"""``tpu-workbench launch --serve``: on a TPU VM, the ``vllm serve`` command a serving plan
implies and ``vllm bench serve`` at its concurrencies; with ``execute`` it runs them where vLLM
(vllm-tpu) is installed and records measured beside predicted, in serve.csv's columns."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..serving import plan as P
from ..serving.serve import COLUMNS

PORT = 8000
READY_S = 1800.0  # vLLM-TPU compiles every bucket at start-up: minutes for a large model
MEASURED = {"itl_median_ms": "median_itl_ms", "itl_mean_ms": "mean_itl_ms",
            "ttft_ms": "mean_ttft_ms", "output_tokens_per_s": "output_throughput"}


@dataclass(frozen=True)
class ServeLaunch:
    """The commands: ``server`` (argv), ``benches`` (concurrency, argv)."""

    request: P.ServeRequest
    server: list[str]
    benches: list[tuple[int, list[str]]]

    def text(self) -> str:
        r = self.request
        lines = [f"# vLLM-TPU on {r.slice}: {r.replicas} replica(s) of tensor parallel {r.tp}"
                 + (" (one server per replica; run the same on each)" if r.replicas > 1 else ""),
                 shlex.join(self.server), "# once it answers on /health, per concurrency:"]
        return "\n".join(lines + [shlex.join(b) for _, b in self.benches])


def serve_launch(model: str, preset: str, slice: str, input_len: int = 1000,
                 output_len: int = 1000, concurrency: tuple[int, ...] = (1, 8, 64),
                 **limits: Any) -> ServeLaunch:
    """The plan's commands, checked as :func:`tpu_workbench.serving.plan.check_plan` checks
    them (nothing compiled, nothing run)."""
    r = P.check_plan(model, preset, slice, input_len, output_len, tuple(concurrency), **limits)
    server = shlex.split(P.vllm_command(r)) + ["--port", str(PORT)]
    benches = [(c, ["vllm", "bench", "serve", "--backend", "vllm", "--model", r.preset.hf_name,
                    "--port", str(PORT), "--dataset-name", "random",
                    "--random-input-len", str(r.input_len),
                    "--random-output-len", str(r.output_len),
                    "--max-concurrency", str(r.per_replica(c)),
                    "--num-prompts", str(3 * r.per_replica(c)), "--save-result",
                    "--result-filename", f"bench-c{c}.json"]) for c in r.concurrency]
    return ServeLaunch(r, server, benches)


def missing() -> str | None:
    """Why vLLM cannot run here, or None."""
    if shutil.which("vllm") is None:
        return ("vllm is not installed here (on a TPU VM: `pip install vllm-tpu`); nothing "
                "was run")
    return None


def _ready(deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=5) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            time.sleep(5)
    return False


def execute(launch: ServeLaunch, out: Path) -> Any:
    """Start the server here, wait for it, run each benchmark, stop it; measured.csv in `out`
    (serve.csv's columns, ``measured`` where vLLM measured it). SystemExit-free: a missing
    vLLM or a server that never answers is a RuntimeError naming it."""
    import pandas as pd

    why = missing()
    if why:
        raise RuntimeError(why)
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "server.log").open("w")
    server = subprocess.Popen(launch.server, stdout=log, stderr=subprocess.STDOUT)
    rows = []
    try:
        if not _ready(time.monotonic() + READY_S):
            raise RuntimeError(f"vllm serve did not answer on port {PORT} within {READY_S:.0f} "
                               f"s: see {out / 'server.log'}")
        for c, argv in launch.benches:
            subprocess.run(argv + ["--result-dir", str(out)], check=True, timeout=7200)
            result = json.loads((out / f"bench-c{c}.json").read_text())
            rows.append({"concurrency": c, "provenance": f"measured by vllm bench serve "
                         f"({result.get('date', time.strftime('%Y-%m-%d'))})",
                         **{k: result.get(v) for k, v in MEASURED.items()}})
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    frame.to_csv(out / "measured.csv", index=False)
    return frame
