"""``tpu-workbench profile``: profile training steps; write the traces, ops.csv and steps.csv."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..profiling import (
    OPEN_HINT,
    load_profile,
)


def add_arguments(parser: Any) -> None:
    """Arguments of ``tpu-workbench profile``."""
    from ..runs.spec import MODES

    parser.add_argument("--model", default="mingpt")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--mode", default="compile", help=f"one of {', '.join(MODES)}")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=15, help="how many top ops to print")
    parser.add_argument("--out", type=Path, required=True, help="output folder")


def profile(args: Any) -> int:
    """Profile a few steps; write the traces, ops.csv and steps.csv; print the top ops."""
    import shutil

    from ..environment.paths import writable_folder
    from ..errors import SpecError
    from ..runs.runner import run as run_spec
    from ..runs.spec import ExperimentSpec

    if not isinstance(args.steps, int) or args.steps <= 0:
        raise SpecError(f"--steps must be a positive number of steps to profile, got "
                        f"{args.steps!r}")
    out = writable_folder(args.out)
    spec = ExperimentSpec(model=args.model, preset=args.preset, mode=args.mode,
                          steps=args.steps, capture=("profile",)).validate()
    result = run_spec(spec)
    profile = load_profile(result)
    target = out / "profile"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(result.out_dir / "profile", target)
    for name, frame in {"ops.csv": profile.ops, "steps.csv": profile.steps,
                        "runner_steps.csv": result.steps}.items():
        frame.to_csv(out / (name + ".tmp"), index=False)
        (out / (name + ".tmp")).replace(out / name)
    print(f"top {args.top} HLO ops of {spec.model}/{spec.preset}/{spec.mode} (steady steps):")
    cols = ["hlo_op", "count", "per_step_us", "share"]
    print(profile.ops[cols].head(args.top).to_string(
        index=False, float_format=lambda v: f"{v:,.3g}") if len(profile.ops) else
        "  (no HLO ops in this trace: plain PyTorch modes record host-side ops only)")
    trace = target / profile.trace_path.relative_to(result.out_dir / "profile")
    print("\nopen the trace:\n" + OPEN_HINT.format(trace=trace, logdir=target))
    return 0
