"""Why did XLA compile? Parse torch_xla's compilation analysis into records.

With ``PT_XLA_DEBUG_LEVEL=1`` and ``PT_XLA_DEBUG_FILE=path`` (set for workers whose runtime has
``explain_compiles``), torch_xla appends one "Compilation Analysis" block per compilation: the
cause it infers, the graph hash, the number of graph inputs and outputs, and the Python frames
that triggered it. Nothing is written for executions, but torch_xla's debug mode still slows
every step (measured ~20% on minGPT tiny), which is why it is opt-in.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_BLOCK = re.compile(r"Compilation Analysis: Compilation Cause\n(?P<body>.*?)"
                    r"Compilation Analysis: -{20,}", re.S)


def parse_compilation_analysis(text: str) -> list[dict[str, Any]]:
    """One dict per compilation block: cause, graph_hash, inputs, outputs, frame."""
    events = []
    for match in _BLOCK.finditer(text):
        lines = [ln.removeprefix("Compilation Analysis:").strip()
                 for ln in match.group("body").splitlines()]
        event: dict[str, Any] = {"cause": lines[0] if lines else "", "graph_hash": "",
                                 "inputs": None, "outputs": None, "frame": ""}
        frames: list[str] = []
        in_frames = False
        for ln in lines[1:]:
            if ln.startswith("Graph Hash:"):
                event["graph_hash"] = ln.split(":", 1)[1].strip()
            elif ln.startswith("Number of Graph Inputs:"):
                event["inputs"] = int(ln.split(":", 1)[1])
            elif ln.startswith("Number of Graph Outputs:"):
                event["outputs"] = int(ln.split(":", 1)[1])
            elif ln.startswith("Python Frame Triggered Execution"):
                in_frames = True
            elif in_frames and ln and "/torch_xla/" not in ln and "/torch/" not in ln:
                frames.append(ln)
        event["frame"] = frames[0] if frames else ""
        events.append(event)
    return events


class CompileLog:
    """Follows the worker's PT_XLA_DEBUG_FILE and returns the blocks added since the last read."""

    def __init__(self, path: str | None):
        self.path = Path(path) if path else None
        self.offset = self.path.stat().st_size if self.path and self.path.exists() else 0
        self.seen: list[dict[str, Any]] = []

    def new_events(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.exists():
            return []
        with self.path.open() as fh:
            fh.seek(self.offset)
            text = fh.read()
        # Only consume complete blocks: a block still being written is read next time.
        end = text.rfind("Compilation Analysis: " + "=" * 20)
        if end < 0:
            return []
        end = text.find("\n", end) + 1 if text.find("\n", end) >= 0 else len(text)
        events = parse_compilation_analysis(text[:end])
        self.offset += len(text[:end].encode())
        for event in events:
            event["explanation"] = explain(event, self.seen)
            self.seen.append(event)
        return events


def explain(event: dict[str, Any], earlier: list[dict[str, Any]]) -> str:
    """A plain-words reason for a compilation, from torch_xla's cause and the earlier graphs."""
    cause = event.get("cause", "")
    if "access tensor value" in cause:
        return ("a tensor's value was read (.item(), print, a Python `if` on a tensor) before the "
                "step ended, which cut the graph in two")
    if not earlier:
        return "first compilation of this program"
    same_site = [e for e in earlier if e.get("frame") == event.get("frame")]
    if any(e["graph_hash"] == event["graph_hash"] for e in earlier):
        return "a graph compiled before, evicted from the cache"
    if same_site:
        last = same_site[-1]
        if (last["inputs"], last["outputs"]) == (event["inputs"], event["outputs"]):
            return ("same code and the same number of inputs and outputs as an earlier graph: an "
                    "input's shape or dtype changed (a new batch size or sequence length?)")
        if last["outputs"] != event["outputs"]:
            return (f"the graph's outputs changed ({last['outputs']} -> {event['outputs']}): a "
                    "different set of live tensors, e.g. a tensor kept across steps")
        return "the same code traced a different graph"
    return f"a new program ({cause})"


_EXECUTION = re.compile(r"Execution Analysis: Execution Cause\n(?P<body>.*?)"
                        r"Execution Analysis: -{20,}", re.S)
_FRAME = re.compile(r"^\s*(?P<function>.*?) \((?P<file>.*):(?P<line>\d+)\)\s*$")


def parse_execution_analysis(text: str) -> list[dict[str, Any]]:
    """One dict per execution block (``PT_XLA_DEBUG_LEVEL=2``): its cause, its graph's hash and
    every Python frame torch_xla recorded, innermost first, as ``(function, file, line)``."""
    events = []
    for match in _EXECUTION.finditer(text):
        lines = [ln.removeprefix("Execution Analysis:").strip()
                 for ln in match.group("body").splitlines()]
        frames, in_frames, graph = [], False, ""
        for ln in lines[1:]:
            if ln.startswith("Graph Hash:"):
                graph = ln.split(":", 1)[1].strip()
            elif ln.startswith("Python Frame Triggered Execution"):
                in_frames = True
            elif in_frames and (m := _FRAME.match(ln)):
                frames.append((m["function"], m["file"], int(m["line"])))
        events.append({"cause": lines[0] if lines else "", "graph_hash": graph,
                       "frames": frames})
    return events
