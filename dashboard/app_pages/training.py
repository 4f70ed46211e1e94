"""Training: loss, grad norm, learning rate and step time over time (UTC), with every
finding and action drawn and labelled where it happened."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import data, units

st.title("Training")
run = data.current_run()


def marks_of(run: str) -> pd.DataFrame:
    """Findings and actions as labelled marks: time (UTC), what, kind."""
    findings = data.findings(run)
    actions = data.actions(run)
    subject = findings["scope"] + " " + findings["rank"].astype("Int64").astype("string").fillna("")
    frame = pd.concat(
        [
            pd.DataFrame(
                {
                    "time": findings["time"],
                    "what": "finding: " + findings["kind"] + " on " + subject.str.strip(),
                    "mark": "finding",
                }
            ),
            pd.DataFrame(
                {
                    "time": actions["time"],
                    "what": "action: " + actions["kind"] + " " + actions["target"],
                    "mark": "action",
                }
            ),
        ],
        ignore_index=True,
    )
    return frame.assign(time=units.to_datetime(frame["time"])).dropna(subset=["time"])


marks = marks_of(run)
shown = 0
for name, title in (
    ("loss", "loss"),
    ("grad_norm", "gradient norm"),
    ("lr", "learning rate"),
    ("step_time", "step time (s)"),
):
    curve = data.per_step(run, name)
    if curve.empty:
        continue
    shown += 1
    curve = curve.assign(time=units.to_datetime(curve["time"]))
    st.subheader(title)
    x = alt.X("time:T", title="time (UTC)", axis=alt.Axis(format="%H:%M:%S"))
    line = (
        alt.Chart(curve)
        .mark_line()
        .encode(
            x=x,
            y=alt.Y("mean:Q", title=title),
            tooltip=["step", alt.Tooltip("time:T", format="%H:%M:%S.%L"), "mean", "min", "max"],
        )
    )
    band = alt.Chart(curve).mark_area(opacity=0.2).encode(x=x, y="min:Q", y2="max:Q")
    layers = band + line
    if not marks.empty:
        colour = alt.Color(
            "mark:N", scale=alt.Scale(domain=["finding", "action"], range=["#c62828", "#1565c0"])
        )
        rules = (
            alt.Chart(marks)
            .mark_rule(strokeDash=[4, 3])
            .encode(x="time:T", color=colour, tooltip=["what", "time:T"])
        )
        labels = (
            alt.Chart(marks)
            .mark_text(align="left", angle=270, dx=4, dy=-4, baseline="top", fontSize=10)
            .encode(x="time:T", y=alt.value(4), text="what:N", color=colour)
        )
        layers = layers + rules + labels
    st.altair_chart(layers, width="stretch")
if not shown:
    st.info("No training metrics recorded yet.")
if marks.empty:
    st.caption("no findings or actions in this run")
