"""Ranks: rank × step heatmaps, so a straggler or a slow node stands out; one rank in detail."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboard import data

st.title("Ranks")
run = data.current_run()

names = ["step_time"] + [n for n in data.metric_names(run) if n.startswith("section.")]
names.append("collective_time")
metric = st.selectbox("metric", names, index=0)
cells = data.heatmap(run, metric)
if cells.empty:
    st.caption(f"no {metric} recorded yet")
    st.stop()
chart = (
    alt.Chart(cells)
    .mark_rect()
    .encode(
        x=alt.X("step:O", title="step", axis=alt.Axis(labelOverlap=True)),
        y=alt.Y("rank:O", title="rank", axis=alt.Axis(labelOverlap=False)),
        color=alt.Color("value:Q", title=f"{metric} (s)", scale=alt.Scale(scheme="viridis")),
        tooltip=["step", "rank", alt.Tooltip("value:Q", format=".4f")],
    )
    .properties(height=max(160, 32 * cells["rank"].nunique()))
)
st.altair_chart(chart, width="stretch")

st.subheader("One rank against its peers")
ranks = sorted(int(r) for r in cells["rank"].dropna().unique())
default = st.session_state.get("focus_rank", ranks[0])
rank = st.selectbox("rank", ranks, index=ranks.index(default) if default in ranks else 0)
peers = cells.groupby("step")["value"].median().rename("peer median")
mine = cells[cells["rank"] == rank].set_index("step")["value"].rename(f"rank {rank}")
st.line_chart(mine.to_frame().join(peers))
