"""``tpu-workbench acceptance``: every "only on a TPU" item checked end to end, one report."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..acceptance.checks import CHECKS

    parser.add_argument("--out", default="acceptance",
                        help="folder for acceptance.md, acceptance.json and the checks' runs")
    parser.add_argument("--only", default=None,
                        help="comma-separated checks to run: " + ", ".join(c.key for c in CHECKS))
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds each run may take before its worker is stopped")


def acceptance(args: argparse.Namespace) -> int:
    """Run the checks, print one line per check; exit 1 only if a check failed."""
    from ..acceptance.checks import acceptance as run_checks

    report = run_checks(args.out, only=args.only, timeout=args.timeout)
    width = max(len(r["key"]) for r in report["checks"])
    for r in report["checks"]:
        print(f"  {r['key']:<{width}}  {r['status']}: {' '.join(r['detail'].split())[:160]}")
    print(f"wrote {args.out}/acceptance.md and acceptance.json ({report['wall_s']} s)")
    return 1 if report["counts"]["fail"] else 0
