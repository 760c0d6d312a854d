"""The package's shape: every relative import resolves (function-local ones too, which only run
when their code path does), and no module grows past the size a reader holds in their head."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import tpu_workbench

PACKAGE = Path(tpu_workbench.__file__).parent


def _relative_imports():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = parts if path.name == "__init__.py" else parts[:-1]
        package = [p for p in package if p != "__init__"]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    yield path.relative_to(PACKAGE), node.lineno, target, alias.name


def test_every_relative_import_resolves():
    broken = []
    for where, line, target, name in _relative_imports():
        module = importlib.import_module(target)
        if not hasattr(module, name):
            try:
                importlib.import_module(f"{target}.{name}")
            except ModuleNotFoundError:
                broken.append(f"{where}:{line}: from {target} import {name}")
    assert not broken, broken


def test_no_module_is_oversized():
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines())
             for p in PACKAGE.rglob("*.py")}
    assert {k: v for k, v in sizes.items() if v > 550} == {}


def test_sweeps_import_no_ray_until_a_ray_sweep_runs():
    """`wb.sweep`/`wb.grid` and the CLI's sweep module load Ray only inside a Ray sweep."""
    import subprocess
    import sys

    code = ("import sys, tpu_workbench as wb; wb.sweep, wb.grid, wb.SweepResult; "
            "import tpu_workbench.cli.sweep, tpu_workbench.scale.sweeps; "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout
