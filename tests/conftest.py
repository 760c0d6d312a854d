"""Shared test helpers: notebook discovery, the smoke environment, exported-HTML checks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("*.py") if "marimo.App(" in p.read_text())


def smoke_env(tmp_path: Path) -> dict[str, str]:
    """Environment for running a notebook quickly and without writing into the checkout."""
    return {**os.environ, "TPU_WORKBENCH_SMOKE": "1",
            "TPU_WORKBENCH_RESULTS": str(tmp_path / "results")}


@pytest.fixture
def results(tmp_path, monkeypatch):
    """Send run results to a temporary folder."""
    monkeypatch.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"


@pytest.fixture(scope="module")
def one_torch_thread():
    """In-process PyTorch on one thread for a module (``pytestmark = pytest.mark.usefixtures(
    "one_torch_thread")``): two OpenMP threads on a 2-core machine that is running anything else
    (a worker, a browser) spin at every barrier and make small steps 10-50x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# The longest test files (from the CI log's --durations), started first: the suite runs on two
# pytest workers a file at a time (scripts/dev.py), and longest-first makes them finish together.
LONGEST_FIRST = ["test_notebooks.py", "test_models_xla.py", "test_modes.py",
                 "test_nb_sharding.py", "test_browser_exercises.py", "test_sharding.py",
                 "test_gang.py", "test_tpu_compile.py", "test_generation.py", "test_acceptance.py",
                 "test_hf_models.py",
                 "test_sweep.py", "test_cli.py", "test_browser.py"]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: else as found
