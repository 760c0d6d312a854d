"""The screenshot and benchmark scripts parse their arguments and refuse bad ones (no browser)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPTS = ROOT / "scripts"


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("script, option", [("screenshot_notebooks.py", "--out"),
                                            ("bench_notebooks.py", "--repeat"),
                                            ("bench_workers.py", "--runtimes"),
                                            ("bench_port.py", "--models")])
def test_help_lists_the_options(script, option):
    proc = _run(script, "--help")
    assert proc.returncode == 0, proc.stderr
    assert option in proc.stdout


def test_screenshot_needs_an_output_folder():
    proc = _run("screenshot_notebooks.py", "notebooks/resnet.py")
    assert proc.returncode == 2
    assert "--out" in proc.stderr


def test_screenshot_refuses_a_missing_notebook(tmp_path):
    proc = _run("screenshot_notebooks.py", "notebooks/no_such_notebook.py", "--out",
                str(tmp_path))
    assert proc.returncode == 2
    assert "no such notebook: notebooks/no_such_notebook.py" in proc.stderr
    assert not list(tmp_path.iterdir())  # nothing was started or written


def test_bench_refuses_an_unknown_notebook():
    proc = _run("bench_notebooks.py", "--notebooks", "quickstart,nope")
    assert proc.returncode == 2
    assert "unknown notebook(s): nope" in proc.stderr
    proc = _run("bench_notebooks.py", "--notebooks", "floor_cells,notebooks/no_such.py")
    assert proc.returncode == 2
    assert "unknown notebook(s): notebooks/no_such.py (valid: quickstart" in proc.stderr


def test_worker_benchmark_refuses_an_unknown_runtime_before_starting_anything():
    proc = _run("bench_workers.py", "--runtimes", "xla,jax")
    assert proc.returncode == 2
    assert "unknown runtime(s) jax; valid: xla, torch" in proc.stderr
    assert "template start" not in proc.stdout


def test_port_benchmark_refuses_too_few_steps_and_a_missing_folder():
    proc = _run("bench_port.py", "--steps", "2")
    assert proc.returncode == 2 and "--steps must be >= 3" in proc.stderr
    proc = _run("bench_port.py", "--models", "no/such/folder")
    assert proc.returncode == 2 and "--models no/such/folder: no such folder" in proc.stderr
