"""``tpu-workbench docs``: export every notebook into a static site that works offline."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..docs import (
    build_site,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="site folder")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes and few steps (as in CI)")
    parser.add_argument("--online", action="store_true",
                        help="load marimo's frontend from its CDN instead of bundling it")
    parser.add_argument("--only", default=None, help="comma-separated notebook names")
    parser.add_argument("--jobs", type=int, default=1, help="notebooks exported at a time")


def docs(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    only = [n.strip() for n in args.only.split(",")] if args.only else None
    results = build_site(args.out, smoke=args.smoke, offline=not args.online, only=only,
                         jobs=args.jobs)
    failed = [name for name, problems in results.items() if problems]
    print(f"{len(results) - len(failed)}/{len(results)} notebooks exported to {args.out} in "
          f"{time.perf_counter() - t0:.0f} s; serve with "
          f"`python -m http.server --bind 127.0.0.1 -d {args.out}`")
    return 1 if failed else 0
