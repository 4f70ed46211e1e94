"""Training: loss, grad norm, learning rate and throughput, with findings and actions marked."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import data

st.title("Training")
run = data.current_run()

findings = data.findings(run)
actions = data.actions(run)
marks = pd.concat(
    [
        pd.DataFrame({"time": findings["time"], "what": "finding: " + findings["kind"]}),
        pd.DataFrame({"time": actions["time"], "what": "action: " + actions["kind"]}),
    ],
    ignore_index=True,
)

for name, title in (
    ("loss", "loss"),
    ("grad_norm", "gradient norm"),
    ("lr", "learning rate"),
    ("step_time", "step time (s)"),
):
    curve = data.per_step(run, name)
    if curve.empty:
        continue
    st.subheader(title)
    line = (
        alt.Chart(curve)
        .mark_line()
        .encode(
            x=alt.X("time:T", title="time"),
            y=alt.Y("mean:Q", title=title),
            tooltip=["step", "mean", "min", "max"],
        )
    )
    band = alt.Chart(curve).mark_area(opacity=0.2).encode(x="time:T", y="min:Q", y2="max:Q")
    layers = band + line
    if not marks.empty:
        rules = (
            alt.Chart(marks)
            .mark_rule(color="#c62828", strokeDash=[4, 3])
            .encode(x="time:T", tooltip=["what"])
        )
        layers = layers + rules
    st.altair_chart(layers, width="stretch")
if marks.empty:
    st.caption("no findings or actions in this run")
