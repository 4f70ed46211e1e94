"""Planner: what-if on GPUs, MTBF, restart and checkpoint costs → strategies compared by the
simulator (the planner extra: simpy, scipy, networkx)."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd
import streamlit as st

st.title("Planner")
try:
    from ft_runtime.planner.plan import Plan, PlanError, PlanRequest, make_plan
except ImportError as exc:
    st.info(f"The planner needs its extra: `pip install 'eagleeye[planner]'` ({exc}).")
    st.stop()

with st.form("what-if"):
    cols = st.columns(3)
    gpus = cols[0].number_input("GPUs", min_value=1000, value=100_000, step=1000)
    mtbf = cols[1].number_input("MTBF of one GPU (hours)", min_value=100.0, value=50_000.0)
    groups = cols[2].number_input(
        "data-parallel groups (0: one per 1000 GPUs)", min_value=0, value=0
    )
    restart = cols[0].number_input("global restart (minutes)", min_value=0.5, value=60.0)
    save = cols[1].number_input("checkpoint save (seconds)", min_value=1.0, value=60.0)
    steps = cols[2].number_input("training steps", min_value=100, value=2000, step=100)
    st.form_submit_button("simulate")


@st.cache_data(show_spinner=False)
def plan_for(request: PlanRequest) -> Plan:
    bar = st.progress(0.0, "simulating")

    def progress(label: str, fraction: float) -> None:
        bar.progress(min(1.0, fraction), label)

    result = make_plan(request, progress=progress)
    bar.empty()
    return result


request = PlanRequest(
    gpus=int(gpus),
    gpu_mtbf_hours=float(mtbf),
    n_groups=int(groups) or None,
    restart_min=float(restart),
    save_s=float(save),
    steps=int(steps),
)
try:
    plan = plan_for(request)
except PlanError as exc:
    st.error(f"cannot plan this job: {exc}")
    st.stop()

best = plan.best
period = "n/a" if math.isnan(best.checkpoint_s) else f"{best.checkpoint_s / 60:.1f} min"
st.success(
    f"Recommended: **{best.strategy.value}**, redundancy {best.redundancy}, checkpoint "
    f"every {period}: time to train {best.ttt_ratio:.2f} × the failure-free time, "
    f"availability {best.availability:.0%}."
)
rows = pd.DataFrame(
    [
        {
            "strategy": row.strategy.value,
            "redundancy": row.redundancy,
            "candidate": f"{row.strategy.value} r={row.redundancy}",
            "TTT/T0": row.ttt_ratio if row.completed else None,
            "availability": row.availability,
            "checkpoint (min)": row.checkpoint_s / 60,
            "finished": row.completed,
        }
        for row in plan.rows
    ]
)
chart = (
    alt.Chart(rows.dropna(subset=["TTT/T0"]))
    .mark_bar()
    .encode(
        x=alt.X("candidate:N", sort="y", title=None),
        y=alt.Y("TTT/T0:Q", title="time to train / failure-free time"),
        color="strategy:N",
        tooltip=list(rows.columns),
    )
)
st.altair_chart(chart, width="stretch")
st.dataframe(rows.drop(columns="candidate"), hide_index=True)
st.caption(
    f"{plan.cluster.n_groups} groups, system MTBF {plan.cluster.mtbf_s / 60:.1f} min, "
    f"Weibull shape {plan.cluster.weibull_shape}."
)
