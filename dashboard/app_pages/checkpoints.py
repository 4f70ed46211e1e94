"""Checkpoints: each checkpoint's tier and state over time, and where each restore came from."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboard import data, units

st.title("Checkpoints")
run = data.current_run()

ckpts = data.checkpoints(run)
if ckpts.empty:
    st.info("No checkpoints recorded in this run.")
    st.stop()
shown = units.readable(ckpts)
chart = (
    alt.Chart(shown.assign(size=ckpts["bytes"]))
    .mark_point(filled=True, size=80)
    .encode(
        x=alt.X("time:T", title="time (UTC)", axis=alt.Axis(format="%H:%M:%S")),
        y=alt.Y("step:Q", title="step"),
        color=alt.Color("state:N"),
        shape=alt.Shape("tier:N"),
        tooltip=[
            alt.Tooltip("time:T", format="%H:%M:%S.%L"),
            "step",
            "state",
            "tier",
            "rank",
            "attempt",
            alt.Tooltip("bytes:N", title="size"),
            alt.Tooltip("seconds:N", title="took"),
            "path",
        ],
    )
)
st.altair_chart(chart, width="stretch")
latest = ckpts.sort_values("time").groupby(["step", "tier"]).tail(1)
st.dataframe(
    units.readable(latest)[
        ["time", "step", "state", "tier", "rank", "attempt", "bytes", "seconds"]
    ].rename(columns={"time": "time (UTC)", "bytes": "size", "seconds": "took"}),
    hide_index=True,
)
