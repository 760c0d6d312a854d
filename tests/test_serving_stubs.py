"""The stand-ins vLLM-TPU's engine needs in .venv-serve (tpu_workbench/serving/engine_stubs.py)
still stand in for exactly what the installed tpu-inference imports, and what the engine script
mirrors of tpu-inference is unchanged. Runs the engine's own interpreter (seconds; no compile)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tpu_workbench.serving import compile as serve_compile
from tpu_workbench.serving import engine_main


def _check() -> dict:
    python = serve_compile.serve_python()
    if not python.exists():
        pytest.skip(f"{python} is not set up (no Python 3.12 here?): scripts/dev.py setup")
    done = subprocess.run([str(python), str(serve_compile.MAIN), "--check-stubs"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_stubs_stand_in_for_exactly_what_tpu_inference_imports():
    report = _check()
    # Every stand-in was read while tpu-inference's Llama and Qwen3 were imported, built and
    # traced (a name a new release no longer imports is left over), and every name it imported
    # had one (a new one fails the import with the module and name).
    assert report["unused"] == {}
    assert report["tpu_inference"] == report["pinned"] == "0.32.0"
    # What engine_main copies from tpu-inference instead of calling (its modules import
    # vllm's torch side): the page-size rule, the jitted step, the precompile inputs.
    assert report["mirrored"] == engine_main.MIRRORED_DIGESTS
