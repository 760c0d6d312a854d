"""What every notebook's cell graph must look like, read statically (nothing runs): no cell that
other cells depend on calls ``mo.stop`` (each of them would show marimo's "Ancestor stopped"
box while the section waits), and no exercise's judge is written in a notebook's visible code."""

from __future__ import annotations

import importlib.util
import re

import pytest
from conftest import NOTEBOOKS


def _graph(path):
    spec = importlib.util.spec_from_file_location(f"nb_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # runs the setup cell only
    app = module.app
    app._maybe_initialize()  # marimo's own dataflow graph of the cells
    return app._graph


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_only_cells_nothing_depends_on_call_mo_stop(path):
    graph = _graph(path)
    stopping = [cell for cid, cell in graph.cells.items()
                if "mo.stop(" in cell.code and graph.children.get(cid)]
    assert not stopping, "cells that call mo.stop and have dependants:\n" + "\n---\n".join(
        cell.code[:300] for cell in stopping)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_exercise_judges_live_in_the_library(path):
    text = path.read_text()
    assert not re.search(r"@app\.function[^\n]*\ndef (judge|\w*verdict)", text), (
        "an exercise's judge is in the notebook, where the reader sees the answer: move it to "
        "tpu_workbench/exercises/")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_parses_on_this_python(path):
    """marimo keeps a cell this Python cannot parse as an "unparsable cell" that never runs
    (and no export reports it): a 3.12-only f-string, say."""
    assert "_unparsable_cell(" not in path.read_text()


# A cell that starts a worker, a kernel or a measured run.
_STARTS_WORK = re.compile(r"\b(?:wb\.run|SECTIONS\.run|run_live|run_many|submit|check_shape|"
                          r"check_attention|check_rmsnorm|wb\.sweep|wb\.predict)\(")


def _exercise_forms(graph) -> list[str]:
    """Cells defining a form submitted with "check": the exercises' answers."""
    return [cid for cid, cell in graph.cells.items()
            if ".form(" in cell.code and 'submit_button_label="check"' in cell.code]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_checking_an_answer_starts_no_work(path):
    """Submitting an answer re-runs the cells below its form in marimo's dataflow graph: none of
    them may start a worker (or a kernel), and no measuring cell depends on the form, so a
    check is instant and never re-measures what the page shows."""
    graph = _graph(path)
    forms = _exercise_forms(graph)
    if not forms:
        pytest.skip(f"{path.name} has no exercise")
    for form in forms:
        rerun = graph.descendants(form)
        assert rerun, "the answer is never checked"
        for cid in rerun:
            assert not _STARTS_WORK.search(graph.cells[cid].code), graph.cells[cid].code[:300]
