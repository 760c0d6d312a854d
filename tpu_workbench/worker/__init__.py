"""The worker side: the only package that imports torch_xla or torch_tpu.

A worker process (``python -m tpu_workbench.worker``, started by :mod:`tpu_workbench.runs.runner`
with its runtime's environment already set) serves runs over a line protocol (:mod:`.serve`). Each
run trains in :func:`.train.train` through one :class:`.backend.Backend` object of its runtime:
:mod:`.xla` (torch_xla: XLA:CPU or a TPU, with :mod:`.spmd` for meshes), :mod:`.pytorch` (plain
PyTorch eager and inductor) and :mod:`.torchtpu` (TorchTPU on a chip).
"""
