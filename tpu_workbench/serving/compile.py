"""vLLM-TPU's own model step compiled for a slice: the engine in ``.venv-serve``, a process of
its own (:mod:`engine_main`), as :mod:`tpu_workbench.tpu_compile` runs libtpu.

One request builds one model on one mesh and compiles a list of programs (decode steps at the
token buckets the runner pads to, the prefill chunk at ``max_num_batched_tokens``, the LM head);
each program is cached on its own under ``results/serve_compiles/`` by (request, program,
engine source, stand-ins, versions), so asking again is instant. One libtpu compile at a time
on a machine (the lock :mod:`tpu_workbench.tpu_compile` takes): another engineer's libtpu
beside it collides on libtpu's lock file and aborts now and then.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..environment.paths import results_dir
from ..errors import SpecError
from ..hlo.parse import clip
from ..tpu_compile.compile import CompiledProgram, DoesNotFit

# The engine's compiles run one at a time here, beside (not behind) other libtpu compiles on the
# machine: libtpu's own lock file is sidestepped by ALLOW_MULTIPLE_LIBTPU_LOAD=1 (the compile-
# only client opens no chip) and a compile that aborts beside another libtpu is tried again.
LOCK = Path(tempfile.gettempdir()) / "tpu_workbench_serve.lock"
ATTEMPTS = 3
ROOT = Path(__file__).resolve().parents[2]
SERVE_VENV = ROOT / ".venv-serve"
MAIN = Path(__file__).with_name("engine_main.py")
STUBS = Path(__file__).with_name("engine_stubs.py")
INSTALL_HINT = ("set it up with `python3 scripts/dev.py setup` (it builds .venv-serve from "
                "requirements-serve.txt on a Python 3.12: tpu-inference, jax, libtpu, flax; no "
                "TPU needed), or point TPU_WORKBENCH_SERVE_PYTHON at an interpreter that has them")


def serve_python() -> Path:
    """The interpreter that runs the engine: ``TPU_WORKBENCH_SERVE_PYTHON`` or .venv-serve's."""
    return Path(os.environ.get("TPU_WORKBENCH_SERVE_PYTHON", SERVE_VENV / "bin" / "python"))


@functools.cache
def engine_versions(python: str | None = None) -> dict[str, str]:
    """tpu-inference, jax, libtpu and flax in the engine's interpreter; SpecError (how to set it
    up) when it is missing."""
    python = python or str(serve_python())
    if not Path(python).exists():
        raise SpecError(f"vLLM-TPU's engine (tpu-inference) is not installed: {python} does "
                        f"not exist; {INSTALL_HINT}")
    found = subprocess.run(
        [python, "-c", "import json; from importlib import metadata as m; print(json.dumps({n: "
                       "m.version(n) for n in ('tpu-inference', 'jax', 'libtpu', 'flax')}))"],
        capture_output=True, text=True, timeout=120)
    if found.returncode:
        raise SpecError(f"vLLM-TPU's engine is not usable in {python}: "
                        f"{(found.stderr.strip().splitlines() or ['?'])[-1]}; {INSTALL_HINT}")
    return json.loads(found.stdout)


@dataclass
class EngineProgram(CompiledProgram):
    """One of the engine's programs compiled by libtpu: ``name`` (``decode-64``,
    ``prefill-2048``, ``logits-256``), ``engine`` (what the engine reported: buckets, block
    size, KV cache shape and bytes, weights per chip)."""

    name: str = ""
    engine: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        c = self.compiled
        return (f"vLLM-TPU's {self.name} (tpu-inference {c['tpu_inference']}) compiled for "
                f"{self.slice} ({c['device_kind']}, {c['topology']}) by libtpu {c['libtpu']} "
                "(not run)")


def _key(request: dict[str, Any], program: dict[str, Any], versions: dict[str, str]) -> str:
    body = json.dumps([request, program, versions], sort_keys=True).encode()
    return hashlib.sha256(body + MAIN.read_bytes() + STUBS.read_bytes()).hexdigest()[:20]


