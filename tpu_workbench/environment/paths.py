"""Where the workbench keeps its caches and results."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Cache folder (measured host peak, inductor cache, compile caches).

    ``TPU_WORKBENCH_CACHE`` overrides the default ``~/.cache/tpu_workbench``.
    """
    path = Path(os.environ.get("TPU_WORKBENCH_CACHE", Path.home() / ".cache" / "tpu_workbench"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def results_dir() -> Path:
    """Folder for run results (records, HLO, traces): ``TPU_WORKBENCH_RESULTS`` or ./results."""
    return Path(os.environ.get("TPU_WORKBENCH_RESULTS", "results")).resolve()


def writable_folder(path: Path | str) -> Path:
    """Create `path` and check it can be written, before any expensive work (SpecError if not)."""
    from ..errors import SpecError

    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise SpecError(f"output folder {str(path)!r} is not writable: "
                        f"{exc.strerror or exc}") from None
    return path
