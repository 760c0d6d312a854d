"""The TPU's own compiler, offline: a step traced here, compiled by libtpu for a named slice."""

from .compile import (
    CompiledProgram,
    DoesNotFit,
    TPUCompile,
    compile_proto,
    libtpu_python,
    libtpu_version,
    tpu_compile,
)
from .results import OP_COLUMNS, buffers_frame, collectives_frame, memory_summary, ops_frame

__all__ = ["OP_COLUMNS", "CompiledProgram", "DoesNotFit", "TPUCompile", "buffers_frame",
           "collectives_frame", "compile_proto", "libtpu_python", "libtpu_version",
           "memory_summary", "ops_frame", "tpu_compile"]
