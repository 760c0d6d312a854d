"""The ``tpu-workbench`` command line (also ``python -m tpu_workbench``).

One module per subcommand (``tpu_workbench.cli.<name>``), each with ``add_arguments(parser)`` and a
handler named after the subcommand, imported only when that subcommand is used.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from ..errors import WorkbenchError

Handler = Callable[[argparse.Namespace], int]


def _subcommand(module: str, handler: str) -> Callable[[argparse.ArgumentParser], Handler]:
    """Arguments and handler of the subcommand in ``tpu_workbench.cli.<module>``."""

    def add(parser: argparse.ArgumentParser) -> Handler:
        mod = importlib.import_module(f"{__name__}.{module}")
        mod.add_arguments(parser)
        return getattr(mod, handler)

    return add


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], Handler]]] = {
    "info": ("what can run here: backends, devices, peaks, versions",
             _subcommand("info", "info")),
    "bench": ("compare execution modes: steps.csv, summary.csv and charts",
              _subcommand("bench", "bench")),
    "hlo": ("what XLA compiled: HLO texts, ops.csv, summary.json", _subcommand("hlo", "hlo")),
    "shard": ("lay a model out on a device mesh: layouts, memory, collectives",
              _subcommand("shard", "shard")),
    "profile": ("profile training steps: traces, ops.csv, steps.csv, top ops",
                _subcommand("profile", "profile")),
    "cache": ("the compile cache: cold vs warm worker vs a new shape; --persistent",
              _subcommand("cache", "cache")),
    "docs": ("export every notebook into a static site that works offline",
             _subcommand("docs", "docs")),
    "compile": ("a step compiled by libtpu for a TPU slice, no chip: memory, ops, collectives",
                _subcommand("compile", "compile")),
    "predict": ("predicted TPU step time, MFU and bottleneck per slice and strategy",
                _subcommand("predict", "predict")),
    "serve-plan": ("vLLM-TPU serving a model on a v6e slice: its programs compiled by libtpu, "
                   "ITL, TTFT, tokens/s and KV capacity per concurrency: serve.csv",
                   _subcommand("serve_plan", "serve_plan")),
    "generate": ("decode strategies x modes: tokens.csv, summary.csv and charts",
                 _subcommand("generate", "generate")),
    "sweep": ("a grid of runs on the local pool or a Ray cluster: steps/summary.csv, charts",
              _subcommand("sweep", "sweep")),
    "launch": ("commands and environment for every host of a multi-host slice; --execute",
               _subcommand("launch", "launch")),
    "port": ("what blocks a model on a TPU, at its line, with the fix tried: findings.csv",
             _subcommand("port", "port")),
    "titan": ("TorchTitan's own trainer over torchrun ranks (FSDP2, TP, 2D), streamed into "
              "the workbench's records: losses, memory per rank", _subcommand("titan", "titan")),
    "acceptance": ("on a TPU VM: every 'only on a TPU' item checked, a Markdown + JSON report",
                   _subcommand("acceptance", "acceptance")),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpu-workbench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.set_defaults(handler=add(sp))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except WorkbenchError as exc:
        print(f"tpu-workbench {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
