"""The ``tpu-workbench`` command line (also ``python -m tpu_workbench``).

Subcommands register themselves in :data:`COMMANDS`: each is a function that adds its arguments
to a sub-parser and returns the function that runs it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable

from . import backends, chips
from .errors import WorkbenchError

Handler = Callable[[argparse.Namespace], int]


def _add_info(parser: argparse.ArgumentParser) -> Handler:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-probe", action="store_true",
                        help="don't start an XLA worker to ask the runtime what it sees")
    parser.add_argument("--refresh-peak", action="store_true",
                        help="measure the host's CPU peak again (the cache keeps the best)")
    return cmd_info


def info_dict(probe_runtime: bool = True, refresh_peak: bool = False) -> dict:
    """Backend, device kind and count, chip figures, versions, and why no TPU was found."""
    from .runner import probe
    from .timing import peak_flops

    if refresh_peak:
        backends.host_peak_flops(refresh=True)
    info = backends.describe(measure_peak=True)
    info["chips"] = {name: chip.as_dict() for name, chip in chips.CHIPS.items()}
    if probe_runtime and info["torch_xla_installed"]:
        seen = probe()
        info["runtime"] = seen
        info["backend"] = f"XLA:{seen['device_hw']}"
        info["device_kind"] = seen["device_kind"]
        info["device_count"] = seen["device_count"]
    elif probe_runtime and info["torch_tpu"]["available"] and info["torch_tpu_installed"]:
        from .spec import RuntimeConfig

        seen = probe(RuntimeConfig("torch_tpu", "tpu"))  # a TorchTPU worker on the chip
        info["runtime"] = seen
        info["backend"] = f"TorchTPU:{seen['device_kind']}"
        info["device_kind"] = seen["device_kind"]
        info["device_count"] = seen["device_count"]
    else:
        info["backend"] = "torch:cuda" if info["cuda_devices"] else "torch:cpu"
        info["device_kind"] = "cuda" if info["cuda_devices"] else "cpu"
        info["device_count"] = max(info["cuda_devices"], 1)
    # One chip's peak (the chip table, or TorchTPU's own figure) or the host's measured one.
    info["peak_flops"], info["peak_source"] = peak_flops(info.get("runtime") or {
        "runtime": "torch", "device": "cuda" if info["cuda_devices"] else "cpu"})
    info["peak_method"] = None if info["tpu"]["available"] else info["host_peak"]["method"]
    info["why_no_tpu"] = None if info["tpu"]["available"] else info["tpu"]["reason"]
    return info


def _torchtpu_line(st: dict) -> str:
    from .torchtpu import TorchTPUStatus

    return TorchTPUStatus(**st).summary()


def cmd_info(args: argparse.Namespace) -> int:
    info = info_dict(probe_runtime=not args.no_probe, refresh_peak=args.refresh_peak)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    v = info["versions"]
    rows = [
        ("backend", info["backend"]),
        ("devices", f"{info['device_count']} x {info['device_kind']}"),
        ("TPU", "yes" if info["tpu"]["available"] else f"no: {info['tpu']['reason']}"),
    ]
    if not info["tpu"]["available"]:
        rows.append(("runs instead", info["tpu"]["fallback"]))
    rows.append(("TorchTPU", _torchtpu_line(info["torch_tpu"])))
    rows += [
        ("peak FLOP/s", f"{info['peak_flops'] / 1e9:,.1f} GFLOP/s ({info['peak_source']})"),
        *([("measured how", info["peak_method"] + "; --refresh-peak measures again")]
          if info["peak_method"] else []),
        ("CPU", f"{info['cpu']['model']} ({info['cpu']['cores']} cores)"),
        ("CUDA devices", str(info["cuda_devices"])),
    ]
    rows += [(name, v.get(name) or "not installed")
             for name in ("torch", "torch_xla", "libtpu", "torch_tpu", "jax", "marimo", "python")]
    width = max(len(k) for k, _ in rows)
    print("tpu-workbench info")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print("\nTPU chips (peak figures; source: " + chips.SOURCE + ")")
    print(chips.chip_table().drop(columns=["source"]).to_string(index=False))
    return 0


def _subcommand(module: str) -> Callable[[argparse.ArgumentParser], Handler]:
    """Arguments and handler of a subcommand living in ``tpu_workbench.<module>``
    (its ``add_arguments(parser)`` and ``run(args)``), imported only when used."""

    def add(parser: argparse.ArgumentParser) -> Handler:
        mod = importlib.import_module(f"{__package__}.{module}")
        mod.add_arguments(parser)
        return mod.run

    return add


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], Handler]]] = {
    "info": ("what can run here: backends, devices, peaks, versions", _add_info),
    "bench": ("compare execution modes: steps.csv, summary.csv and charts",
              _subcommand("bench")),
    "hlo": ("what XLA compiled: HLO texts, ops.csv, summary.json", _subcommand("hlo")),
    "shard": ("lay a model out on a device mesh: layouts, memory, collectives",
              _subcommand("sharding")),
    "profile": ("profile training steps: traces, ops.csv, steps.csv, top ops",
                _subcommand("profiling")),
    "cache": ("the compile cache: cold vs warm worker vs a new shape; --persistent",
              _subcommand("compile_cache")),
    "docs": ("export every notebook into a static site that works offline", _subcommand("docs")),
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
