"""Checkpoints: each checkpoint's tier and state over time, and where each restore came from."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboard import data

st.title("Checkpoints")
run = data.current_run()

ckpts = data.checkpoints(run)
if ckpts.empty:
    st.info("No checkpoints recorded in this run.")
    st.stop()
chart = (
    alt.Chart(ckpts)
    .mark_point(filled=True, size=80)
    .encode(
        x=alt.X("time:T", title="time"),
        y=alt.Y("step:Q", title="step"),
        color=alt.Color("state:N"),
        shape=alt.Shape("tier:N"),
        tooltip=["step", "state", "tier", "rank", "attempt", "bytes", "seconds", "path"],
    )
)
st.altair_chart(chart, width="stretch")
latest = ckpts.sort_values("time").groupby(["step", "tier"]).tail(1)
st.dataframe(
    latest[["time", "step", "state", "tier", "rank", "attempt", "bytes", "seconds"]],
    hide_index=True,
)
