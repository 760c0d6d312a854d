"""Charts of sharding: who holds which slice, memory per device, collectives, step times.

Every function takes a DataFrame with the documented columns (from
:mod:`tpu_workbench.sharding`) and returns an Altair chart; nothing here runs experiments.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import altair as alt
import pandas as pd

from ._common import category_axis, pick, require_columns, strategy_scale

MB = 1e6
PARTS = {"params_bytes": "params", "grads_bytes": "grads", "optimizer_bytes": "optimizer",
         "inputs_bytes": "inputs"}
# Where each part comes from: params and inputs are the run's laid-out buffers; gradients and
# optimizer state are derived from the parameters (see sharding.memory_per_device).
SOURCES = {"params": "measured (layout of the run)", "grads": "derived: = params",
           "optimizer": "derived: Adam moments, a multiple of params",
           "inputs": "measured (layout of the run)"}



def layout_grid(layout: pd.DataFrame, tensor: str, mesh_shape: Sequence[int],
                cell: int = 110) -> alt.LayerChart:
    """The devices laid out as in the mesh, each cell coloured by the slice of `tensor` it holds.

    Devices holding the same slice (replicas) share a colour; each cell is labelled with the
    device, its index range per dim (``:`` = the whole dim) and its replica id. Rows are the
    ``data`` axis, columns the ``model`` axis (a 1-D mesh is one row).

    Columns (of :func:`tpu_workbench.sharding.layout_frame`): ``tensor``, ``device_name``,
    ``row``, ``col``, ``index_label``, ``replica_id`` (``shape``, ``partition``, ``spec``,
    ``shard_shape`` if present, for the title and tooltip).
    """
    require_columns(layout, ["tensor", "device_name", "row", "col", "index_label", "replica_id"],
             "layout_grid")
    frame = layout[layout["tensor"] == tensor].copy()
    if frame.empty:
        known = ", ".join(list(dict.fromkeys(layout["tensor"]))[:6])
        raise ValueError(f"no layout rows for tensor {tensor!r}; tensors include: {known}")
    mesh_shape = tuple(mesh_shape)
    rows, cols = (mesh_shape if len(mesh_shape) == 2 else (1, mesh_shape[0]))
    frame["label"] = (frame["device_name"] + "\n" + frame["index_label"] + "\nreplica "
                      + frame["replica_id"].astype(str))
    first = frame.iloc[0]
    title = tensor
    if "shape" in frame:
        title += f" {list(first['shape'])}"
    if "partition" in frame:
        title += f" {first['partition']}"
    subtitle = [f"mesh {'x'.join(map(str, mesh_shape))}: colour = the slice a device holds "
                f"(same colour = replicas)"]
    if "spec" in frame and first["spec"]:
        subtitle.append(f"XLA: {first['spec']}")
    tooltip = [c for c in ["device_name", "row", "col", "index_label", "shard_shape",
                           "shard_bytes", "replica_id", "num_replicas"] if c in frame]
    if "shard_shape" in frame:
        frame["shard_shape"] = frame["shard_shape"].astype(str)
    x = alt.X("col:O", title="model axis" if len(mesh_shape) == 2 else "data axis",
              scale=alt.Scale(domain=list(range(cols))), axis=alt.Axis(labelAngle=0))
    y = alt.Y("row:O", title="data axis" if len(mesh_shape) == 2 else "",
              scale=alt.Scale(domain=list(range(rows))))
    base = alt.Chart(frame).encode(x=x, y=y)
    selected = pick("device_name")
    cells = base.mark_rect(stroke="white", strokeWidth=2, cursor="pointer").encode(
        color=alt.Color("index_label:N", title="slice held", sort=slice_order(frame),
                        scale=alt.Scale(scheme="tableau20")),
        opacity=alt.condition(selected, alt.value(1.0), alt.value(0.4)),
        tooltip=tooltip).add_params(selected)
    text = base.mark_text(lineBreak="\n", fontSize=11, color="black").encode(text="label:N")
    return (cells + text).properties(
        title=alt.TitleParams(title, subtitle=subtitle), width=cell * cols, height=cell * rows)


def slice_order(frame: pd.DataFrame) -> list[str]:
    """The distinct ``index_label`` values of `frame` in numeric order of the slice they name
    (by start, then end, per dim): ``0:64`` before ``64:128`` before ``192:256``, which string
    order gets wrong. Uses the ``index`` column (``[[start, end], ...]``) where present, else the
    numbers in the label (``:`` = the whole dim, first)."""
    def key(row) -> tuple:
        index = row.get("index")
        if isinstance(index, list | tuple) and len(index):
            return tuple(tuple(int(v) for v in pair) for pair in index)
        return tuple(tuple(int(v) for v in re.findall(r"\d+", part)) or (-1,)
                     for part in str(row["index_label"]).split(","))
    firsts = frame.drop_duplicates("index_label")
    return [label for _, label in sorted(
        ((key(row), row["index_label"]) for _, row in firsts.iterrows()), key=lambda t: t[0])]


def memory_long(memory: pd.DataFrame) -> pd.DataFrame:
    """:func:`tpu_workbench.sharding.memory_per_device` as long rows: ``device_name``,
    ``part`` (params, grads, optimizer, inputs), ``mb``, ``xla_total_mb`` (+ ``strategy``)."""
    require_columns(memory, ["device_name", *PARTS], "memory_bars")
    keys = ["device", "device_name"] + [c for c in ("strategy",) if c in memory]
    extra = memory["xla_total_bytes"] if "xla_total_bytes" in memory else float("nan")
    wide = memory.assign(xla_total_mb=extra / MB)
    long = wide.melt(id_vars=[*keys, "xla_total_mb"], value_vars=list(PARTS),
                     var_name="part", value_name="bytes")
    long["part"] = long["part"].map(PARTS)
    long["source"] = long["part"].map(SOURCES)
    long["mb"] = long["bytes"] / MB
    return long


def _part_labels(memory: pd.DataFrame) -> dict[str, str]:
    """Legend labels: the derived parts say so (and the optimizer factor found in `memory`)."""
    params = float(memory["params_bytes"].sum())
    factor = float(memory["optimizer_bytes"].sum()) / params if params else float("nan")
    times = f"{factor:g} x params" if factor == factor else "from params"
    return {"params": "params", "inputs": "inputs", "grads": "grads (derived: = params)",
            "optimizer": f"optimizer (derived: {times})"}


def memory_bars(memory: pd.DataFrame) -> alt.Chart | alt.FacetChart:
    """Stacked bars per device: parameters, gradients, optimizer state and inputs (MB); a black
    tick marks XLA's own total for the compiled step where the run captured HLO. One panel per
    ``strategy`` if that column is present. Gradients and optimizer state are derived from the
    parameters by :func:`tpu_workbench.sharding.memory_per_device`, not measured: the legend,
    subtitle and tooltips say so.

    Columns (of :func:`tpu_workbench.sharding.memory_per_device`): ``device``,
    ``device_name``, ``params_bytes``, ``grads_bytes``, ``optimizer_bytes``, ``inputs_bytes``
    (``xla_total_bytes``, ``strategy`` optional).
    """
    long = memory_long(memory)
    labels = _part_labels(memory)
    long["stack"] = long["part"].map({p: i for i, p in enumerate(PARTS.values())})
    long["part"] = long["part"].map(labels)
    order = list(dict.fromkeys(long.sort_values("device")["device_name"]))
    x = alt.X("device_name:N", title="device", sort=order)
    bars = alt.Chart().mark_bar().encode(
        x=x, y=alt.Y("sum(mb):Q", title="MB per device"),
        color=alt.Color("part:N", title="", sort=[labels[p] for p in PARTS.values()],
                        scale=alt.Scale(scheme="tableau10"),
                        legend=alt.Legend(labelLimit=300)),
        order=alt.Order("stack:Q"),  # bottom to top in the legend's order
        tooltip=["device_name", "part", "source", alt.Tooltip("mb:Q", format=",.3f")])
    layers = [bars]
    if long["xla_total_mb"].notna().any():
        layers.append(alt.Chart().mark_tick(color="black", thickness=2, size=18).encode(
            x=x, y=alt.Y("max(xla_total_mb):Q"),
            tooltip=[alt.Tooltip("max(xla_total_mb):Q", title="XLA total (MB)",
                                 format=",.3f")]))
    subtitle = ["params and inputs: the run's buffers; grads and optimizer: derived from "
                "params, not measured"]
    if len(layers) > 1:
        subtitle.append("black tick: XLA's total for the step, which also counts activations, "
                        "temporaries and the new buffers the step returns")
    title = alt.TitleParams("memory per device", subtitle=subtitle)
    chart = alt.layer(*layers, data=long)
    if "strategy" in long:
        return chart.properties(width=260, height=220).facet(
            column=alt.Column("strategy:N", title=None,
                              sort=list(dict.fromkeys(long["strategy"])))).properties(title=title)
    return chart.properties(title=title, width=420, height=240)


def collective_bytes(collectives: pd.DataFrame) -> alt.Chart:
    """Bytes moved by the collectives of one train step, stacked by kind; one bar per strategy
    (or per mesh axis when there is no ``strategy`` column).

    Columns (of :func:`tpu_workbench.sharding.collectives_frame`): ``kind``, ``bytes``
    (``strategy``, ``axis``, ``estimated_us`` optional).
    """
    require_columns(collectives, ["kind", "bytes"], "collective_bytes")
    frame = collectives.copy()
    frame["mb"] = frame["bytes"] / MB
    group = "strategy" if "strategy" in frame else "axis" if "axis" in frame else "kind"
    tooltip = [group, "kind", alt.Tooltip("count():Q", title="ops"),
               alt.Tooltip("sum(mb):Q", title="MB", format=",.3f")]
    if "estimated_us" in frame:
        tooltip.append(alt.Tooltip("sum(estimated_us):Q", title="est. us", format=",.2f"))
    return (
        alt.Chart(frame).mark_bar().encode(
            x=alt.X(f"{group}:N", title=group, sort=list(dict.fromkeys(frame[group])),
                    axis=category_axis(frame[group], 320)),
            y=alt.Y("sum(mb):Q", title="MB moved per step (per device)"),
            color=alt.Color("kind:N", title="collective"), tooltip=tooltip)
        .properties(title="collectives XLA inserted in the train step", width=320, height=240)
    )


def step_time_per_strategy(summary: pd.DataFrame) -> alt.LayerChart:
    """Steady-state step time per strategy: median bar with its p10-p90 spread.

    Columns: ``strategy``, ``steady_median_ms`` (``steady_p10_ms``, ``steady_p90_ms``, ``mesh``
    optional; e.g. :func:`tpu_workbench.sharding.summary_frame`).
    """
    require_columns(summary, ["strategy", "steady_median_ms"], "step_time_per_strategy")
    frame = summary.copy()
    tooltip = [c for c in ["strategy", "mesh", "steady_median_ms", "steady_p10_ms",
                           "steady_p90_ms", "first_step_ms", "collectives"] if c in frame]
    x = alt.X("strategy:N", title="strategy", sort=list(frame["strategy"]),
              axis=category_axis(frame["strategy"], 320))
    bars = alt.Chart(frame).mark_bar().encode(
        x=x, y=alt.Y("steady_median_ms:Q", title="steady step time (ms)"),
        # the x axis names each colour: no legend needed
        color=alt.Color("strategy:N", legend=None,
                        scale=strategy_scale(frame["strategy"])), tooltip=tooltip)
    layers = [bars]
    if {"steady_p10_ms", "steady_p90_ms"} <= set(frame.columns):
        layers.append(alt.Chart(frame).mark_rule(color="black").encode(
            x=x, y="steady_p10_ms:Q", y2="steady_p90_ms:Q"))
    return alt.layer(*layers).properties(
        title="steady-state step time per strategy (median, p10-p90)", width=320, height=240)



# Every part of fit_table's per_device_gb, so a bar's height is the table's total.
FIT_PARTS = {"params_gb": "params", "grads_gb": "grads", "optimizer_gb": "optimizer",
             "activation_gb": "activations", "logits_gb": "logits"}


def fit_bars(table: pd.DataFrame) -> alt.FacetChart:
    """GB per chip for each strategy, one panel per slice, stacked by part, against the usable
    HBM (dashed). From :func:`tpu_workbench.sharding.fit_table`; rows that cannot run (heads
    that do not divide the model axis, a batch that does not split) have no bar."""
    require_columns(table, ["slice", "strategy", "fits", "usable_gb", *FIT_PARTS], "fit_bars")
    parts = list(FIT_PARTS.values())
    long = table.dropna(subset=["usable_gb"]).melt(
        id_vars=["slice", "strategy", "fits", "usable_gb"], value_vars=list(FIT_PARTS),
        var_name="part", value_name="gb")
    long["part"] = long["part"].map(FIT_PARTS)
    long["part_order"] = long["part"].map(parts.index)
    strategies = list(dict.fromkeys(table["strategy"]))
    bars = alt.Chart().mark_bar().encode(
        x=alt.X("strategy:N", sort=strategies, title=None,
                axis=category_axis(strategies, 150)),
        y=alt.Y("sum(gb):Q", title="GB per chip"),
        color=alt.Color("part:N", sort=parts, title="part"),
        order=alt.Order("part_order:Q"),
        tooltip=["slice", "strategy", "part", alt.Tooltip("gb:Q", format=".2f"), "fits"])
    hbm = alt.Chart().mark_rule(strokeDash=[4, 3], color="black").encode(
        y="mean(usable_gb):Q", tooltip=[alt.Tooltip("mean(usable_gb):Q", format=".1f",
                                                    title="usable HBM (GB)")])
    return alt.layer(bars, hbm, data=long).properties(width=150, height=220).facet(
        column=alt.Column("slice:N", sort=list(dict.fromkeys(table["slice"])), title=None))


def step_times_per_run(steps: pd.DataFrame, names: Sequence[str]) -> alt.Chart:
    """Step time over steps, one line per run named by `names` in the order the runs appear in
    ``run_id`` (side-by-side runs of one mode: one device, then each strategy); step 0 includes
    the compile. Columns: ``run_id``, ``step``, ``wall_ms``."""
    require_columns(steps, ["run_id", "step", "wall_ms"], "step_times_per_run")
    label = dict(zip(dict.fromkeys(steps["run_id"]), names, strict=False))
    frame = steps.assign(run=steps["run_id"].map(label).fillna(steps["run_id"]))
    return alt.Chart(frame).mark_line(point=True).encode(
        x=alt.X("step:Q", title="step", axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("wall_ms:Q", title="step time (ms)", scale=alt.Scale(type="log")),
        color=alt.Color("run:N", title="run", sort=list(names),
                        scale=strategy_scale(names)),
        tooltip=["run", "step", alt.Tooltip("wall_ms:Q", format=",.1f")],
    ).properties(title=alt.TitleParams("step time per step (step 0 includes compilation)",
                                       subtitle="measured on this CPU (XLA:CPU)"),
                 width=420, height=220)
