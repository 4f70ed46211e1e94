"""Compare: two runs side by side, their figures (as the summary computes them) and their
loss and step time per step on shared axes."""

from __future__ import annotations

import time

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import data, health, units

st.title("Compare")
run = data.current_run()
others = [r for r in data.available_runs() if r != run]
if not others:
    st.info("Only one run here: a comparison needs a second run in the runs folder.")
    st.stop()
other = st.selectbox("compare with", others, format_func=data.run_label, key="other_run")


def figures(run: str) -> dict[str, object]:
    events = data.events(run)
    findings = data.findings(run)
    status = health.job_status(
        events, data.progress_samples(run), data.meta(run), findings, time.time()
    )
    return {
        "job": status.phase,
        "attempts": status.attempt + 1,
        "last step": status.current_step,
        "wall time": units.human_seconds(status.wall_s),
        "steps/s": f"{status.steps_per_s:.2f}",
        "tokens/s": f"{status.tokens_per_s:,.0f}",
        "ETTR": units.percent(status.ettr),
        "findings": len(findings),
        "actions": len(data.actions(run)),
    }


names = {run: data.run_label(run), other: data.run_label(other)}
if len(set(names.values())) < 2:
    names = {run: run, other: other}
table = pd.DataFrame({names[r]: figures(r) for r in (run, other)})
st.dataframe(table.astype(str), width="stretch")
for name, title in (("loss", "loss"), ("step_time", "step time (s)")):
    curves = [data.per_step(r, name).assign(run=names[r]) for r in (run, other)]
    both = pd.concat([c for c in curves if not c.empty], ignore_index=True)
    if both.empty:
        continue
    st.subheader(f"{title} per step")
    st.altair_chart(
        alt.Chart(both)
        .mark_line()
        .encode(
            x=alt.X("step:Q", title="step"),
            y=alt.Y("mean:Q", title=title),
            color=alt.Color("run:N"),
            tooltip=["run", "step", "mean", "min", "max"],
        ),
        width="stretch",
    )