def compile_programs(request: dict[str, Any], programs: list[dict[str, Any]], slice_name: str,
                     timeout: float = 1800.0) -> dict[str, EngineProgram | DoesNotFit]:
    """Compile each of `programs` (``{"name", "kind", "num_tokens"|"num_reqs"}``) of the model
    `request` describes (see :mod:`engine_main`) for `slice_name`. Returns, per program name,
    the compiled program or the compiler's refusal (:class:`DoesNotFit`); any other failure
    raises SpecError with what the engine said."""
    versions = engine_versions()
    base = results_dir() / "serve_compiles"
    mesh = (int(request["tp"]),)
    out: dict[str, EngineProgram | DoesNotFit] = {}
    todo = []
    for program in programs:
        folder = base / f"{slice_name}-{program['name']}-{_key(request, program, versions)}"
        if (folder / "compiled.json").exists() or (folder / "refused.txt").exists():
            out[program["name"]] = _load(folder, slice_name, mesh, program["name"], cached=True)
        else:
            todo.append((program, folder))
    if not todo:
        return out
    work = base / f".request-{os.getpid()}-{time.monotonic_ns()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    body = {**request, "out": str(work),
            "programs": [{**p, "out": str(work / p["name"])} for p, _ in todo]}
    (work / "request.json").write_text(json.dumps(body, indent=1))
    started = time.perf_counter()
    try:
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for attempt in range(1, ATTEMPTS + 1):
                done = subprocess.run(
                    [str(serve_python()), str(MAIN), str(work / "request.json")],
                    capture_output=True, text=True, timeout=timeout,
                    env={**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"})
                if done.returncode >= 0:  # compiled, or refused with a message
                    break
                (work / f"aborted-{attempt}.log").write_text(done.stderr)
    except subprocess.TimeoutExpired:
        shutil.rmtree(work, ignore_errors=True)
        raise SpecError(f"the engine did not finish compiling {[p['name'] for p, _ in todo]} "
                        f"for {slice_name} within {timeout:.0f} s") from None
    (work / "stderr.txt").write_text(done.stderr)
    if done.returncode not in (0, 3) or not (work / "engine.json").exists():
        tail = " | ".join(done.stderr.strip().splitlines()[-6:])
        raise SpecError(f"vLLM-TPU's engine could not build its programs for {slice_name} "
                        f"(exit {done.returncode}): {clip(tail, 800)}")
    engine = json.loads((work / "engine.json").read_text())
    wall = time.perf_counter() - started
    for program, folder in todo:
        made = work / program["name"]
        (made / "engine.json").write_text(json.dumps(engine, indent=1))
        (made / "request.json").write_text(json.dumps({**request, "program": program}, indent=1))
        if (made / "compiled.json").exists():
            compiled = json.loads((made / "compiled.json").read_text())
            compiled.update(compiled_at=time.strftime("%Y-%m-%d %H:%M:%S"), wall_s=wall)
            (made / "compiled.json").write_text(json.dumps(compiled, indent=1))
        else:
            message = (made / "error.txt").read_text() if (made / "error.txt").exists() \
                else f"no result (exit {done.returncode})"
            if "RESOURCE_EXHAUSTED" not in message:
                raise SpecError(f"libtpu could not compile vLLM-TPU's {program['name']} for "
                                f"{slice_name}: {clip(' '.join(message.split()), 800)}")
            (made / "refused.txt").write_text(message)
        shutil.rmtree(folder, ignore_errors=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        made.rename(folder)  # whole or not at all
        out[program["name"]] = _load(folder, slice_name, mesh, program["name"], cached=False)
    shutil.rmtree(work, ignore_errors=True)
    return out


def _load(folder: Path, slice_name: str, mesh: tuple[int, ...], name: str,
          cached: bool) -> EngineProgram | DoesNotFit:
    engine = json.loads((folder / "engine.json").read_text())
    if (folder / "refused.txt").exists():
        message = " ".join((folder / "refused.txt").read_text().split())
        refusal = DoesNotFit(f"vLLM-TPU's {name} does not fit {slice_name}: libtpu "
                             f"{engine.get('libtpu')} says {clip(message, 600)}")
        refusal.engine = engine  # type: ignore[attr-defined]
        refusal.message = message  # type: ignore[attr-defined]
        return refusal
    compiled = json.loads((folder / "compiled.json").read_text())
    return EngineProgram(slice_name, mesh, folder, compiled, cached, name=name, engine=engine)
