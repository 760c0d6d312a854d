#!/usr/bin/env python3
"""Set up the project's .venv (once) and run the quickstart or the tests.

    python3 scripts/dev.py quickstart [marimo edit args...]   # set up, then open the quickstart
    python3 scripts/dev.py test [pytest args...]              # set up, then lint + the whole suite
    python3 scripts/dev.py setup                              # only set up

Needs only python3 (>= 3.11) with venv and pip. Set-up is skipped when .venv already holds an
install of the current pyproject.toml (a stamp file records its hash), so both commands are
idempotent and fast the second time.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".tpu-workbench-setup"


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
    if not argv or argv[0] not in {"setup", "quickstart", "test"}:
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    setup()
    bin_dir = VENV / "bin"
    if command == "setup":
        return 0
    if command == "quickstart":
        args = [str(bin_dir / "marimo"), "edit", "notebooks/quickstart.py", *rest]
        os.chdir(ROOT)
        os.execv(args[0], args)
    ensure_chromium()
    _run([str(bin_dir / "ruff"), "check", "."])
    _run([str(bin_dir / "marimo"), "check", "--strict", *sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.py"))])
    # --durations: the slowest tests in every CI log, to keep the suite under its time budget.
    return subprocess.run([str(PY), "-m", "pytest", "--durations=15", *rest],
                          cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
