"""The workbench's own Pallas TPU kernels, each with a plain PyTorch reference.

* :mod:`kernels.rmsnorm`: fused RMSNorm (``rmsnorm``, ``rmsnorm_reference``).
* :mod:`kernels.flash_attention`: block-wise attention with an online softmax
  (``flash_attention``, ``attention_reference``).
* :mod:`kernels.tiling`: the block schedule of each kernel as DataFrames (what is in VMEM when).
* :mod:`kernels.lowering`: the ``tpu_custom_call`` a compiled kernel becomes, lowered without a TPU.
* :mod:`kernels.torch_bridge`: calling them on torch tensors (interpret mode on CPU, torch_xla's
  ``make_kernel_from_pallas`` on a TPU).
* :mod:`kernels.check`: the numerical check against the references (relative error per shape).
* :mod:`kernels.bench`: kernel vs XLA attention timings on a TPU (a subprocess).
* :mod:`kernels.xla_flash`: torch_xla's own Pallas flash attention as a Transformers attention
  implementation (the hf:* families' ``attn_implementation="flash"``), and ``tpu_lowering()``,
  which makes torch_xla lower Pallas kernels for the TPU while a step is traced on XLA:CPU.
* :mod:`kernels.remat`: activation checkpointing of whole blocks (the hf:* ``remat=True``),
  torch_xla's checkpoint on XLA tensors and torch's elsewhere. Here, not in ``tpu_workbench``,
  because only the worker package of ``tpu_workbench`` may import torch_xla.

Block sizes are parameters and are validated in plain Python (ValueError naming the value and
what is valid) before anything is traced. Importing this package does not import jax; the
kernels import it when they run.

Call them as ``kernels.rmsnorm.rmsnorm(...)``, ``kernels.flash_attention.flash_attention(...)``
(jax arrays) or through ``kernels.torch_bridge`` (torch tensors).
"""

from . import flash_attention, lowering, rmsnorm, tiling, torch_bridge
from ._common import relative_error

# `kernels.check` and `kernels.bench` are also command-line entry points (python -m ...), so
# they are imported on demand: ``from kernels import check``.
__all__ = ["flash_attention", "lowering", "relative_error", "rmsnorm", "tiling", "torch_bridge"]
