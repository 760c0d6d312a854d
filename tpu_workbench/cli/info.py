"""``tpu-workbench info``: what can run here: backends, devices, peaks, versions."""

from __future__ import annotations

import argparse
import json

from ..environment import backends, chips
from ..environment.describe import describe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-probe", action="store_true",
                        help="don't start an XLA worker to ask the runtime what it sees")
    parser.add_argument("--refresh-peak", action="store_true",
                        help="measure the host's CPU peak again (the cache keeps the best)")


def info_dict(probe_runtime: bool = True, refresh_peak: bool = False) -> dict:
    """Backend, device kind and count, chip figures, versions, and why no TPU was found."""
    from ..runs.runner import probe
    from ..timing import peak_flops

    if refresh_peak:
        backends.host_peak_flops(refresh=True)
    info = describe(measure_peak=True)
    info["chips"] = {name: chip.as_dict() for name, chip in chips.CHIPS.items()}
    if probe_runtime and info["torch_xla_installed"]:
        seen = probe()
        info["runtime"] = seen
        info["backend"] = f"XLA:{seen['device_hw']}"
        info["device_kind"] = seen["device_kind"]
        info["device_count"] = seen["device_count"]
    elif probe_runtime and info["torch_tpu"]["available"] and info["torch_tpu_installed"]:
        from ..runs.spec import RuntimeConfig

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
    from ..environment.torchtpu import TorchTPUStatus

    return TorchTPUStatus(**st).summary()


def info(args: argparse.Namespace) -> int:
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
