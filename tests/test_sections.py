"""`notebook.Sections`: a section measures on open (reusing a stored run), then only on a click
(afresh); a control changed in between shows a stored run or waits, saying so in words."""

from __future__ import annotations

import marimo as mo
import pytest

from tpu_workbench import notebook


@pytest.fixture
def shown(monkeypatch):
    out: list = []
    monkeypatch.setattr(mo.output, "replace", out.append)
    monkeypatch.delenv(notebook.SMOKE_ENV, raising=False)
    monkeypatch.delenv(notebook.FRESH_ENV, raising=False)
    return out


def test_first_run_reuses_then_waits_until_a_click_which_measures_afresh(shown):
    sections = notebook.Sections()
    asked = []

    def stored():
        asked.append(1)
        return False

    assert sections.reuse("training", False, stored) is True  # on open: a stored run may serve
    assert not asked and not shown  # nothing to decide, nothing shown
    # a control changed, nothing stored for the new settings: wait, and say for what
    assert sections.reuse("training", False, stored, waiting="Press **run** to train.") is None
    assert asked and len(shown) == 1 and "to train." in shown[0].text
    assert sections.reuse("training", True, stored) is False  # a click measures afresh


def test_a_changed_control_shows_a_stored_run_of_its_settings(shown):
    sections = notebook.Sections()
    sections.reuse("hlo", False)
    assert sections.reuse("hlo", False, lambda: True) is True
    assert not shown


def test_sections_are_independent(shown):
    sections = notebook.Sections()
    assert sections.reuse("a", False) is True
    assert sections.reuse("b", False) is True  # b's first run, although a ran before


def test_smoke_and_fresh_runs_never_reuse(shown, monkeypatch):
    monkeypatch.setenv(notebook.FRESH_ENV, "1")
    assert notebook.Sections().reuse("a", False, lambda: True) is False
    monkeypatch.delenv(notebook.FRESH_ENV)
    monkeypatch.setenv(notebook.SMOKE_ENV, "1")
    assert notebook.Sections().reuse("a", False, lambda: True) is False


def test_tables_wrap_long_text_and_drop_a_filtered_index():
    import pandas as pd

    frame = pd.DataFrame({"n": range(30), "why": ["short", "x" * 80, "y"] * 10}).iloc[2:25]
    table = notebook.table(frame)  # more rows than a page: marimo's interactive table
    assert table._component_args["wrapped-columns"] == ["why"]  # read whole, not cut at "..."
    assert table.data.index.equals(pd.RangeIndex(23))  # no "Index0" column of the old rows


def test_a_small_table_is_plain_html_unless_it_selects():
    """A table of one page is drawn as plain HTML (marimo's interactive table took 0.6-0.7 s
    of a busy 2-core machine to draw three rows); the docs build reads it back all the same.
    One that selects rows stays interactive."""
    import json

    import marimo as mo
    import pandas as pd

    from tpu_workbench import docs

    frame = pd.DataFrame({"mode": ["lazy", "compile"], "ms": [12.3456, 1234.5], "n": [3, 20000],
                          "why": ["x" * 80, None]}).iloc[[1, 0]]
    small = notebook.table(frame, label="per **mode**")
    assert not isinstance(small, mo.ui.table) and "<table" in small.text
    page = ('<script>"__MARIMO_MOUNT_CONFIG__": Object.freeze(' + json.dumps({"session": {
        "cells": [{"id": "t", "outputs": [{"type": "data", "data": {
            "text/html": mo.vstack([mo.md("a heading"), small]).text}}], "console": []}]}})
            + ")</script>")
    assert docs.exported_tables(page) == {"per mode": [
        {"mode": "compile", "ms": 1234.5, "n": 20000, "why": ""},
        {"mode": "lazy", "ms": 12.35, "n": 3, "why": "x" * 80}]}
    assert isinstance(notebook.table(frame, selection="single"), mo.ui.table)
    assert isinstance(notebook.table(frame, page_size=1), mo.ui.table)



def test_run_live_leaves_the_finished_chart_to_a_caller_that_draws_its_own(results, shown):
    """The quickstart draws the finished runs' chart itself (clickable): run_live must not
    draw it first, or the browser draws the same chart twice on every open."""
    import tpu_workbench as wb

    spec = wb.ExperimentSpec(model="mlp", preset="tiny", mode="torch_eager", steps=3)
    wb.run(spec)
    runs = notebook.run_live([spec], reuse=True)
    assert runs.results[0].reused and len(shown) == 1  # the stored run's chart
    shown.clear()
    runs = notebook.run_live([spec], reuse=True, final_chart=False)
    assert runs.results[0].reused and len(runs.steps) == 3 and shown == []


def test_a_site_page_holds_every_row_of_a_long_table(monkeypatch):
    """A static page holds only a table's first page ("Showing the first 6 of 8 rows"): while
    the site is exported, a table's page is all its rows (up to EXPORTED_ROWS)."""
    import pandas as pd

    from tpu_workbench.notebook import tables

    frame = pd.DataFrame({"n": range(8)})
    assert notebook.table(frame, page_size=6)._component_args["page-size"] == 6
    monkeypatch.setenv(notebook.FRESH_ENV, "1")
    assert notebook.table(frame, page_size=6)._component_args["page-size"] == 8
    huge = pd.DataFrame({"n": range(tables.EXPORTED_ROWS + 50)})
    assert notebook.table(huge)._component_args["page-size"] == tables.EXPORTED_ROWS


def test_workers_warm_on_open_only_where_a_section_will_measure(results, monkeypatch):
    """The quickstart's setup starts the worker template where its training section will
    measure on open (first open), never where it shows stored runs (re-open)."""
    import tpu_workbench as wb
    from tpu_workbench.runs import template

    started = []
    monkeypatch.setattr(template, "warm", lambda: started.append(1))
    spec = wb.ExperimentSpec(model="mlp", preset="tiny", mode="torch_eager", steps=3)
    assert notebook.warm_for([spec]) and len(started) == 1  # nothing stored: warm
    wb.run(spec)  # (its own pool warms the template too)
    started.clear()
    assert not notebook.warm_for([spec]) and not started  # stored: no template
    monkeypatch.setenv(notebook.FRESH_ENV, "1")  # the docs export measures afresh: warm
    assert notebook.warm_for([spec]) and len(started) == 1
