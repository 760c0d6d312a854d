"""Charts of HLO modules: op mix, fusion table, roofline, diff (from :mod:`tpu_workbench.hlo`'s
DataFrames only; nothing here parses HLO or runs experiments)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from ._common import pick, require_columns


def op_mix(ops: pd.DataFrame, top: int = 20, scope: str = "all",
           title: str | None = None, width: int = 260) -> alt.Chart:
    """Bar chart of instructions per opcode (the `top` most frequent), from
    :func:`tpu_workbench.hlo.instructions` (columns ``opcode``, ``is_entry``).

    `scope`: ``all`` computations (fused ops included) or ``entry`` (top level only). With a
    ``module`` column holding several modules, bars are stacked by module. `width` is the
    plot's (the opcode labels come on top of it): the default leaves room for a second chart
    beside it in a notebook, where a wider pair would be cut off at its right edge, the end of
    the longest bars.
    """
    require_columns(ops, ["opcode", "is_entry"], "op_mix")
    if scope not in ("all", "entry"):
        raise ValueError(f"scope must be 'all' or 'entry', got {scope!r}")
    df = ops[ops["is_entry"]] if scope == "entry" else ops
    by = ["opcode", "module"] if "module" in df.columns and df["module"].nunique() > 1 \
        else ["opcode"]
    counts = df.groupby(by).size().reset_index(name="count")
    keep = counts.groupby("opcode")["count"].sum().nlargest(top).index
    counts = counts[counts["opcode"].isin(keep)]
    longest = int(counts.groupby("opcode")["count"].sum().max()) if len(counts) else 1
    enc = dict(
        x=alt.X("count:Q", title="instructions",
                scale=alt.Scale(domain=[0, longest], nice=True)),
        y=alt.Y("opcode:N", sort="-x", title=None),
        tooltip=[*by, "count"],
    )
    if "module" in by:
        enc["color"] = alt.Color("module:N", title="module")
    where = "entry computation" if scope == "entry" else "all computations"
    return (alt.Chart(counts).mark_bar().encode(**enc)
            .properties(title=title or f"op mix: top {top} opcodes ({where})", width=width,
                        height=max(120, 16 * len(keep))))




def kernel_mix(kernels: pd.DataFrame, top: int = 15, title: str | None = None,
               width: int = 260) -> alt.Chart:
    """The kernels a compiled step runs, counted per opcode (a fusion holds many ops; a
    parallel call counts as the op it runs), from :func:`tpu_workbench.hlo.kernels`. A click on
    a bar selects that opcode (selection :data:`~tpu_workbench.charts._common.PICK`)."""
    require_columns(kernels, ["opcode", "ops_inside"], "kernel_mix")
    counts = (kernels.groupby("opcode").agg(kernels=("opcode", "size"),
                                            ops_inside=("ops_inside", "sum"))
              .reset_index().nlargest(top, "kernels"))
    selected = pick("opcode")
    return (alt.Chart(counts).mark_bar(cursor="pointer").encode(
        x=alt.X("kernels:Q", title="kernels"),
        y=alt.Y("opcode:N", sort="-x", title=None),
        opacity=alt.condition(selected, alt.value(1.0), alt.value(0.35)),
        tooltip=["opcode", "kernels",
                 alt.Tooltip("ops_inside:Q", title="ops fused into them")])
        .add_params(selected)
        .properties(title=title or "kernels the step runs, by kind (click a bar)", width=width,
                    height=max(120, 16 * len(counts))))


def flop_unit(flops: float) -> tuple[str, float]:
    """The unit a FLOP count of this size reads best in, and its scale: ``("GFLOP", 1e9)``
    for 3.2e9, ``("MFLOP", 1e6)`` for 4.5e6 (never raw counts in a legend)."""
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if flops >= scale:
            return unit, scale
    return "FLOP", 1.0


def roofline_points(cost: pd.DataFrame, peak_flops: float, bandwidth: float,
                    min_flops: float = 1.0) -> pd.DataFrame:
    """The ops of `cost` a roofline draws, with ``intensity`` (FLOP/byte), ``flops_per_s``
    (achieved where `cost` has measured ``seconds``, else attainable: on the roof), ``roof``
    (min(peak, intensity x bandwidth): the most the op could reach) and ``bound``. Ops with
    fewer than `min_flops` FLOPs (copies, data movement) or no bytes are left out."""
    require_columns(cost, ["name", "opcode", "flops", "bytes"], "roofline")
    if not (peak_flops > 0 and bandwidth > 0):
        raise ValueError(f"peak_flops and bandwidth must be positive, got {peak_flops!r} and "
                         f"{bandwidth!r}")
    df = cost[(cost["flops"] >= min_flops) & (cost["bytes"] > 0)].copy()
    df["intensity"] = df["flops"] / df["bytes"]
    df["roof"] = [min(peak_flops, i * bandwidth) for i in df["intensity"]]
    df["flops_per_s"] = df["flops"] / df["seconds"] if "seconds" in df.columns else df["roof"]
    ridge = peak_flops / bandwidth
    df["bound"] = ["compute" if i >= ridge else "memory" for i in df["intensity"]]
    return df


def roofline(cost: pd.DataFrame, peak_flops: float, bandwidth: float,
             title: str | None = None, min_flops: float = 1.0,
             slopes: dict[str, float] | None = None) -> alt.LayerChart:
    """Roofline (log-log): x = arithmetic intensity (FLOP/byte), y = FLOP/s.

    `cost`: :func:`tpu_workbench.hlo.per_op_cost` (columns ``name``, ``opcode``, ``flops``,
    ``bytes``; optional ``seconds`` -- measured time per op, e.g. from a profile -- plots the
    *achieved* FLOP/s; without it each op sits at its *attainable* FLOP/s, on the roof; see
    :func:`roofline_points`). `peak_flops` in FLOP/s; `bandwidth` in bytes/s, the roof's slope
    (the fastest memory an op's bytes can come from). `slopes`: slower memories, {label:
    bytes/s}, drawn as dashed lines under the roof (a host's main memory under its caches).
    """
    df = roofline_points(cost, peak_flops, bandwidth, min_flops)
    y_what = "achieved" if "seconds" in cost.columns else "attainable"
    ridge = peak_flops / bandwidth
    lo = min([ridge / 100, *df["intensity"].tolist()]) / 2
    hi = max([ridge * 100, *df["intensity"].tolist()]) * 2
    xs = [lo * (hi / lo) ** (k / 40) for k in range(41)] + [ridge]
    roof = pd.DataFrame({"intensity": sorted(xs)})
    roof["flops_per_s"] = [min(peak_flops, x * bandwidth) for x in roof["intensity"]]
    x = alt.X("intensity:Q", scale=alt.Scale(type="log"), axis=alt.Axis(format="~g"),
              title="arithmetic intensity (FLOP/byte)")
    y = alt.Y("flops_per_s:Q", scale=alt.Scale(type="log"), axis=alt.Axis(format="~s"),
              title=f"{y_what} FLOP/s")
    line = alt.Chart(roof).mark_line(color="gray").encode(x=x, y=y)
    # The roof's figures written on it: the flat compute roof and each bandwidth slope.
    slope_at = max(lo * 4, ridge / 30)
    marks = pd.DataFrame({
        "intensity": [ridge * 3, slope_at],
        "flops_per_s": [peak_flops, slope_at * bandwidth],
        "text": [f"peak {_rate(peak_flops)}FLOP/s", f"{_rate(bandwidth)}B/s"]})
    layers = [line]
    for label, bw in (slopes or {}).items():
        under = roof.assign(flops_per_s=[min(peak_flops, x * bw) for x in roof["intensity"]])
        layers.append(alt.Chart(under).mark_line(color="gray", strokeDash=[4, 4],
                                                 opacity=0.7).encode(x=x, y=y))
        at = max(lo * 4, peak_flops / bw / 30)
        marks.loc[len(marks)] = [at, at * bw, f"{label}: {_rate(bw)}B/s"]
    roof_text = alt.Chart(marks).mark_text(align="left", dy=-8, color="gray", fontSize=11).encode(
        x=x, y=y, text="text:N")
    unit, scale = flop_unit(float(df["flops"].max()) if len(df) else 0.0)
    df["flop_amount"] = df["flops"] / scale
    tooltip = [c for c in ["name", "opcode", "fusion_kind", "source_op"] if c in df.columns]
    tooltip += [alt.Tooltip("flop_amount:Q", title=unit, format=",.3~f"),
                alt.Tooltip("bytes:Q", title="bytes", format=",d"),
                alt.Tooltip("intensity:Q", title="FLOP/byte", format=",.3~g"),
                alt.Tooltip("flops_per_s:Q", title="FLOP/s", format=".3~s"), "bound"]
    size = alt.Size("flop_amount:Q", title=f"{unit} per op", scale=alt.Scale(type="sqrt"),
                    legend=alt.Legend(format=",.3~g")) if len(df) else alt.value(60)
    colour = "kind" if "kind" in df.columns else "opcode"
    points = alt.Chart(df.drop(columns=["roof"])).mark_circle(opacity=0.7).encode(
        x=x, y=y, color=alt.Color(f"{colour}:N", title=colour), size=size, tooltip=tooltip)
    heading = title or (f"roofline: peak {peak_flops / 1e9:,.1f} GFLOP/s, "
                        f"{bandwidth / 1e9:,.1f} GB/s, ridge {ridge:,.1f} FLOP/byte")
    return alt.layer(*layers, roof_text, points).properties(title=heading, width=520,
                                                             height=320)


def _rate(value: float) -> str:
    """1.23e11 -> ``123 G`` (three significant digits and an SI prefix)."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}"
    return f"{value:.3g} "


def diff_chart(diff: pd.DataFrame, top: int = 25, label_a: str | None = None,
               label_b: str | None = None) -> alt.Chart:
    """Diverging bars of the change in count per opcode and collective kind, b - a, from
    :func:`tpu_workbench.hlo.diff` (columns ``kind``, ``item``, ``a``, ``b``, ``delta``,
    ``status``); the modules row is in the title. Unchanged rows are left out."""
    require_columns(diff, ["kind", "item", "a", "b", "delta", "status"], "diff_chart")
    la = label_a or diff.attrs.get("label_a", "a")
    lb = label_b or diff.attrs.get("label_b", "b")
    mods = diff[diff["kind"] == "modules"]
    df = diff[(diff["kind"] != "modules") & (diff["delta"] != 0)].copy()
    df = df.reindex(df["delta"].abs().sort_values(ascending=False).index).head(top)
    df["label"] = [f"{i} (collective)" if k == "collective" else i
                   for k, i in zip(df["kind"], df["item"], strict=True)]
    df["more_in"] = [lb if d > 0 else la for d in df["delta"]]
    heading = f"op counts: {lb} minus {la}"
    if len(mods):
        heading += f" ({int(mods['a'].iloc[0])} vs {int(mods['b'].iloc[0])} modules)"
    if not len(df):
        heading += ": no difference"
    return (alt.Chart(df).mark_bar().encode(
        x=alt.X("delta:Q", title=f"count in {lb} - count in {la}"),
        y=alt.Y("label:N", sort=alt.EncodingSortField("delta", order="descending"), title=None),
        color=alt.Color("more_in:N", title="more in",
                        scale=alt.Scale(domain=[la, lb], range=["#4c78a8", "#f58518"])),
        tooltip=["kind", "item", "a", "b", "delta", "status"])
        .properties(title=heading, width=420, height=max(120, 16 * max(len(df), 1))))

