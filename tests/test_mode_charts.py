"""The execution-mode charts draw what they claim: rendered with vl-convert (the same Vega the
browser runs) and read back from the SVG, not from the spec the code under test wrote."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from tpu_workbench import charts

vlc = pytest.importorskip("vl_convert")


def _svg(chart) -> str:
    return vlc.vegalite_to_svg(chart.to_json())


def _bar_widths(svg: str) -> list[float]:
    """Widths of the drawn bars (``M x,y h WIDTH ...`` paths of role "bar")."""
    bar = r'aria-roledescription="bar"[^>]*d="M[-\d.]+,[-\d.]+h([-\d.]+)'
    return [float(w) for w in re.findall(bar, svg)]


def _labels(svg: str) -> list[str]:
    return re.findall(r"<text[^>]*>([^<]+)</text>", svg)


SUMMARY = pd.DataFrame({"mode": ["torch_eager", "lazy"], "first_step_ms": [900.0, 20000.0],
                        "steady_median_ms": [300.0, 250.0], "steady_p10_ms": [280.0, 240.0],
                        "steady_p90_ms": [330.0, 260.0], "compiles_total": [0, 1],
                        "compiles_steady": [0, 0]})


def test_cache_first_steps_draws_a_bar_per_run_on_its_log_scale():
    runs = pd.DataFrame({"label": ["cold worker (first run)", "warm worker, same spec",
                                   "warm worker, new shape"],
                         "first_step_ms": [32000.0, 380.0, 21000.0], "compiles": [2, 0, 2],
                         "cache_hits": [5, 7, 5]})
    widths = _bar_widths(_svg(charts.cache_first_steps(runs)))
    assert len(widths) == 3 and all(w > 10 for w in widths)  # drawn, not just labelled
    cold, warm, miss = widths
    assert warm < miss < cold  # longer bar = longer first step


def test_first_vs_steady_has_a_legend_for_both_dots():
    labels = _labels(_svg(charts.first_vs_steady(SUMMARY)))
    assert charts.modes.FIRST_STEP in labels and charts.modes.STEADY in labels


def test_compiles_per_mode_labels_every_bar_even_zero():
    labels = _labels(_svg(charts.compiles_per_mode(SUMMARY)))
    assert labels.count("0") >= 3 and "1" in labels  # 0 total, 0 and 0 steady, 1 total


def test_recompile_timeline_ticks_whole_steps_with_a_legend():
    compiles = pd.DataFrame({"mode": ["lazy", "lazy"], "step": [0, 3],
                             "explanation": ["first", "a tensor's value was read"]})
    labels = _labels(_svg(charts.recompile_timeline(compiles, 8)))
    steps = [s for s in labels if re.fullmatch(r"[\d.]+", s)]
    assert steps == [str(i) for i in range(8)]  # 0..7, no 0.5
    assert charts.modes.FIRST_COMPILE in labels and charts.modes.RECOMPILE in labels


def test_loss_curves_title():
    steps = pd.DataFrame({"step": [0, 1], "loss": [2.0, 1.0], "mode": "lazy"})
    assert "the same in every mode" not in _labels(_svg(charts.loss_curves(steps)))
    assert charts.loss_curves(steps).to_dict()["title"] == "training loss per mode"
    assert charts.loss_curves(steps, title="loss").to_dict()["title"] == "loss"


def test_a_mode_has_one_colour_in_every_chart_whatever_else_is_drawn():
    """`lazy` is drawn in its own colour of the one palette whether it is alone or beside other
    modes (a scheme by order of appearance gave it another colour on each page), and the
    palette names every execution mode."""
    from tpu_workbench.charts._common import MODE_COLORS
    from tpu_workbench.runs.spec import MODES

    assert set(MODE_COLORS) == set(MODES)
    assert len(set(MODE_COLORS.values())) == len(MODE_COLORS)
    lazy = MODE_COLORS["lazy"].lower()

    def steps(modes):
        return pd.DataFrame([{"step": s, "wall_ms": 10.0 + i, "loss": 1.0 / (s + 1), "mode": m}
                             for i, m in enumerate(modes) for s in range(3)])

    for frame in (steps(["lazy"]), steps(["torch_eager", "compile", "lazy"])):
        for chart in (charts.step_times(frame), charts.loss_curves(frame)):
            strokes = set(re.findall(r'stroke="(#[0-9a-fA-F]{6})"', _svg(chart)))
            assert lazy in {c.lower() for c in strokes}
    alone = re.findall(r'fill="(#[0-9a-fA-F]{6})"', _svg(charts.steady_times(SUMMARY[1:])))
    assert lazy in {c.lower() for c in alone}


def test_loss_curves_name_the_modes_whose_lines_coincide():
    steps = pd.DataFrame([{"step": s, "loss": 2.0 / (s + 1) + (0.3 if m == "torch_eager" else 0),
                           "mode": m} for m in ("torch_eager", "lazy", "compile")
                          for s in range(4)])
    title = charts.loss_curves(steps).to_dict()["title"]
    assert title["subtitle"] == ["lazy = compile: the same loss at every step, one line"]
    apart = steps.assign(loss=steps["loss"] + steps["mode"].map({"lazy": 0.01}).fillna(0))
    assert isinstance(charts.loss_curves(apart).to_dict()["title"], str)


def test_a_strategy_has_one_colour_in_every_chart():
    """dlrm drew `table` in one colour in its step-time lines and another in its bars (each
    chart's own scheme by order of appearance): both now take the one palette, which names
    every strategy."""
    from tpu_workbench import sharding
    from tpu_workbench.charts._common import STRATEGY_COLORS

    assert set(STRATEGY_COLORS) == {"single", *sharding.ALL_STRATEGIES}
    assert len(set(STRATEGY_COLORS.values())) == len(STRATEGY_COLORS)
    table = STRATEGY_COLORS["table"].lower()
    lines = pd.DataFrame([{"run_id": f"r{i}", "step": s, "wall_ms": 10.0 + i}
                          for i in range(4) for s in range(3)])
    drawn = _svg(charts.step_times_per_run(lines, ["single", "table", "row", "column"]))
    assert table in {c.lower() for c in re.findall(r'stroke="(#[0-9a-fA-F]{6})"', drawn)}
    for order in (["table", "row", "column"], ["row", "column", "table"]):
        bars = pd.DataFrame({"strategy": order, "steady_median_ms": [5.0, 6.0, 7.0]})
        fills = re.findall(r'fill="(#[0-9a-fA-F]{6})"', _svg(charts.step_time_per_strategy(bars)))
        assert table in {c.lower() for c in fills}


def test_strategy_labels_slant_where_they_would_run_into_each_other():
    """Nine strategies on a 320 px axis drew "dp_tpfsdp_tp": their labels now slant; two short
    ones stay level."""
    many = pd.DataFrame({"strategy": ["dp", "fsdp", "tp", "dp_tp", "fsdp_tp", "ep", "table",
                                      "row", "column"], "steady_median_ms": range(9)})
    axis = charts.step_time_per_strategy(many).to_dict()["layer"][0]["encoding"]["x"]["axis"]
    assert axis["labelAngle"] == -35 and axis["labelAlign"] == "right"
    few = many.iloc[:2]
    axis = charts.step_time_per_strategy(few).to_dict()["layer"][0]["encoding"]["x"]["axis"]
    assert axis["labelAngle"] == 0


def test_a_long_run_does_not_tick_every_step():
    compiles = pd.DataFrame({"mode": ["lazy"], "step": [0], "explanation": ["first"]})
    long_run = charts.recompile_timeline(compiles, steps=120).to_dict()["encoding"]["x"]["axis"]
    assert "values" not in long_run
    short = charts.recompile_timeline(compiles, steps=8).to_dict()["encoding"]["x"]["axis"]
    assert short["values"] == list(range(8))
