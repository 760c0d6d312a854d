"""The TorchTPU environment's test set (``.venv-torchtpu``: torch 2.13 CPU + torch_tpu 0.2.0 +
libtpu, no torch_xla). Run by ``python3 scripts/dev.py test-torchtpu`` (and by ``dev.py test``
after the main suite). No TPU chip is needed: these tests check the no-chip behaviour and that
every TorchTPU name the adapter calls exists in the installed wheel."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("torch_tpu") is None:  # run from the wrong environment
    pytest.exit("tests_torchtpu needs .venv-torchtpu (python3 scripts/dev.py test-torchtpu)",
                returncode=4)


# This test process imports torch_tpu explicitly where it needs it (missing_api does); not
# autoloading it on `import torch` saves ~8 s of the set's 90 s budget. Subprocesses that stand
# for a user's (the quickstart's kernel, a TorchTPU worker) get the default back: see as_user.
AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"
os.environ[AUTOLOAD] = "0"


@pytest.fixture
def as_user(monkeypatch):
    """Subprocesses started in the test see the default environment (torch_tpu autoloads)."""
    monkeypatch.delenv(AUTOLOAD, raising=False)


@pytest.fixture
def results(tmp_path, monkeypatch):
    """Send run results (and the workbench cache) to a temporary folder."""
    monkeypatch.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"
