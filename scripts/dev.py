#!/usr/bin/env python3
"""Set up the project's .venv (once) and run the quickstart or the tests.

    python3 scripts/dev.py quickstart [marimo edit args...]   # set up, then open the quickstart
    python3 scripts/dev.py test [pytest args...]              # set up, then lint + the whole suite,
                                                              # then (no args) the TorchTPU set
    python3 scripts/dev.py setup                              # only set up (.venv, .venv-libtpu,
                                                              # .venv-serve)
    python3 scripts/dev.py setup-torchtpu                     # set up .venv-torchtpu only
    python3 scripts/dev.py test-torchtpu [pytest args...]     # set it up, run tests_torchtpu/

Needs only python3 (>= 3.11) with venv and pip. Set-up is skipped when .venv already holds an
install of the current pyproject.toml (a stamp file records its hash), so both commands are
idempotent and fast the second time.

.venv-libtpu holds libtpu's TPU compiler (jax 0.10.2 + libtpu 0.0.51, requirements-libtpu.txt):
tpu_workbench.tpu_compile runs it in a process of its own to compile a traced step for a named
TPU slice with no chip. It is small and set up with .venv.

.venv-serve holds vLLM-TPU's JAX engine (tpu-inference 0.32.0 --no-deps, jax 0.11.2, libtpu
0.0.48, flax 0.12.10: requirements-serve.txt) on a Python 3.12 found on PATH or under pyenv:
tpu_workbench.serving compiles the serving engine's model step in it. No 3.12: set-up says so
and skips it.

The second environment, .venv-torchtpu, holds TorchTPU (torch_tpu 0.2.0 + libtpu), which needs
torch >= 2.11 and so cannot live beside torch_xla 2.9: torch 2.13 (CPU build), torch_tpu, the
workbench without its torch/torch_xla pins (pip --no-deps) and requirements-torchtpu.txt. No TPU
is needed to install or test it. Its stamp hashes requirements-torchtpu.txt and pyproject.toml.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".tpu-workbench-setup"
TORCHTPU_VENV = ROOT / ".venv-torchtpu"
TORCHTPU_PY = TORCHTPU_VENV / "bin" / "python"
TORCHTPU_STAMP = TORCHTPU_VENV / ".tpu-workbench-setup"
TORCHTPU_REQUIREMENTS = ROOT / "requirements-torchtpu.txt"
LIBTPU_VENV = ROOT / ".venv-libtpu"
LIBTPU_PY = LIBTPU_VENV / "bin" / "python"
LIBTPU_STAMP = LIBTPU_VENV / ".tpu-workbench-setup"
LIBTPU_REQUIREMENTS = ROOT / "requirements-libtpu.txt"
SERVE_VENV = ROOT / ".venv-serve"
SERVE_PY = SERVE_VENV / "bin" / "python"
SERVE_STAMP = SERVE_VENV / ".tpu-workbench-setup"
SERVE_REQUIREMENTS = ROOT / "requirements-serve.txt"


def _run(cmd: list[str], **kwargs) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, **kwargs)


def setup() -> None:
    """Create .venv and install the project with its dev extras, unless already done."""
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if PY.exists() and STAMP.exists() and STAMP.read_text().strip() == want:
        return
    if not PY.exists():
        _run([sys.executable, "-m", "venv", str(VENV)])
    _run([str(PY), "-m", "pip", "install", "--upgrade", "pip"])
    # torch 2.9.0 from PyPI is a large (CUDA) build: the first install takes a few minutes.
    _run([str(PY), "-m", "pip", "install", "-e", ".[dev]"])
    STAMP.write_text(want + "\n")


def setup_libtpu() -> None:
    """Create .venv-libtpu (jax, jaxlib, libtpu: the TPU compiler that tpu_workbench.tpu_compile
    runs in a process of its own), unless already done for the current requirements."""
    want = hashlib.sha256(LIBTPU_REQUIREMENTS.read_bytes()).hexdigest()
    if LIBTPU_PY.exists() and LIBTPU_STAMP.exists() and LIBTPU_STAMP.read_text().strip() == want:
        return
    if not LIBTPU_PY.exists():
        _run([sys.executable, "-m", "venv", str(LIBTPU_VENV)])
    _run([str(LIBTPU_PY), "-m", "pip", "install", "-q", "-r", str(LIBTPU_REQUIREMENTS)])
    LIBTPU_STAMP.write_text(want + "\n")


def python312() -> str | None:
    """A Python 3.12 interpreter (.venv-serve needs one: jax 0.11): this one, one on PATH, or
    pyenv's newest 3.12."""
    if sys.version_info[:2] == (3, 12):
        return sys.executable
    found = shutil.which("python3.12")
    pyenv = sorted(Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
                   .glob("versions/3.12.*/bin/python3.12"))
    for candidate in ([found] if found else []) + [str(p) for p in reversed(pyenv)]:
        if subprocess.run([candidate, "-c", "import venv, sys; assert sys.version_info[:2] == "
                           "(3, 12)"], capture_output=True).returncode == 0:
            return candidate
    return None


