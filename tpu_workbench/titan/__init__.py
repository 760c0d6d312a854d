"""TorchTitan through the workbench: its own trainer run as a torchrun gang, and its configs
planned for a TPU slice.

TorchTitan (``torchtitan`` 0.3.0, in ``.venv-torchtpu``: it needs torch >= 2.11) is PyTorch's
own trainer for FSDP2, tensor and pipeline parallelism. The workbench does not re-implement it:

- :mod:`~tpu_workbench.titan.config` reads a TorchTitan TOML (the format TorchTitan shipped up
  to v0.2.2; :data:`SHIPPED` are its own Llama-3 configs) and maps every key onto TorchTitan
  0.3.0's command line, refusing an unknown key, degrees that do not divide the ranks and what
  is not offered, before anything starts (pure: no torch);
- :mod:`~tpu_workbench.titan.data` makes the small tokenizer and text the runs train on (no
  download), which TorchTitan loads through its own tokenizer and dataset classes;
- :mod:`~tpu_workbench.titan.spec` is a run (:class:`TitanSpec`, an ExperimentSpec) and
  :mod:`~tpu_workbench.titan.runs` runs it: the runner's gang (:mod:`tpu_workbench.runs.gang`)
  starts ``torchrun`` with one rank per process of :mod:`tpu_workbench.worker.titan`, which
  builds TorchTitan's ``Trainer`` from that command line and streams its metrics as the
  workbench's records (so the live step chart, the results folder and reuse work as for any
  run).
"""

from __future__ import annotations

from pathlib import Path

CONFIGS = Path(__file__).resolve().parent / "configs"
# TorchTitan's own Llama-3 configs (copied from its v0.2.2 tag) and the workbench's default.
SHIPPED = {path.stem: path for path in sorted(CONFIGS.glob("*.toml"))}
DEFAULT_CONFIG = "debug_model_cpu"
