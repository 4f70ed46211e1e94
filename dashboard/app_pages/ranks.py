"""Ranks: a rank × step heatmap of any metric or detector feature, ranks grouped by host
and sorted by outlier score (aggregated when they outnumber the rows a screen holds), and
one rank against its peers."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboard import data, grid, health

st.title("Ranks")
run = data.current_run()

options = data.features(run)
if not options:
    st.caption("no metrics recorded yet")
    st.stop()
metric = st.selectbox(
    "metric or detector feature",
    options,
    index=0,
    key="metric",
    help="compute_ms, data_wait_ms and comm_ms are the features the peer detectors compare",
)
ranks = health.ranks_of(data.events(run))
cells = data.rank_cells(run, metric, max(1, len(ranks)))
if cells.empty:
    st.caption(f"no {metric} recorded yet")
    st.stop()
order = grid.layout(cells, ranks)
heat = grid.heat(cells, order)
rows = int(order["row"].max()) + 1
per_row = -(-len(order) // rows)
bounds = data.step_range(run)
width = grid.step_width(bounds[1] - bounds[0] + 1, len(ranks)) if bounds else 1
unit = "ms" if metric.endswith("_ms") else "s" if metric.endswith("_time") or "." in metric else ""
chart = (
    alt.Chart(heat)
    .mark_rect()
    .encode(
        x=alt.X("step:O", title="step", axis=alt.Axis(labelOverlap=True)),
        y=alt.Y(
            "label:N",
            title="host · rank (worst outlier first)",
            sort=alt.EncodingSortField("row", order="ascending"),
            axis=alt.Axis(labelOverlap=True, labelLimit=260),
        ),
        color=alt.Color(
            "value:Q",
            title=f"{metric} ({unit})" if unit else metric,
            scale=alt.Scale(scheme="viridis"),
        ),
        tooltip=["label", "step", alt.Tooltip("value:Q", format=".4g")],
    )
    .properties(height=min(grid.HEIGHT_PX, max(160, 20 * rows)))
)
st.altair_chart(chart, width="stretch")
st.caption(
    f"{len(order)} ranks on {order['node'].nunique()} hosts"
    + (f", {per_row} ranks per row (the largest value shown)" if per_row > 1 else "")
    + (f"; {width} steps per column" if width > 1 else "")
)
worst = order.iloc[0]
st.markdown(
    f"Worst outlier: **rank {worst['rank']}** on **{worst['node']}** "
    f"(robust z-score {worst['score']:.1f}), the top row."
)
st.subheader("Outliers")
top = order.nlargest(min(10, len(order)), "score")[["rank", "node", "score"]]
st.dataframe(top.assign(score=top["score"].round(2)), hide_index=True)

st.subheader("One rank against its peers")
choices = sorted(int(r) for r in order["rank"])
default = st.session_state.get("focus_rank", int(top["rank"].iloc[0]))
rank = st.selectbox(
    "rank", choices, index=choices.index(default) if default in choices else 0, key="rank"
)
peers = cells.groupby("step")["value"].median().rename("peer median")
mine = cells[cells["rank"] == rank].set_index("step")["value"].rename(f"rank {rank}")
lines = mine.to_frame().join(peers, how="outer").reset_index().melt("step", var_name="who")
chart = (
    alt.Chart(lines.dropna(subset=["value"]))
    .mark_line()
    .encode(x=alt.X("step:Q", title="step"), y=alt.Y("value:Q", title=metric), color="who:N")
)
findings = data.findings(run)
if not findings.empty:
    about = findings[(findings["rank"] == rank) | (findings["scope"] == "job")].dropna(
        subset=["step"]
    )
    if not about.empty:
        marks = about.assign(what="finding: " + about["kind"])[["step", "what"]]
        rule = alt.Chart(marks).mark_rule(color="#c62828", strokeDash=[4, 3])
        text = alt.Chart(marks).mark_text(
            align="left", angle=270, dx=4, dy=-4, baseline="top", fontSize=10, color="#c62828"
        )
        chart = (
            chart
            + rule.encode(x="step:Q", tooltip=["what"])
            + text.encode(x="step:Q", y=alt.value(4), text="what:N")
        )
st.altair_chart(chart, width="stretch")
