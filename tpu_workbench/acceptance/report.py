"""The TPU acceptance report as Markdown: the chip and versions, then one row per check."""

from __future__ import annotations

from typing import Any


def _cell(value: Any) -> str:
    return " ".join(str(value).split()).replace("|", "\\|")


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: the chip and versions, then one row per check."""
    chip = report["chip"]
    v = report["versions"]
    lines = [f"# TPU acceptance: {report['host']}, {report['started_at']}", "",
             f"- chip: {chip['pci_chips']} x {chip['pci_kind'] or 'none'} on the PCI bus; "
             f"{_cell(chip['tpu_status']['reason'])}",
             f"- TorchTPU: {_cell(chip['torchtpu']['reason'])}",
             "- versions: " + ", ".join(f"{k} {v[k]}" for k in v if v[k]),
             f"- {report['wall_s']} s; " + ", ".join(f"{n} {s}" for s, n in
                                                    report["counts"].items() if n), "",
             "| check | status | detail | figures | s |", "|---|---|---|---|---|"]
    for r in report["checks"]:
        status = r["status"] + (f": {r['detail']}" if r["status"].startswith("needs") else "")
        figures = ", ".join(f"{k}={_short(v)}" for k, v in r["figures"].items())
        lines.append(f"| {r['key']} | {_cell(status)} | "
                     f"{_cell('' if r['status'].startswith('needs') else r['detail'])} | "
                     f"{_cell(figures)} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and len(value) > 4:
        return "[" + ", ".join(_short(x) for x in value[:4]) + ", ...]"
    if isinstance(value, list):
        return "[" + ", ".join(_short(x) for x in value) + "]"
    return str(value)