def setup_serve() -> None:
    """Create .venv-serve (tpu-inference, vLLM-TPU's JAX engine, with jax/libtpu/flax pinned as
    it pins them: tpu_workbench.serving compiles its model step in a process of its own),
    unless already done for the current requirements. Without a Python 3.12, says so and
    leaves the rest of the workbench as it is."""
    want = hashlib.sha256(SERVE_REQUIREMENTS.read_bytes()).hexdigest()
    if SERVE_PY.exists() and SERVE_STAMP.exists() and SERVE_STAMP.read_text().strip() == want:
        return
    python = python312()
    if python is None:
        print("note: no Python 3.12 found (on PATH or under pyenv), so .venv-serve (vLLM-TPU's "
              "engine, for `tpu-workbench serve-plan`) is not set up; everything else works. "
              "Install a Python 3.12 and run `python3 scripts/dev.py setup` again.", flush=True)
        return
    started = time.monotonic()
    if not SERVE_PY.exists():
        _run([python, "-m", "venv", str(SERVE_VENV)])
    lines = [line.split("#")[0].strip() for line in SERVE_REQUIREMENTS.read_text().splitlines()]
    no_deps = [line.split("#")[0].strip() for line in SERVE_REQUIREMENTS.read_text().splitlines()
               if "--no-deps" in line.split("#", 1)[-1] and line.split("#")[0].strip()]
    _run([str(SERVE_PY), "-m", "pip", "install", "-q",
          *[line for line in lines if line and line not in no_deps]])
    _run([str(SERVE_PY), "-m", "pip", "install", "-q", "--no-deps", *no_deps])
    SERVE_STAMP.write_text(want + "\n")
    print(f"set up {SERVE_VENV.name} in {time.monotonic() - started:.0f} s", flush=True)


def setup_torchtpu() -> None:
    """Create .venv-torchtpu (torch 2.13 CPU + torch_tpu + libtpu + the workbench without
    torch_xla), unless already done for the current requirements."""
    want = hashlib.sha256(TORCHTPU_REQUIREMENTS.read_bytes()
                          + (ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if TORCHTPU_PY.exists() and TORCHTPU_STAMP.exists() \
            and TORCHTPU_STAMP.read_text().strip() == want:
        return
    started = time.monotonic()
    if not TORCHTPU_PY.exists():
        _run([sys.executable, "-m", "venv", str(TORCHTPU_VENV)])
    _run([str(TORCHTPU_PY), "-m", "pip", "install", "--upgrade", "pip"])
    # torch==2.13.0 is pinned first in the file: pip takes the CPU build (a local file on the
    # dev/CI machines); torch_tpu brings libtpu.
    _run([str(TORCHTPU_PY), "-m", "pip", "install", "-r", str(TORCHTPU_REQUIREMENTS)])
    # The workbench itself, without its own dependencies (they pin torch 2.9 + torch_xla).
    _run([str(TORCHTPU_PY), "-m", "pip", "install", "--no-deps", "-e", "."])
    TORCHTPU_STAMP.write_text(want + "\n")
    print(f"set up {TORCHTPU_VENV.name} in {time.monotonic() - started:.0f} s", flush=True)


def test_torchtpu(rest: list[str]) -> int:
    """The TorchTPU environment's test set (no TPU needed), with its timings."""
    setup_torchtpu()
    env = {**os.environ, "PYTHONWARNINGS": "ignore:<TorchTpu/Performance/TcMalloc/"}
    return subprocess.run([str(TORCHTPU_PY), "-m", "pytest", "tests_torchtpu", "-q",
                           "--durations=5", *rest], cwd=ROOT, env=env).returncode


def ensure_chromium() -> None:
    """The browser tests drive Debian's Chromium; install it where we are root with apt."""
    if shutil.which("chromium") or Path("/usr/bin/chromium").exists():
        return
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        _run(["apt-get", "update", "-qq"])
        _run(["apt-get", "install", "-y", "-qq", "chromium"],
             env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    else:
        print("note: no chromium found; the browser tests will be skipped "
              "(install Debian's `chromium` package to run them)", flush=True)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"setup", "quickstart", "test", "setup-torchtpu",
                                   "test-torchtpu"}:
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "setup-torchtpu":
        setup_torchtpu()
        return 0
    if command == "test-torchtpu":
        return test_torchtpu(rest)
    setup()
    setup_libtpu()
    setup_serve()
    bin_dir = VENV / "bin"
    if command == "setup":
        return 0
    if command == "quickstart":
        args = [str(bin_dir / "marimo"), "edit", "notebooks/quickstart.py", *rest]
        os.chdir(ROOT)
        os.execv(args[0], args)
    ensure_chromium()
    # TorchTitan's runs (the scale-out notebook, `tpu-workbench titan`) start their ranks in
    # .venv-torchtpu even from the main suite: set it up first (idempotent).
    setup_torchtpu()
    _run([str(bin_dir / "ruff"), "check", "."])
    _run([str(bin_dir / "lint-imports")])  # imports run only downhill (pyproject.toml)
    _run([str(bin_dir / "marimo"), "check", "--strict", *sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.py"))])
    # --durations: the slowest tests in every CI log, to keep the suite under its time budget.
    # The whole suite runs on two pytest workers, a test file each at a time (module fixtures
    # are shared within a file): most of a test's time is spent waiting on worker processes,
    # browsers and compiles, so two files overlap well even on two cores; the longest files go
    # first (tests/conftest.py).
    parallel = [] if rest else ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]
    code = subprocess.run([str(PY), "-m", "pytest", "--durations=15", *parallel, *rest],
                          cwd=ROOT).returncode
    if rest:  # a chosen subset of the main suite: not the second environment
        return code
    # Then the second environment (set up first if needed): TorchTPU reports itself without a
    # chip, its API exists in the wheel, the quickstart runs on the fallback (tests_torchtpu).
    torchtpu_code = test_torchtpu([])
    return code or torchtpu_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
