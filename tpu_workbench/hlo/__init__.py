"""HLO explorer: parse XLA's HLO text into DataFrames, count FLOPs and collectives, diff modules.

Everything here reads HLO *text* (what ``capture=("hlo",)`` copies into a run's ``hlo/`` folder,
or ``torch_xla._XLAC._get_xla_tensors_hlo``) and is plain Python + pandas: no torch_xla import.
jax/jaxlib (torch_xla's ``[pallas]`` extra) is imported lazily, only for XLA's own cost analysis.

Main entry points:

- :func:`parse_hlo` -> :class:`HloModule` (computations, instructions, header attributes);
  :func:`instructions` -> one row per instruction (columns below).
- :func:`summary` -> dict: ops by opcode, fusions by kind, collectives, FLOPs, bytes.
- :func:`collectives` -> one row per collective op, replica groups expanded (iota form too).
- :func:`cost_analysis` -> XLA's ``HloCostAnalysis`` of the whole module (via jaxlib 0.7.1).
- :func:`per_op_cost` -> FLOPs and bytes per top-level instruction of the entry computation
  (fusions, calls, dots...), for a roofline chart.
- :func:`dot_flops` -> analytic 2*M*N*K of every dot/convolution.
- :func:`diff` / :func:`diff_modules` -> opcode and collective counts of two modules (or lists).
- :func:`load_run_hlo`, :func:`read_hlo`, :func:`main_module`, :func:`memory_report`,
  :func:`search`: files of a run, the memory-usage report, a searchable listing.
- :func:`add_arguments` / :func:`run`: the ``tpu-workbench hlo`` command.

Columns of :func:`instructions`:

=================  ============================================================================
module             the module's name (``HloModule`` line)
computation        the computation holding the instruction
is_entry           True in the entry computation (the program XLA runs)
is_root            True for the computation's ROOT instruction
name               instruction name, without ``%``
opcode             ``dot``, ``fusion``, ``all-reduce``...
shape              result shape text without layout, e.g. ``f32[8,128]`` or ``(f32[2], s32[])``
dtype              element type of an array result (``f32``, ``bf16``...), ``tuple`` for tuples
dims               tuple of ints for an array result, None for a tuple
elements           number of elements of the result (sum over a tuple's leaves)
bytes              size of the result in bytes (sum over a tuple's leaves)
fusion_kind        ``kLoop``, ``kInput``, ``kOutput``, ``kCustom`` for fusions, else ""
called             computations the instruction calls (``calls=``, ``to_apply=``, ``body=``...)
operands           names of the operands
source_op          ``metadata={op_type=...}`` (the aten op torch_xla lowered), else ""
source_file        ``metadata={source_file=...}`` (needs ``XLA_HLO_DEBUG=1``), else ""
source_line        ``metadata={source_line=...}``, else None
replica_groups     the ``replica_groups=`` text of a collective (``source_target_pairs=`` for a
                   collective-permute), else ""
attributes         dict of every ``key=value`` attribute, values as text
line               1-based line number in the text
text               the instruction's line as written
=================  ============================================================================

Which text for FLOPs: jaxlib 0.7.1 parses both ``before_optimizations`` and XLA:CPU's
``cpu_after_optimizations`` dumps (checked on minGPT, the MLP and a 2x4 SPMD program). The
*before* text gives the model's logical FLOPs; the *after* text gives what the optimised (and,
with SPMD, per-device partitioned) program computes. :func:`summary` reports both XLA's count
(``xla_flops``, when jaxlib is there) and the analytic dot/convolution count (``dot_flops``,
always).
"""

from __future__ import annotations

from .cost import (
    ELEMENTWISE_OPS,
    FREE_OPS,
    PER_OP_COLUMNS,
    TRANSCENDENTAL_OPS,
    cost_analysis,
    dot_flops,
    instruction_flops,
    per_op_cost,
)
from .files import (
    FILE_COLUMNS,
    classify_file,
    load_run_hlo,
    main_module,
    memory_report,
    read_hlo,
    search,
    write_run_hlo,
)
from .frames import (
    COLLECTIVE_KINDS,
    COLUMNS,
    as_frame,
    collective_table,
    collectives,
    fusion_table,
    instructions,
    op_counts,
    parse_replica_groups,
)
from .kernels import (
    KERNEL_COLUMNS,
    PLUMBING,
    OpDetail,
    find_kernel,
    kernels,
    op_detail,
    program_counts,
    with_kinds,
)
from .parse import (
    CALL_ATTRS,
    COMMENT,
    DTYPE_BITS,
    INLINE_CALLS,
    LITERAL_OPS,
    CostAnalysisError,
    HloComputation,
    HloInstruction,
    HloLike,
    HloModule,
    HloParseError,
    as_modules,
    clip,
    dtype_bits,
    names,
    parse_hlo,
    parse_metadata,
    parse_modules,
    shape_info,
    shape_leaves,
    strip_layouts,
)
from .summary import (
    DIFF_COLUMNS,
    diff,
    diff_modules,
    summary,
)

__all__ = [
    "collective_table", "KERNEL_COLUMNS", "PLUMBING", "OpDetail", "find_kernel", "kernels",
    "op_detail", "program_counts", "with_kinds",
    "fusion_table",
    "CALL_ATTRS",
    "COMMENT",
    "CostAnalysisError",
    "DTYPE_BITS",
    "HloComputation",
    "HloInstruction",
    "HloLike",
    "HloModule",
    "HloParseError",
    "INLINE_CALLS",
    "LITERAL_OPS",
    "clip",
    "dtype_bits",
    "as_modules",
    "names",
    "parse_hlo",
    "parse_metadata",
    "parse_modules",
    "shape_info",
    "shape_leaves",
    "strip_layouts",
    "COLLECTIVE_KINDS",
    "COLUMNS",
    "as_frame",
    "collectives",
    "instructions",
    "op_counts",
    "parse_replica_groups",
    "ELEMENTWISE_OPS",
    "FREE_OPS",
    "PER_OP_COLUMNS",
    "TRANSCENDENTAL_OPS",
    "cost_analysis",
    "dot_flops",
    "instruction_flops",
    "per_op_cost",
    "DIFF_COLUMNS",
    "diff",
    "diff_modules",
    "summary",
    "FILE_COLUMNS",
    "classify_file",
    "load_run_hlo",
    "main_module",
    "memory_report",
    "read_hlo",
    "search",
    "write_run_hlo",
]
