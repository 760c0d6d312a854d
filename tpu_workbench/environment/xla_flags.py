"""Validate ``XLA_FLAGS`` before a worker starts: an unknown flag aborts the whole process.

XLA parses ``XLA_FLAGS`` once, when torch_xla initialises, and kills the process on a name it
does not know (``F parse_flags_from_env.cc: Unknown flag in XLA_FLAGS``). The names XLA knows are
string literals in torch_xla's ``_XLAC`` binary; scanning it (about 0.5 s, once per process) gives
a superset of the valid names, enough to catch typos with a "did you mean" before anything
starts. A wrong *value* for a known flag can still abort the worker: the runner reports that as
a :class:`~tpu_workbench.errors.WorkerCrashed` with XLA's own message.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import mmap
import re
from collections.abc import Iterable

from ..errors import SpecError

_FLAG = re.compile(r"^--([a-z0-9_]+)(=.*)?$")


@functools.cache
def known_xla_flags() -> frozenset[str]:
    """Flag names found in torch_xla's binary (empty if torch_xla is not installed)."""
    spec = importlib.util.find_spec("_XLAC")  # finds the extension without importing it
    if spec is None or not spec.origin:
        return frozenset()
    with open(spec.origin, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return frozenset(x.decode() for x in re.findall(rb"xla_[a-z0-9_]{3,}", m))


def validate_xla_flags(flags: Iterable[str]) -> None:
    """Raise SpecError for a malformed or unknown flag, naming it and the closest known ones."""
    flags = list(flags)
    if not flags:
        return
    known = known_xla_flags()
    for flag in flags:
        if not isinstance(flag, str):
            raise SpecError(f"XLA flag {flag!r} must be a string like '--xla_dump_to=DIR'")
        match = _FLAG.match(flag.strip())
        if not match:
            raise SpecError(f"malformed XLA flag {flag!r}: expected '--name' or '--name=value' "
                            "with a lower-case name such as '--xla_dump_to=/tmp/dump'")
        name = match.group(1)
        if not known:
            raise SpecError(f"XLA flag {flag!r} given but torch_xla is not installed here")
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {', '.join('--' + c for c in close)}?" if close else ""
            raise SpecError(f"unknown XLA flag {flag!r} (it would abort the XLA process){hint}")
